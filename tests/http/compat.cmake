# HTTP compatibility and daemon-restart tests (label "http"): kvcoordd
# against real clients (Python requests, curl), and registrations surviving
# SIGKILL of kvcoordd.  Included from tests/CMakeLists.txt
# (CMAKE_CURRENT_SOURCE_DIR is tests/).  Each test starts its own kvcoordd on
# a free loopback port with its own segment (kvctest-compat-<pid>,
# kvctest-restart-<pid>) and removes it afterwards.

if(TARGET kvcoordd)
  add_test(NAME http_compat
    COMMAND ${PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/http/test_http_compat.py
            --daemon $<TARGET_FILE:kvcoordd>
            --source ${CMAKE_SOURCE_DIR})
  set_tests_properties(http_compat PROPERTIES LABELS "http" TIMEOUT 600)

  add_test(NAME http_daemon_restart
    COMMAND ${PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/http/test_daemon_restart.py
            --daemon $<TARGET_FILE:kvcoordd>
            --worker $<TARGET_FILE:kvcoord-worker>
            --source ${CMAKE_SOURCE_DIR})
  set_tests_properties(http_daemon_restart PROPERTIES LABELS "http" TIMEOUT 600)
endif()
