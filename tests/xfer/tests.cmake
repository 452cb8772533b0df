# Transfer engine tests (label "xfer"): loopback, bad input on the wire,
# verbs device-less paths and GID rules, RDMA hardware (skips without a
# device), two nodes in network namespaces (skips without root/netns).
set(KVC_XFER_TEST_DIR ${CMAKE_CURRENT_LIST_DIR})
function(kvc_xfer_test name)
  kvc_c_test(${name} LABEL "xfer" SOURCES ${KVC_XFER_TEST_DIR}/${name}.c)
  target_include_directories(${name} PRIVATE ${KVC_XFER_TEST_DIR} ${CMAKE_CURRENT_SOURCE_DIR}/lib)
  set_tests_properties(${name} PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
endfunction()

kvc_xfer_test(test_xfer_loopback)
kvc_xfer_test(test_xfer_wire)
kvc_xfer_test(test_xfer_token)
kvc_xfer_test(test_xfer_read)
kvc_xfer_test(test_xfer_cma)
# Engines on one host copy the data (xfer_cma.c); the socket path of the
# same tests, forced (KVCOORD_FORCE_SOCKET):
add_test(NAME test_xfer_read_socket COMMAND test_xfer_read)
add_test(NAME test_xfer_loopback_socket COMMAND test_xfer_loopback)
set_tests_properties(test_xfer_read_socket test_xfer_loopback_socket PROPERTIES
                     LABELS "xfer" TIMEOUT 300 SKIP_RETURN_CODE 77
                     ENVIRONMENT "KVCOORD_FORCE_SOCKET=1")
kvc_xfer_test(test_xfer_window)
# The receiver's table of senders: bounded, capped (kvt_stats.senders).
kvc_xfer_test(test_xfer_senders)
kvc_xfer_test(test_xfer_bind)
kvc_xfer_test(test_xfer_fetch)
kvc_xfer_test(test_xfer_verbs)
kvc_xfer_test(test_xfer_verbs_dp)
kvc_xfer_test(test_xfer_rdma_hw)
set_tests_properties(test_xfer_rdma_hw PROPERTIES LABELS "xfer;rdma")
kvc_xfer_test(test_xfer_twonode)
# Each namespace runs its own kvcoordd: the test starts the daemon built here.
target_link_libraries(test_xfer_twonode PRIVATE PkgConfig::JANSSON)
add_dependencies(test_xfer_twonode kvcoordd)
set_tests_properties(test_xfer_twonode PROPERTIES LABELS "xfer;twonode" RUN_SERIAL ON
                     ENVIRONMENT "KVCOORDD=$<TARGET_FILE:kvcoordd>")

# kvcoord-bench's transfer subcommand runs (dispatch, a room, the JSON
# line); a smoke test, no figure is judged.
add_test(NAME bench_transfer_smoke
         COMMAND kvcoord-bench transfer --backend tcp --block 64K --batch 4 --conns 2 --duration 0.3 --json)
set_tests_properties(bench_transfer_smoke PROPERTIES LABELS "xfer;bench-smoke" TIMEOUT 300
                     PASS_REGULAR_EXPRESSION "\"rooms_failed\":0,.*\"gb_per_s\"")
# --read: the same rooms pulled with kvt_submit_read.
add_test(NAME bench_transfer_smoke_read
         COMMAND kvcoord-bench transfer --read --block 64K --batch 8 --conns 2 --duration 0.3 --json)
set_tests_properties(bench_transfer_smoke_read PROPERTIES LABELS "xfer;bench-smoke" TIMEOUT 300
                     PASS_REGULAR_EXPRESSION "\"op\":\"read\",.*\"rooms_failed\":0,.*\"gb_per_s\"")
# The like-for-like mode of bench_transfer.sh: every write of a room from one
# source block into one destination block, processes pinned (CPU 0 exists
# everywhere); the JSON line carries the working set and the CPU per GB.
add_test(NAME bench_transfer_smoke_ws1
         COMMAND kvcoord-bench transfer --backend tcp --block 64K --batch 4 --working-set 1
                 --conns 1 --pin 0,0 --duration 0.3 --json)
set_tests_properties(bench_transfer_smoke_ws1 PROPERTIES LABELS "xfer;bench-smoke" TIMEOUT 300
                     PASS_REGULAR_EXPRESSION "\"working_set\":1,.*\"rooms_failed\":0,.*\"cpu_s_per_gb\"")
# transfer --compare: iperf3 (started by the bench), splice on and off in one
# run; the JSON summary names all three figures (77: no iperf3, skipped).
add_test(NAME bench_transfer_smoke_compare
         COMMAND kvcoord-bench transfer --compare --rounds 1 --block 64K --batch 4 --duration 1
                 --json)
set_tests_properties(bench_transfer_smoke_compare PROPERTIES LABELS "xfer;bench-smoke" TIMEOUT 120
                     SKIP_RETURN_CODE 77
                     PASS_REGULAR_EXPRESSION "\"mode\":\"compare\".*\"iperf3_gb_per_s\":[0-9.]*[1-9].*\"splice_on_gb_per_s\":[0-9.]*[1-9].*\"splice_off_gb_per_s\":[0-9.]*[1-9]")
# The engine's layers (docs/transfer.md, "Backends"): shared code names no
# backend, the tcp backend never calls the receive path, the connection layer
# is declared in xfer_conn.h only.
add_test(NAME test_xfer_layers
         COMMAND ${PYTHON3} ${KVC_XFER_TEST_DIR}/test_xfer_layers.py
                 ${CMAKE_SOURCE_DIR}/src/xfer)
set_tests_properties(test_xfer_layers PROPERTIES LABELS "xfer;unit")
