# Installs the build into a fresh prefix, builds tests/consumer/ against the installed package
# (find_package(gpipe), as a user's project would) and runs the program it builds.
#   cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK_DIR=... -DPREFIX_PATH=... -P run.cmake
file(REMOVE_RECURSE ${WORK_DIR})
string(REPLACE "|" ";" PREFIX_PATH "${PREFIX_PATH}")

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result)
  if(NOT result EQUAL 0)
    string(REPLACE ";" " " command "${ARGN}")
    message(FATAL_ERROR "failed (${result}): ${command}")
  endif()
endfunction()

run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
# The prefix path is a list: it goes in through a cache file, since a command line splits it.
file(WRITE ${WORK_DIR}/cache.cmake
     "set(CMAKE_PREFIX_PATH \"${WORK_DIR}/prefix;${PREFIX_PATH}\" CACHE STRING \"\")\n")
run(${CMAKE_COMMAND} -C ${WORK_DIR}/cache.cmake -S ${SOURCE_DIR}/tests/consumer
    -B ${WORK_DIR}/build -G Ninja -DCMAKE_BUILD_TYPE=Release
    -DGPIPE_README_EXAMPLE=${SOURCE_DIR}/examples/readme.cpp)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/readme_consumer)
