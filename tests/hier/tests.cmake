# The hierarchical collective (src/hier/, kvcoord.HierGroup) across "hosts":
# network namespaces on one machine (test_hier.py's top says what each
# checks).  Needs root, ip(8) and python3-torch (the gloo world); skipped
# otherwise.  Run alone: they time steps across namespaces and fork 16 ranks.
if(TARGET kvcoord_python)
  foreach(part Agreement ThreeHosts Failures Installed)
    string(TOLOWER ${part} lower)
    add_test(NAME hier_${lower}
      COMMAND ${CMAKE_COMMAND} -E env ${KVC_PY_TEST_ENV} KVCOORD_DAEMON=$<TARGET_FILE:kvcoordd>
              ${PYTHON3} -m unittest -v test_hier.${part}
      WORKING_DIRECTORY ${CMAKE_CURRENT_LIST_DIR})
    set_tests_properties(hier_${lower} PROPERTIES LABELS "hier;multiproc;crash;netns"
                         TIMEOUT 900 RUN_SERIAL ON)
  endforeach()
endif()

# kvc_hier_* from C in one namespace: two segments, the leaders joined by a
# socketpair, forked ranks (test_hier_unit.c's top).
kvc_c_test(test_hier_unit LABEL "hier;multiproc;crash" SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_hier_unit.c)
target_link_libraries(test_hier_unit PRIVATE kvcoord_hier)
