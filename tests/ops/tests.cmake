# Operations (issue 7): auth, metrics, readiness notification, the systemd
# unit and the install tree.  Label "ops" (plus "unit" for the C unit tests).
# Included from tests/CMakeLists.txt (CMAKE_CURRENT_SOURCE_DIR is tests/).
# Tests that need a tool the machine lacks (promtool from Debian's
# "prometheus" package, systemd-analyze) exit 77 and are reported skipped.

set(KVC_OPS_DIR ${CMAKE_CURRENT_SOURCE_DIR}/ops)
set(KVC_OPS_WORK ${CMAKE_CURRENT_BINARY_DIR}/ops-work)

kvc_c_test(test_auth LABEL "unit"
  SOURCES ${KVC_OPS_DIR}/test_auth.c)
kvc_c_test(test_metrics LABEL "unit"
  SOURCES ${KVC_OPS_DIR}/test_metrics.c)
kvc_c_test(test_notify LABEL "unit"
  SOURCES ${KVC_OPS_DIR}/test_notify.c)
# kvcoordd's log escaping (one function for every value).
kvc_c_test(test_log LABEL "unit"
  SOURCES ${KVC_OPS_DIR}/test_log.c)
set_tests_properties(test_auth test_metrics test_notify test_log PROPERTIES LABELS "unit;ops")
# kvcoordd's options table against the program: --help lists every row,
# every numeric option refuses values out of its range (exit 2, named).
if(TARGET kvcoordd)
  add_executable(test_options ${KVC_OPS_DIR}/test_options.c)
  target_link_libraries(test_options PRIVATE kvcoordd_lib ${CMOCKA_LIB})
  add_test(NAME test_options COMMAND test_options $<TARGET_FILE:kvcoordd>)
  set_tests_properties(test_options PROPERTIES LABELS "unit;ops" TIMEOUT 600)
endif()

# The exposition of a segment in a known state, checked by promtool.
add_test(NAME ops_metrics_promtool
  COMMAND sh ${KVC_OPS_DIR}/test_promtool.sh $<TARGET_FILE:test_metrics> ${KVC_OPS_WORK}/promtool)
set_tests_properties(ops_metrics_promtool PROPERTIES LABELS "ops" SKIP_RETURN_CODE 77 TIMEOUT 600)

# tools/kvcoordd@.service, verified with systemd-analyze.
set(KVC_OPS_DAEMON "")
if(TARGET kvcoordd)
  set(KVC_OPS_DAEMON $<TARGET_FILE:kvcoordd>)
endif()
add_test(NAME ops_unit_verify
  COMMAND sh ${KVC_OPS_DIR}/test_unit.sh ${CMAKE_SOURCE_DIR}/tools/kvcoordd@.service
          ${KVC_OPS_WORK}/unit ${KVC_OPS_DAEMON})
set_tests_properties(ops_unit_verify PROPERTIES LABELS "ops" SKIP_RETURN_CODE 77 TIMEOUT 600)

# cmake --install into a temporary prefix, then build and run a program
# against the installed library with pkg-config (shared, then static).
add_test(NAME ops_install_pkgconfig
  COMMAND sh ${KVC_OPS_DIR}/test_install.sh ${CMAKE_BINARY_DIR} ${KVC_OPS_WORK}/install
          ${KVC_OPS_DIR}/install_prog.c ${CMAKE_C_COMPILER})
set_tests_properties(ops_install_pkgconfig PROPERTIES LABELS "ops" SKIP_RETURN_CODE 77 TIMEOUT 600)

# kvcoordd end to end (readiness, auth over HTTP, /metrics, logs of a
# registration and a lock recovery, SIGHUP, a worker killed at once);
# skipped (77) if the daemon has no --auth-token-file.
add_executable(ops_crash ${KVC_OPS_DIR}/ops_crash.c)
target_link_libraries(ops_crash PRIVATE kvcoord_core_private)
if(TARGET kvcoordd)
  add_test(NAME ops_daemon
    COMMAND ${PYTHON3} ${KVC_OPS_DIR}/test_daemon_ops.py --daemon $<TARGET_FILE:kvcoordd>
            --crash $<TARGET_FILE:ops_crash> --worker $<TARGET_FILE:kvcoord-worker>
            --work ${KVC_OPS_WORK}/daemon)
  set_tests_properties(ops_daemon PROPERTIES LABELS "ops;http" SKIP_RETURN_CODE 77 TIMEOUT 300)
endif()

# Every program's exit status on a usage error (2, message on stderr, nothing
# on stdout) and its --help documenting it.
if(TARGET kvcoordd)
  set(kvc_cli_exit_sanitized "")
  if(KVCOORD_SANITIZE)
    set(kvc_cli_exit_sanitized --sanitized)
  endif()
  add_test(NAME ops_cli_exit
    COMMAND ${PYTHON3} ${KVC_OPS_DIR}/test_cli_exit.py --bin $<TARGET_FILE_DIR:kvcoordd>
            --tools ${CMAKE_SOURCE_DIR}/tools ${kvc_cli_exit_sanitized})
  set_tests_properties(ops_cli_exit PROPERTIES LABELS "ops;tools" TIMEOUT 300)
endif()

# The shared libraries export only their public API, and libkvcoord needs
# neither liburing nor libibverbs.
add_test(NAME ops_symbols
  COMMAND sh ${KVC_OPS_DIR}/test_symbols.sh $<TARGET_FILE:kvcoord> $<TARGET_FILE:kvcoord-transfer>)
set_tests_properties(ops_symbols PROPERTIES LABELS "ops;unit" TIMEOUT 600)

# The C program of docs/library.md, extracted and compiled exactly as printed,
# then the README's Python and curl examples, in that order, against one real
# kvcoordd.
set(KVC_README_SANITIZE "")
if(KVCOORD_SANITIZE)
  set(KVC_README_SANITIZE "--sanitize")
elseif(TARGET kvcoord_python)
  # the Python example too (an instrumented extension would need the
  # sanitizer runtimes preloaded into the interpreter: plain builds only)
  set(KVC_README_SANITIZE --pythonpath ${CMAKE_BINARY_DIR}/python
      --mooncake ${CMAKE_SOURCE_DIR}/docs/mooncake.md)
endif()
add_test(NAME ops_readme_examples
  COMMAND ${PYTHON3} ${KVC_OPS_DIR}/test_readme_snippet.py --readme ${CMAKE_SOURCE_DIR}/README.md
          --library ${CMAKE_SOURCE_DIR}/docs/library.md
          --include ${CMAKE_SOURCE_DIR}/include --libdir $<TARGET_FILE_DIR:kvcoord>
          --daemon $<TARGET_FILE:kvcoordd> --cc ${CMAKE_C_COMPILER} ${KVC_README_SANITIZE})
set_tests_properties(ops_readme_examples PROPERTIES LABELS "ops" TIMEOUT 300)

# The build units as docs/architecture.md draws them: no target puts another
# unit's folder on its include path, every link between units is listed.
add_test(NAME ops_units
  COMMAND ${PYTHON3} ${KVC_OPS_DIR}/test_units.py ${CMAKE_SOURCE_DIR})
set_tests_properties(ops_units PROPERTIES LABELS "ops;unit")

# Docs that are true: every relative link (and #anchor) and every src/, tests/,
# tools/ path named in README.md, docs/*.md and RELIABILITY.md exists, and no
# NAME.md outside the repository is named.
add_test(NAME ops_doc_paths
  COMMAND ${PYTHON3} ${KVC_OPS_DIR}/test_doc_paths.py ${CMAKE_SOURCE_DIR})
set_tests_properties(ops_doc_paths PROPERTIES LABELS "ops;unit")

# docs/python-api.md is what tools/gen_python_api.py makes from the
# docstrings of this build's package (plain builds: the instrumented
# extension would need the sanitizer runtimes preloaded).
if(TARGET kvcoord_python AND NOT KVCOORD_SANITIZE)
  add_test(NAME ops_python_api
    COMMAND ${CMAKE_COMMAND} -E env PYTHONPATH=${CMAKE_BINARY_DIR}/python
            ${PYTHON3} ${CMAKE_SOURCE_DIR}/tools/gen_python_api.py --check)
  set_tests_properties(ops_python_api PROPERTIES LABELS "ops;docs")
endif()
