# Cluster view on a real etcd (Debian's etcd-server): every test starts its
# own 3-member cluster on loopback ports (tools/etcd-cluster.sh) and stops it.
kvc_c_test(test_etcd_client LABEL "cluster" SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_etcd_client.c)
target_compile_definitions(test_etcd_client PRIVATE KVC_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
# ctest TIMEOUTs here and in every tests.cmake are hang guards, never a
# promise, 300 s at least (test_etcd_client ran past 120 s at load 46).
set_tests_properties(test_etcd_client PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)

# Nodes (kvcoordd --etcd) against a real cluster: publish, mirror, leases,
# conflicts, rooms, members killed, the cluster stopped and restarted, auth.
add_executable(cluster_probe ${CMAKE_CURRENT_LIST_DIR}/cluster_probe.c)
target_link_libraries(cluster_probe PRIVATE kvcoord_static)
if(TARGET kvcoord_python AND NOT KVCOORD_SANITIZE)  # (an instrumented extension needs LD_PRELOAD)
  set(KVC_CLUSTER_PY --pythonpath ${KVC_PY_BUILD_DIR})
endif()
add_test(NAME cluster_nodes
  COMMAND ${PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/test_cluster.py --daemon $<TARGET_FILE:kvcoordd>
          --worker $<TARGET_FILE:kvcoord-worker> --probe $<TARGET_FILE:cluster_probe>
          --diag $<TARGET_FILE:kvcoord-diag> ${KVC_CLUSTER_PY})
# A hang guard above what a loaded machine takes: its 33 cases ran 420 s
# at load 19 on 2 cores, and an ASan run at load 20 was cut at 600 s.
set_tests_properties(cluster_nodes PROPERTIES LABELS "cluster" SKIP_RETURN_CODE 77 TIMEOUT 900)

# The PD bootstrap tables across nodes (issue 23): a prefill's table on node
# A answered by node B's GET /route, withdrawals, A killed, etcd frozen,
# two prefill nodes, kvcoord-diag pd --etcd.
add_test(NAME cluster_pd
  COMMAND ${PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/test_pd_cluster.py --daemon $<TARGET_FILE:kvcoordd>
          --diag $<TARGET_FILE:kvcoord-diag>)
set_tests_properties(cluster_pd PROPERTIES LABELS "cluster" SKIP_RETURN_CODE 77 TIMEOUT 600)

# One etcd cluster at a time (tools/kvcoord.sh runs ctest -j2): two 3-member
# clusters with their nodes on 2 cores miss their 1 s request deadlines.
set_tests_properties(test_etcd_client cluster_nodes cluster_pd PROPERTIES RESOURCE_LOCK etcd)

# Rooms across nodes (issue 28): what a decode TP group on node B sees, and
# when, of a prefill TP group on node A (sglang-shaped rank processes,
# sgl_ranks.py): a recorded failure with its reason, the prefill killed,
# node A killed or frozen past its lease, an etcd member frozen, etcd down.
if(TARGET kvcoord_python AND NOT KVCOORD_SANITIZE)
  add_test(NAME cluster_shared_rooms
    COMMAND ${PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/test_shared_rooms.py --daemon $<TARGET_FILE:kvcoordd>
            --pythonpath ${KVC_PY_BUILD_DIR})
  set_tests_properties(cluster_shared_rooms PROPERTIES LABELS "cluster" SKIP_RETURN_CODE 77
                       TIMEOUT 900 RESOURCE_LOCK etcd)
endif()
