# Debian packages: `cd build && cpack -G DEB` writes
#   kvcoord_<version>_<arch>.deb         kvcoordd, kvcoord-diag, kvcoord-bench,
#                                        kvcoord-worker, the systemd units,
#                                        libkvcoord.so.0 and libkvcoord-transfer.so.0,
#                                        the Python package kvcoord (when built)
#                                        and the docs
#   libkvcoord-dev_<version>_<arch>.deb  the headers, kvcoord.pc and
#                                        kvcoord-transfer.pc, the static
#                                        libraries and the .so links
# installed under /usr, each with `apt install ./<file>.deb` on Debian 12
# (apt resolves the dependencies dpkg-shlibdeps found).  The install
# components (CMakeLists.txt, python/CMakeLists.txt) decide what goes where:
# runtime, doc and python make kvcoord, dev makes libkvcoord-dev.
# Included last from the top-level CMakeLists.txt, after every install().

set(CPACK_PACKAGE_NAME kvcoord)
set(CPACK_PACKAGE_VENDOR "kvcoord")
set(CPACK_PACKAGE_CONTACT "kvcoord maintainers <kvcoord@localhost>")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "per-node coordinator for disaggregated LLM serving (sglang)")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_GENERATOR DEB)

set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_GROUPING ONE_PER_GROUP)
set(CPACK_COMPONENTS_ALL runtime doc dev)
if(TARGET kvcoord_python)
  list(APPEND CPACK_COMPONENTS_ALL python)
endif()

set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION misc)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# kvcoord's own libraries are found in the package being built
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${CMAKE_BINARY_DIR})
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)

set(CPACK_DEBIAN_MAIN_PACKAGE_NAME kvcoord)
set(CPACK_DEBIAN_MAIN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_MAIN_DESCRIPTION
    "per-node coordinator for disaggregated LLM serving (sglang)
 kvcoordd (sglang's bootstrap HTTP API on the node's shared-memory
 segment), kvcoord-diag, libkvcoord and libkvcoord-transfer, the systemd
 units and, when built, the Python package kvcoord.")
if(TARGET kvcoord_python)
  # the extension is built for this Python's ABI
  set(CPACK_DEBIAN_MAIN_PACKAGE_DEPENDS
      "python3 (>= ${Python3_VERSION_MAJOR}.${Python3_VERSION_MINOR}), python3 (<< ${Python3_VERSION_MAJOR}.${Python3_VERSION_MINOR}.99)")
endif()

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libkvcoord-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS
    "kvcoord (= ${PROJECT_VERSION}), libjansson-dev, liburing-dev, libibverbs-dev")
set(CPACK_DEBIAN_DEV_DESCRIPTION
    "kvcoord's C headers, pkg-config files and static libraries
 include/kvcoord/*.h, kvcoord.pc, kvcoord-transfer.pc, libkvcoord.a,
 libkvcoord-transfer.a and the .so links, to build workers against kvcoord.")

include(CPack)
cpack_add_component_group(main)
cpack_add_component_group(dev)
cpack_add_component(runtime GROUP main)
cpack_add_component(doc GROUP main)
cpack_add_component(python GROUP main)
cpack_add_component(dev GROUP dev)
