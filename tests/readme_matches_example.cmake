# Fails unless README contains EXAMPLE's text verbatim (so the README's example is the one built).
file(READ ${README} readme)
file(READ ${EXAMPLE} example)
string(FIND "${readme}" "${example}" found)
if(found EQUAL -1)
  message(FATAL_ERROR "README.md does not contain ${EXAMPLE} verbatim: copy the file into it")
endif()
# The commands that run as the README writes them must stay in it verbatim: CI's test command
# (.ci/run) and the torchrun line that TorchrunExample runs (tests/CMakeLists.txt).
foreach(command "bash scripts/test.sh"
                "torchrun --nproc-per-node 2 --no-python build/examples/distributed_train")
  string(FIND "${readme}" "${command}" found)
  if(found EQUAL -1)
    message(FATAL_ERROR "README.md no longer shows the tested command '${command}'")
  endif()
endforeach()
