# Fuzz targets (commands and figures: RELIABILITY.md).  Included from
# tests/CMakeLists.txt (CMAKE_CURRENT_SOURCE_DIR is tests/).
#
# Every build: each target is linked with replay.c and run over its seed and
# regression corpus tests/fuzz/<target>/ (tests fuzz_<target>_replay,
# labels "unit;replay"), so the gcc and ASan builds replay every input that
# once crashed.
#
# -DKVCOORD_FUZZ=ON (CC=clang): each target is a libFuzzer binary
# (-fsanitize=fuzzer,address,undefined) and ctest runs it for
# KVCOORD_FUZZ_SECONDS (label "fuzz"); new inputs go to
# <build>/tests/fuzz-corpus/<target>/, crashes to <build>/tests/fuzz-artifacts/.
# Build just them with: cmake --build build-fuzz --target fuzz-targets

set(KVCOORD_FUZZ_SECONDS 20 CACHE STRING "Seconds each fuzz target runs under ctest (label fuzz)")
set(KVC_FUZZ_DIR ${CMAKE_CURRENT_LIST_DIR})

if(KVCOORD_FUZZ)
  add_custom_target(fuzz-targets)
endif()

# kvc_fuzz_target(NAME [SOURCES src...] [LIBS lib...])
function(kvc_fuzz_target name)
  cmake_parse_arguments(F "" "" "SOURCES;LIBS" ${ARGN})
  if(KVCOORD_FUZZ)
    set(exe fuzz_${name})
    add_executable(${exe} ${KVC_FUZZ_DIR}/fuzz_${name}.c ${F_SOURCES})
    target_link_options(${exe} PRIVATE -fsanitize=fuzzer)
    add_dependencies(fuzz-targets ${exe})
    set(corpus ${CMAKE_CURRENT_BINARY_DIR}/fuzz-corpus/${name})
    set(artifacts ${CMAKE_CURRENT_BINARY_DIR}/fuzz-artifacts)
    file(MAKE_DIRECTORY ${corpus} ${artifacts})
    set(dict)
    if(EXISTS ${KVC_FUZZ_DIR}/${name}.dict)
      set(dict -dict=${KVC_FUZZ_DIR}/${name}.dict)
    endif()
    add_test(NAME ${exe}
      COMMAND ${exe} -max_total_time=${KVCOORD_FUZZ_SECONDS} -timeout=10 -rss_limit_mb=2048
              -print_final_stats=1 -artifact_prefix=${artifacts}/${name}- ${dict}
              ${corpus} ${KVC_FUZZ_DIR}/${name})
    math(EXPR limit "${KVCOORD_FUZZ_SECONDS} * 2 + 120")
    set_tests_properties(${exe} PROPERTIES LABELS "fuzz" TIMEOUT ${limit})
  else()
    set(exe fuzz_${name}_replay)
    add_executable(${exe} ${KVC_FUZZ_DIR}/replay.c ${KVC_FUZZ_DIR}/fuzz_${name}.c ${F_SOURCES})
    add_test(NAME ${exe} COMMAND ${exe} ${KVC_FUZZ_DIR}/${name})
    set_tests_properties(${exe} PROPERTIES LABELS "unit;replay" TIMEOUT 300)
  endif()
  target_include_directories(${exe} PRIVATE ${KVC_FUZZ_DIR})
  target_link_libraries(${exe} PRIVATE kvcoordd_lib kvcoord_transfer_private kvcoord_core_private kvcoord_static ${F_LIBS})
endfunction()

kvc_fuzz_target(http LIBS ${HTTP_PARSER_LIB})
kvc_fuzz_target(register LIBS ${HTTP_PARSER_LIB})
kvc_fuzz_target(xfer_frame)
kvc_fuzz_target(json_scan)
kvc_fuzz_target(pd_record)

# Writes tests/fuzz/xfer_frame/seed-* from the real encoders (run by hand
# when the wire format changes; the seeds are checked in).
if(NOT KVCOORD_FUZZ)
  add_executable(fuzz_gen_xfer_seeds ${KVC_FUZZ_DIR}/gen_xfer_seeds.c)
  target_link_libraries(fuzz_gen_xfer_seeds PRIVATE kvcoord_transfer_private)
endif()
