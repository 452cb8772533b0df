# kvcoord-diag tests (label "diag"): the tool run against segments that
# diag_fixture puts in known states through the library, text and --json
# output checked field by field, exit codes of every command; and the GID
# GID choice fed to both its callers (the engine and `rdma`) as a unit test.
# Included from tests/CMakeLists.txt (CMAKE_CURRENT_SOURCE_DIR is tests/).

add_executable(diag_fixture ${CMAKE_CURRENT_SOURCE_DIR}/diag/fixture.c)
target_link_libraries(diag_fixture PRIVATE kvcoord_inspect kvcoord_core_private)

kvc_c_test(test_diag_gid LABEL "diag" SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/diag/test_gid.c
           ${CMAKE_SOURCE_DIR}/tools/diag/diag_gid.c)
target_include_directories(test_diag_gid PRIVATE ${CMAKE_SOURCE_DIR}/tools/diag)

add_test(NAME diag_tool
  COMMAND ${PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/diag/test_diag.py
          --diag $<TARGET_FILE:kvcoord-diag>
          --fixture $<TARGET_FILE:diag_fixture>
          --daemon $<TARGET_FILE:kvcoordd>)
set_tests_properties(diag_tool PROPERTIES LABELS "diag" TIMEOUT 300)

# PD reads under a SIGSTOPped PD lock holder (a real stopped process inside
# the lock, kvcoordd serving): lookups answer, kvcoord-diag says "stopped".
add_test(NAME diag_pd_stopped
  COMMAND ${PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/diag/test_pd_stopped.py
          --daemon $<TARGET_FILE:kvcoordd> --diag $<TARGET_FILE:kvcoord-diag>
          --fixture $<TARGET_FILE:diag_fixture>)
set_tests_properties(diag_pd_stopped PROPERTIES LABELS "diag;http;multiproc" TIMEOUT 300)

# The processes behind a served segment: a SIGSTOPped worker is a finding
# (check degraded, procs "stopped"); a segment adopted by a restarted
# kvcoordd names its adopter.
add_test(NAME diag_procs
  COMMAND ${PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/diag/test_diag_procs.py
          --daemon $<TARGET_FILE:kvcoordd> --diag $<TARGET_FILE:kvcoord-diag>
          --worker $<TARGET_FILE:kvcoord-worker>)
set_tests_properties(diag_procs PROPERTIES LABELS "diag;multiproc" TIMEOUT 300)
