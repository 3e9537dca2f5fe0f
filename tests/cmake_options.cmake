# Configures the project once with each documented option OFF (the others at their defaults).
#   cmake -DSOURCE_DIR=... -DWORK_DIR=... -DPREFIX_PATH=... -P cmake_options.cmake
string(REPLACE "|" ";" PREFIX_PATH "${PREFIX_PATH}")
file(REMOVE_RECURSE ${WORK_DIR})
file(WRITE ${WORK_DIR}/cache.cmake "set(CMAKE_PREFIX_PATH \"${PREFIX_PATH}\" CACHE STRING \"\")\n")
foreach(option GPIPE_BUILD_TESTS GPIPE_BUILD_BENCHMARKS GPIPE_BUILD_EXAMPLES GPIPE_BUILD_TOOLS
               GPIPE_UNITY_BUILD)
  execute_process(
    COMMAND ${CMAKE_COMMAND} -C ${WORK_DIR}/cache.cmake -S ${SOURCE_DIR} -B ${WORK_DIR}/${option}
            -G Ninja -D${option}=OFF
    RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "-D${option}=OFF does not configure:\n${output}")
  endif()
  message(STATUS "-D${option}=OFF configures")
endforeach()
file(REMOVE_RECURSE ${WORK_DIR})
