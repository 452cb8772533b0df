# Cluster view on a real etcd (Debian's etcd-server): every test starts its
# own 3-member cluster on loopback ports (tools/etcd-cluster.sh) and stops it.
kvc_c_test(test_etcd_client LABEL "cluster" SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_etcd_client.c)
target_compile_definitions(test_etcd_client PRIVATE KVC_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
set_tests_properties(test_etcd_client PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 120)
