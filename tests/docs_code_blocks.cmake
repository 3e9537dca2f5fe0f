# Every ```cpp block of README.md and docs/*.md is code that a build compiles: it must appear,
# word for word (indentation aside), in examples/*.cpp, tests/docs_test.cpp or a public header.
# Fails naming the file and line of each block that does not. Also fails if the README drops a
# command that runs as it writes it.
#
#   cmake -DSOURCE_DIR=<repository> -P docs_code_blocks.cmake
cmake_minimum_required(VERSION 3.20)

# Indentation aside: a snippet may sit inside a function in the file that compiles it.
function(unindent text out)
  string(REGEX REPLACE "(^|\n)[ ]+" "\\1" text "${text}")
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

file(GLOB compiled ${SOURCE_DIR}/examples/*.cpp ${SOURCE_DIR}/tests/docs_test.cpp)
file(GLOB_RECURSE headers ${SOURCE_DIR}/include/gpipe/*.h)
set(code "")
foreach(file ${compiled} ${headers})
  file(READ ${file} text)
  string(APPEND code "${text}\n")
endforeach()
unindent("${code}" code)

file(GLOB documents ${SOURCE_DIR}/docs/*.md)
set(failures 0)
foreach(document ${SOURCE_DIR}/README.md ${documents})
  file(READ ${document} text)
  file(RELATIVE_PATH name ${SOURCE_DIR} ${document})
  set(offset 0)
  while(TRUE)
    string(SUBSTRING "${text}" ${offset} -1 rest)
    string(FIND "${rest}" "```cpp\n" open)
    if(open EQUAL -1)
      break()
    endif()
    math(EXPR begin "${offset} + ${open} + 7")
    string(SUBSTRING "${text}" ${begin} -1 rest)
    string(FIND "${rest}" "\n```" length)
    string(SUBSTRING "${text}" ${begin} ${length} block)
    math(EXPR offset "${begin} + ${length} + 4")
    unindent("${block}" block)
    string(FIND "${code}" "${block}" found)
    if(found EQUAL -1)
      string(SUBSTRING "${text}" 0 ${begin} before)
      string(REGEX MATCHALL "\n" lines "${before}")
      list(LENGTH lines line)
      message(SEND_ERROR "${name}:${line}: this ```cpp block is in no compiled file: put it, word "
                         "for word, in tests/docs_test.cpp (or examples/)")
      math(EXPR failures "${failures} + 1")
    endif()
  endwhile()
endforeach()

# The commands that run as the README writes them: CI's test command (.ci/run) and the torchrun
# line that TorchrunExample runs (tests/CMakeLists.txt).
file(READ ${SOURCE_DIR}/README.md readme)
foreach(command "bash scripts/test.sh"
                "torchrun --nproc-per-node 2 --no-python build/examples/distributed_train")
  string(FIND "${readme}" "${command}" found)
  if(found EQUAL -1)
    message(SEND_ERROR "README.md no longer shows the tested command '${command}'")
  endif()
endforeach()
