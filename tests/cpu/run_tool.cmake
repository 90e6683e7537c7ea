# One run of the spark-decode tool as a CPU test: cmake -DEXE=... -DARGS="a b"
# -DEXPECT_RC=zero|nonzero|<n> -DEXPECT="regex@@regex" -P run_tool.cmake
# (arguments separated by spaces, regexes by @@: a ";" would split them in
# add_test). Fails unless the exit status is the expected one and the output
# (stdout and stderr together) matches every regex.
separate_arguments(ARGS UNIX_COMMAND "${ARGS}")
string(REPLACE "@@" ";" EXPECT "${EXPECT}")
execute_process(COMMAND ${EXE} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(all "${out}${err}")
message("${all}")
if(EXPECT_RC STREQUAL "zero")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "exit status ${rc}, expected 0")
  endif()
elseif(EXPECT_RC STREQUAL "nonzero")
  if(rc EQUAL 0)
    message(FATAL_ERROR "exit status 0, expected a failure")
  endif()
elseif(NOT rc EQUAL EXPECT_RC)
  message(FATAL_ERROR "exit status ${rc}, expected ${EXPECT_RC}")
endif()
foreach(re IN LISTS EXPECT)
  if(NOT all MATCHES "${re}")
    message(FATAL_ERROR "the output does not match: ${re}")
  endif()
endforeach()
