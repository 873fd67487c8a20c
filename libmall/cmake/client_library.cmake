# SPDX-License-Identifier: BSD-3-Clause
# client_library.cmake — the public client library libmall.so (target mall, alias mall::mall) and
# mall_wire, the static pieces it shares with the daemon and the tools (cpu sets, wire protocol,
# sockets, files; no hwloc, so a training process never loads hwloc). Included by
# libmall/CMakeLists.txt and by python/package.cmake (the `pip install` build); paths are absolute,
# so any CMakeLists may include it. Needs Threads and nlohmann_json found first.
get_filename_component(mall_libmall_dir "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)

# Pieces shared by the library, the daemon and the tools: cpu sets, wire protocol, sockets (no
# hwloc: the public library links only these, so a training process does not load hwloc).
add_library(mall_wire STATIC
  ${mall_libmall_dir}/src/common/cpuset.cpp
  ${mall_libmall_dir}/src/common/protocol.cpp
  ${mall_libmall_dir}/src/common/unix_socket.cpp
  ${mall_libmall_dir}/src/common/ctl_client.cpp
  ${mall_libmall_dir}/src/common/shared_page.cpp
  ${mall_libmall_dir}/src/common/files.cpp
  ${mall_libmall_dir}/src/common/metrics_text.cpp
  ${mall_libmall_dir}/src/common/job_history.cpp)
target_include_directories(mall_wire PUBLIC
  $<BUILD_INTERFACE:${mall_libmall_dir}/include>
  $<BUILD_INTERFACE:${mall_libmall_dir}/src>)
target_link_libraries(mall_wire PUBLIC nlohmann_json::nlohmann_json Threads::Threads)
set_target_properties(mall_wire PROPERTIES CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)

# The public library: only the mall_* C functions are exported.
add_library(mall SHARED)
include(${mall_libmall_dir}/src/client/sources.cmake)  # the client's files (src/client/)
target_include_directories(mall PUBLIC
  $<BUILD_INTERFACE:${mall_libmall_dir}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_compile_definitions(mall PRIVATE MALL_BUILDING_LIBRARY)
target_link_libraries(mall PRIVATE mall_wire)
set_target_properties(mall PROPERTIES
  CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON
  VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}
  EXPORT_NAME mall)
# -z nodelete: a dlclose() (a Python extension unloaded, a plugin host) must never unmap the code
# that an open handle's monitor thread still runs; the library stays loaded until the process ends.
target_link_options(mall PRIVATE -Wl,--exclude-libs,ALL -Wl,--no-undefined -Wl,-z,nodelete
  -Wl,--version-script=${mall_libmall_dir}/cmake/libmall.map)
set_property(TARGET mall APPEND PROPERTY LINK_DEPENDS ${mall_libmall_dir}/cmake/libmall.map)
add_library(mall::mall ALIAS mall)

