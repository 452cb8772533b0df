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
  add_test(NAME robust_restart_taken
    COMMAND ${PYTHON3} ${KVC_ROBUST_DIR}/test_restart.py --daemon $<TARGET_FILE:kvcoordd>
            --case taken)
  set_tests_properties(robust_restart_taken PROPERTIES LABELS "robust;ops" TIMEOUT 300)
  # Serial: the loop frees and re-binds one port 30 times, and another test's
  # "free port" could be handed that one in a gap.
  set_tests_properties(robust_restart_loop robust_restart_activate PROPERTIES
    LABELS "robust;ops" TIMEOUT 300 SKIP_RETURN_CODE 77 RUN_SERIAL TRUE)
endif()

if(TARGET kvcoordd AND NOT KVCOORD_FUZZ)
  add_executable(lock_holder ${KVC_ROBUST_DIR}/lock_holder.c)
  target_link_libraries(lock_holder PRIVATE kvcoord_core_private)
  add_test(NAME robust_stopped_lock
    COMMAND ${PYTHON3} ${KVC_ROBUST_DIR}/test_stopped_lock.py --daemon $<TARGET_FILE:kvcoordd>
            --holder $<TARGET_FILE:lock_holder>)
  set_tests_properties(robust_stopped_lock PROPERTIES LABELS "robust;ops" TIMEOUT 300)
endif()

if(TARGET kvcoordd AND NOT KVCOORD_FUZZ)
  add_test(NAME robust_memory_flood
    COMMAND ${PYTHON3} ${KVC_ROBUST_DIR}/test_memory.py --daemon $<TARGET_FILE:kvcoordd>)
  add_test(NAME robust_memory_flood_auth
    COMMAND ${PYTHON3} ${KVC_ROBUST_DIR}/test_memory.py --daemon $<TARGET_FILE:kvcoordd> --auth)
  set_tests_properties(robust_memory_flood robust_memory_flood_auth PROPERTIES
    LABELS "robust;ops" TIMEOUT 300 RUN_SERIAL TRUE)
endif()

if(TARGET kvcoordd AND NOT KVCOORD_FUZZ)
  foreach(case runtime start)
    add_test(NAME robust_segment_watch_${case}
      COMMAND ${PYTHON3} ${KVC_ROBUST_DIR}/test_segment_watch.py --daemon $<TARGET_FILE:kvcoordd>
              --case ${case})
    set_tests_properties(robust_segment_watch_${case} PROPERTIES LABELS "robust;ops" TIMEOUT 300)
  endforeach()
endif()
