# Fails unless README contains EXAMPLE's text verbatim (so the README's example is the one built).
file(READ ${README} readme)
file(READ ${EXAMPLE} example)
string(FIND "${readme}" "${example}" found)
if(found EQUAL -1)
  message(FATAL_ERROR "README.md does not contain ${EXAMPLE} verbatim: copy the file into it")
endif()
