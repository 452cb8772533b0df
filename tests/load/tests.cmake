# Load, slow-client, crash-under-load and soak tests of kvcoordd (label
# "load"; run alone with ctest -L load).  Included from tests/CMakeLists.txt.
# Bounded forms for CI; RELIABILITY.md gives the long forms and the figures.
# None asserts a wall-clock time.

set(KVC_LOAD_DIR ${CMAKE_CURRENT_LIST_DIR})
set(KVCOORD_SOAK_SECONDS 60 CACHE STRING "Seconds the soak test (load_soak) runs")

if(NOT KVCOORD_FUZZ)
  add_executable(soak_rooms ${KVC_LOAD_DIR}/soak_rooms.c)
  target_link_libraries(soak_rooms PRIVATE kvcoord_static)

  find_program(WRK wrk)
  if(WRK)
    foreach(case wrk slowloris conncap)
      add_test(NAME load_${case}
        COMMAND ${PYTHON3} ${KVC_LOAD_DIR}/test_load.py --daemon $<TARGET_FILE:kvcoordd>
                --case ${case} --seconds 10)
      set_tests_properties(load_${case} PROPERTIES LABELS "load" TIMEOUT 300 RUN_SERIAL TRUE)
    endforeach()
  else()
    message(WARNING "wrk not found: load_wrk, load_slowloris and load_conncap are not registered")
  endif()

  add_test(NAME load_crash_restart
    COMMAND ${PYTHON3} ${KVC_LOAD_DIR}/test_crash_load.py --daemon $<TARGET_FILE:kvcoordd> --kills 3)
  set_tests_properties(load_crash_restart PROPERTIES LABELS "load" TIMEOUT 300 RUN_SERIAL TRUE)

  add_test(NAME load_soak
    COMMAND ${PYTHON3} ${KVC_LOAD_DIR}/test_soak.py --daemon $<TARGET_FILE:kvcoordd>
            --worker $<TARGET_FILE:kvcoord-worker> --rooms $<TARGET_FILE:soak_rooms>
            --seconds ${KVCOORD_SOAK_SECONDS})
  math(EXPR soak_limit "${KVCOORD_SOAK_SECONDS} * 2 + 180")
  # Not serial: it asserts no time (errors, fds, RSS; its waits allow 30 s
  # and more), so it runs beside the tests that mostly wait, in two slots
  # (PROCESSORS 2, tests/CMakeLists.txt) as the other tests that keep two
  # cores busy.  Serial, its minute was a minute of every suite's tail.
  set_tests_properties(load_soak PROPERTIES LABELS "load" TIMEOUT ${soak_limit})
endif()
