# HTTP tests of kvcoordd (label "http").  Included from tests/CMakeLists.txt
# (CMAKE_CURRENT_SOURCE_DIR is tests/).

# Unit tests of the daemon's HTTP pieces: query decoding, request parsing.
kvc_c_test(test_http_units LABEL "http"
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_http_units.c)
target_link_libraries(test_http_units PRIVATE ${HTTP_PARSER_LIB})

# The route table: every route that changes the segment needs the token.
kvc_c_test(test_http_routes LABEL "http"
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_http_routes.c)
target_link_libraries(test_http_routes PRIVATE ${HTTP_PARSER_LIB})

# Raw-socket tests against a real kvcoordd.
add_test(NAME http_raw
  COMMAND ${PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/test_http_raw.py --daemon $<TARGET_FILE:kvcoordd>)
set_tests_properties(http_raw PROPERTIES LABELS "http" TIMEOUT 600)

# Room routes and dead-process detection, with Python requests and
# kvcoord-worker as the co-located ranks.
add_test(NAME http_rooms
  COMMAND ${PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/test_rooms_http.py --daemon $<TARGET_FILE:kvcoordd>
          --worker $<TARGET_FILE:kvcoord-worker>)
set_tests_properties(http_rooms PROPERTIES LABELS "http" TIMEOUT 300)

# Overload: unread large answers stay within --max-answer-bytes, and a
# reconnecting flood at the connection cap does not lock fresh clients out.
add_test(NAME http_overload
  COMMAND ${PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/test_http_overload.py --daemon $<TARGET_FILE:kvcoordd>)
# Serial (tools/kvcoord.sh runs ctest -j2): its 4096-connection flood and
# 300 unread answers are what it measures, and would starve a neighbour.
set_tests_properties(http_overload PROPERTIES LABELS "http" TIMEOUT 600 RUN_SERIAL TRUE)

# sglang's PD bootstrap server (PUT/GET /route, /register_dp_rank,
# /query_dp_ranks): sglang's exact answers, liveness, restart, expiry, bad input.
add_test(NAME http_pd_bootstrap
  COMMAND ${PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/test_pd_bootstrap.py --daemon $<TARGET_FILE:kvcoordd>
          --diag $<TARGET_FILE:kvcoord-diag>)
set_tests_properties(http_pd_bootstrap PROPERTIES LABELS "http;python" TIMEOUT 300)

# Deaths told as they happened: an HTTP registrant SIGKILLed is "killed by
# signal 9" (PIDFD_INFO_EXIT), a worker in a PID namespace is named by its
# host pid with its own start time (unshare: root only, else skipped).
add_test(NAME http_deaths
  COMMAND ${PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/test_http_deaths.py --daemon $<TARGET_FILE:kvcoordd>
          --worker $<TARGET_FILE:kvcoord-worker> --diag $<TARGET_FILE:kvcoord-diag>)
set_tests_properties(http_deaths PROPERTIES LABELS "http" TIMEOUT 300)

# Per-peer connection cap (--max-conns-per-peer): one address past its
# share is answered 503 while another (127.0.0.2) is served.
add_test(NAME http_peer_cap
  COMMAND ${PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/test_http_peer_cap.py --daemon $<TARGET_FILE:kvcoordd>)
set_tests_properties(http_peer_cap PROPERTIES LABELS "http" TIMEOUT 300)

# Heavy answers rendered once: pipelined /metrics share one rendering per
# batch of the loop; 40 clients of /failures at once join each other's jobs.
add_test(NAME http_shared
  COMMAND ${PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/test_http_shared.py --daemon $<TARGET_FILE:kvcoordd>)
set_tests_properties(http_shared PROPERTIES LABELS "http" TIMEOUT 300)

# The long-poll lookup with a crowd: 150 waiters parked (wait_ms=600000)
# are all answered 200 by the registration's wake, not by their expiry.
add_test(NAME http_longpoll
  COMMAND ${PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/test_http_longpoll.py --daemon $<TARGET_FILE:kvcoordd>)
set_tests_properties(http_longpoll PROPERTIES LABELS "http" TIMEOUT 300)

# Registration bodies that could replace a live worker's rank unseen: a
# field kvcoordd reads repeated is a 400; an HTTP registration replacing a
# live worker's rank is logged at warn (kvcoord-worker holds rank 0).
add_test(NAME http_register_rules
  COMMAND ${PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/test_http_register_rules.py
          --daemon $<TARGET_FILE:kvcoordd> --worker $<TARGET_FILE:kvcoord-worker>)
set_tests_properties(http_register_rules PROPERTIES LABELS "http" TIMEOUT 300)

# --body-timeout counts from each request's own head: a pipelined second
# request on a keep-alive connection is not cut by the first one's deadline.
add_test(NAME http_body_timeout
  COMMAND ${PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/test_http_body_timeout.py
          --daemon $<TARGET_FILE:kvcoordd>)
set_tests_properties(http_body_timeout PROPERTIES LABELS "http" TIMEOUT 300)

# Registration edges: an identical registration through a restarted
# kvcoordd keeps the generation; "rank": -0 is rank 0 (sglang's reading);
# "role": null is a 400; ?wait_ms= on a role that cannot exist is at once.
add_test(NAME http_register_edges
  COMMAND ${PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/test_http_register_edges.py
          --daemon $<TARGET_FILE:kvcoordd>)
set_tests_properties(http_register_edges PROPERTIES LABELS "http" TIMEOUT 300)
