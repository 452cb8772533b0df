# Library tests: unit, multi-process, crash injection.
kvc_c_test(test_segment LABEL "unit" SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_segment.c)
kvc_c_test(test_ranks LABEL "unit" SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ranks.c)
kvc_c_test(test_multiproc LABEL "multiproc" SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_multiproc.c)
kvc_c_test(test_crash LABEL "crash" SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_crash.c)
kvc_c_test(test_rooms LABEL "rooms;multiproc;crash" SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_rooms.c)
