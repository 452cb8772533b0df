# Tests of the tools (label "tools"): the model-info generator, kvcoord.sh stop,
# kvcoord-bench rate, and
# kvcoord-worker registering real models' ranks in a segment served by
# kvcoordd, read back over HTTP with Python requests.
# Included from tests/CMakeLists.txt (CMAKE_CURRENT_SOURCE_DIR is tests/).

set(KVC_TOOLS_TEST_DIR ${CMAKE_CURRENT_SOURCE_DIR}/tools)
set(KVC_TOOLS_WORK_DIR ${CMAKE_CURRENT_BINARY_DIR}/tools-work)

add_test(NAME tools_gen_model_info
  COMMAND ${PYTHON3} ${KVC_TOOLS_TEST_DIR}/test_gen_model_info.py
          --gen ${CMAKE_SOURCE_DIR}/tools/gen_model_info.py
          --work ${KVC_TOOLS_WORK_DIR}/gen)
set_tests_properties(tools_gen_model_info PROPERTIES LABELS "tools" TIMEOUT 300)

if(TARGET kvcoordd)
  add_test(NAME tools_worker_http
    COMMAND ${PYTHON3} ${KVC_TOOLS_TEST_DIR}/test_worker_http.py
            --daemon $<TARGET_FILE:kvcoordd>
            --worker $<TARGET_FILE:kvcoord-worker>
            --gen ${CMAKE_SOURCE_DIR}/tools/gen_model_info.py
            --query ${CMAKE_SOURCE_DIR}/tools/query_ranks.py
            --work ${KVC_TOOLS_WORK_DIR}/worker_http)
  set_tests_properties(tools_worker_http PROPERTIES LABELS "tools" TIMEOUT 300)
endif()

if(TARGET kvcoordd)
  add_test(NAME tools_kvcoord_sh
    COMMAND ${PYTHON3} ${KVC_TOOLS_TEST_DIR}/test_kvcoord_sh.py
            --script ${CMAKE_SOURCE_DIR}/tools/kvcoord.sh
            --daemon $<TARGET_FILE:kvcoordd>
            --worker $<TARGET_FILE:kvcoord-worker> --diag $<TARGET_FILE:kvcoord-diag>
            --work ${KVC_TOOLS_WORK_DIR}/kvcoord_sh)
  set_tests_properties(tools_kvcoord_sh PROPERTIES LABELS "tools" TIMEOUT 600)
endif()

# kvcoord-bench rate, the open-loop load generator of tools/bench/bench_http.sh:
# counts of requests sent, answered and failed against a scripted server.
if(TARGET kvcoord-bench)
  add_test(NAME tools_bench_rate
    COMMAND ${PYTHON3} ${KVC_TOOLS_TEST_DIR}/test_bench_rate.py
            --bench $<TARGET_FILE:kvcoord-bench>)
  set_tests_properties(tools_bench_rate PROPERTIES LABELS "tools" TIMEOUT 300)
endif()
