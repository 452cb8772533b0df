# Tests of the Python package (label "python"), run as
# `/usr/bin/python3 -m unittest` against the build tree's package
# (PYTHONPATH=build/python).  Included from tests/CMakeLists.txt.
if(TARGET kvcoord_python)
  set(KVC_PY_TEST_ENV PYTHONPATH=${KVC_PY_BUILD_DIR} PYTHONDONTWRITEBYTECODE=1
      KVCOORD_BUILD_DIR=${CMAKE_BINARY_DIR} KVCOORD_SOURCE_DIR=${CMAKE_SOURCE_DIR})
  if(KVCOORD_SANITIZE)
    # The extension is instrumented: the interpreter needs the sanitizer
    # runtimes loaded first.  Python's own allocations are not leaks to report.
    foreach(rt asan ubsan)
      execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=lib${rt}.so
                      OUTPUT_VARIABLE kvc_${rt} OUTPUT_STRIP_TRAILING_WHITESPACE)
    endforeach()
    list(APPEND KVC_PY_TEST_ENV "LD_PRELOAD=${kvc_asan}:${kvc_ubsan}"
         "ASAN_OPTIONS=detect_leaks=0:$ENV{ASAN_OPTIONS}")
  endif()
  function(kvc_py_test name file labels)
    add_test(NAME ${name}
      COMMAND ${CMAKE_COMMAND} -E env ${KVC_PY_TEST_ENV} KVCOORD_DAEMON=$<TARGET_FILE:kvcoordd>
              ${PYTHON3} -m unittest discover -v -s ${CMAKE_CURRENT_LIST_DIR} -p ${file})
    set_tests_properties(${name} PROPERTIES LABELS "${labels}" TIMEOUT 600)
  endfunction()
  kvc_py_test(python_binding test_binding.py "python;unit")
  kvc_py_test(python_rankinfo test_rankinfo.py "python;unit")
  kvc_py_test(python_nomemory test_nomemory.py "python;unit")
  kvc_py_test(python_close test_close.py "python;unit")
  kvc_py_test(python_multiproc test_multiproc.py "python;multiproc;crash")
  kvc_py_test(python_namespaces test_namespaces.py "python;multiproc;liveness")
  kvc_py_test(python_one_truth test_one_truth.py "python;unit;liveness")
  kvc_py_test(python_rooms_watch test_rooms_watch.py "python;multiproc;liveness;rooms")
  kvc_py_test(python_stubs test_stubs.py "python;unit")
  kvc_py_test(python_rss test_rss.py "python;load")
  kvc_py_test(python_http_roles test_http_roles.py "python;http")
  kvc_py_test(python_sglang test_sglang.py "python;http;multiproc")
  kvc_py_test(python_pd test_pd.py "python;multiproc")
  kvc_py_test(python_sglang_pd test_sglang_pd.py "python;http;multiproc")
  kvc_py_test(python_example test_example.py "python;multiproc;tools")
  # kvcoord.sglang.install() on the sglang-shaped fixture (fake_sglang/); the
  # forked ranks use torch.distributed gloo on CPU (Debian's python3-torch)
  kvc_py_test(python_sglang_install test_sglang_install.py "python;unit;crash")
  kvc_py_test(python_sglang_ranks test_sglang_ranks.py "python;multiproc;crash")
  kvc_py_test(python_sglang_poll test_sglang_poll.py "python;multiproc")
  kvc_py_test(python_sglang_readme test_sglang_readme.py "python;docs")
  # install() where sglang cannot be imported: the error says what is missing
  kvc_py_test(python_sglang_missing test_sglang_missing.py "python;unit")
  kvc_py_test(python_pip test_pip.py "python;install")
  # two from-scratch builds of the extensions (pip install, pip wheel): a
  # hang guard that a loaded machine does not trip
  set_tests_properties(python_pip PROPERTIES TIMEOUT 1200)
  # a hang guard: under ASan at load 15-25 the file takes 470-600+ s
  set_tests_properties(python_sglang_poll PROPERTIES TIMEOUT 1500)
  kvc_py_test(python_collective test_collective.py "python;multiproc;crash;coll")
  # kvcoord.mooncake.TransferEngine between processes (mooncake_peer.py)
  kvc_py_test(python_mooncake test_mooncake.py "python;multiproc;crash;xfer")
  kvc_py_test(python_mooncake_sglang test_mooncake_sglang.py "python;multiproc;crash;xfer")
  # its failure values before initialize() and of a failed initialize()
  kvc_py_test(python_mooncake_errors test_mooncake_errors.py "python;unit;xfer")
  kvc_py_test(python_collective_diag test_collective_diag.py "python;multiproc;coll")
endif()
