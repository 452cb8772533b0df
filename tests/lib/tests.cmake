# Library tests: unit, multi-process, crash injection.
kvc_c_test(test_segment LABEL "unit" SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_segment.c)
kvc_c_test(test_ranks LABEL "unit" SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ranks.c)
kvc_c_test(test_json_scan LABEL "unit" SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_json_scan.c)
kvc_c_test(test_multiproc LABEL "multiproc" SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_multiproc.c)
kvc_c_test(test_crash LABEL "crash" SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_crash.c)
kvc_c_test(test_rooms LABEL "rooms;multiproc;crash" SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_rooms.c)
# The seqlock (src/core/segment/seqlock.h) hammered by writer and reader processes:
# the bare protocol, rooms and ranks; every accepted snapshot checked whole.
kvc_c_test(test_seqlock LABEL "torture;multiproc" SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_seqlock.c)
# Lock deadlines on CLOCK_MONOTONIC (interposed clocklock + a holder process).
kvc_c_test(test_lock_clock LABEL "unit;multiproc" SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_lock_clock.c)
target_link_libraries(test_lock_clock PRIVATE ${CMAKE_DL_LIBS})

# The PD bootstrap tables (kvcoord/pd.h): rules, liveness, crash rollback, room map.
kvc_c_test(test_pd LABEL "unit;multiproc;crash" SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_pd.c)
# Liveness across PID and time namespaces (real processes, SIGKILL), fork
# children and the liveness lock, one handle count per process across the
# static library and libkvcoord.so, --fresh refusal, stale segments,
# overwritten header sizes (issue 20).  Namespace cases skip without
# CAP_SYS_ADMIN.
kvc_c_test(test_liveness LABEL "unit;multiproc;liveness" SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_liveness.c)
target_compile_definitions(test_liveness PRIVATE KVC_TEST_SHARED_LIB="$<TARGET_FILE:kvcoord>")
target_link_libraries(test_liveness PRIVATE ${CMAKE_DL_LIBS})
add_dependencies(test_liveness kvcoord)

# The shared-memory all-reduce: 2/4/8 processes against the MIN computed
# independently, a rank SIGKILLed at each point of a call, late ranks.
kvc_c_test(test_collective LABEL "multiproc;crash;coll" SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_collective.c)

# Up to here: the library's own tests (KVCOORD_CORE_ONLY builds these alone,
# as the arm64 cross build does); below, tests that need other units too.
if(KVCOORD_CORE_ONLY)
  return()
endif()

# Every public function called with NULL and out-of-range values; every
# failure reported; a full process table reaps before reuse.
kvc_c_test(test_bad_calls LABEL "unit;multiproc" SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_bad_calls.c)

# One source per shared rule: each rule's callers fed the same cases.
kvc_c_test(test_shared_rules LABEL "unit" SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_shared_rules.c)

# Crash torture (kvcoord-torture): a few hundred rounds in CI; the documented
# long run is `kvcoord-torture --rounds 10000`.
add_test(NAME torture_4_workers COMMAND kvcoord-torture --rounds 300 --workers 4 --seed 1)
add_test(NAME torture_8_workers COMMAND kvcoord-torture --rounds 200 --workers 8 --seed 2 --selfkill 100)
set_tests_properties(torture_4_workers torture_8_workers PROPERTIES LABELS "torture;crash")

# The rooms benchmark runs (figures printed, never judged).
add_test(NAME bench_rooms_smoke COMMAND kvcoord-bench rooms --rounds 20 --duration 0.2)
set_tests_properties(bench_rooms_smoke PROPERTIES LABELS "bench-smoke")

# A full /dev/shm (a 16 MiB tmpfs in a private mount namespace): errors, no SIGBUS.
add_test(NAME small_shm COMMAND ${PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/test_small_shm.py $<TARGET_FILE:kvcoordd>)
set_tests_properties(small_shm PROPERTIES LABELS "unit;crash" SKIP_RETURN_CODE 77 TIMEOUT 300)
