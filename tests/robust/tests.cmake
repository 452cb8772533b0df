# Robustness of kvcoordd (issue 11): restarts, stopped lock holders, its
# segment file tampered with, memory under body floods, options refused.
# Label "robust" (plus "ops").  Included from tests/CMakeLists.txt.  None
# asserts a wall-clock time; figures are printed (RELIABILITY.md).

set(KVC_ROBUST_DIR ${CMAKE_CURRENT_LIST_DIR})

if(TARGET kvcoordd AND NOT KVCOORD_FUZZ)
  add_test(NAME robust_restart_loop
    COMMAND ${PYTHON3} ${KVC_ROBUST_DIR}/test_restart.py --daemon $<TARGET_FILE:kvcoordd>
            --case loop --restarts 30)
  add_test(NAME robust_restart_activate
    COMMAND ${PYTHON3} ${KVC_ROBUST_DIR}/test_restart.py --daemon $<TARGET_FILE:kvcoordd>
            --case activate --kills 6)
  set_tests_properties(robust_restart_loop robust_restart_activate PROPERTIES
    LABELS "robust;ops" TIMEOUT 300 SKIP_RETURN_CODE 77)
endif()
