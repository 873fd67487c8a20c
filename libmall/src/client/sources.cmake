# SPDX-License-Identifier: BSD-3-Clause
# sources.cmake — the files of libmall.so, the client library (included by libmall/CMakeLists.txt,
# which declares the target, its exports and links, and by python/package.cmake); paths are
# relative to this file's folder, so any CMakeLists may include it. One file per
# concern; handle.hpp holds the handle they share, mall.cpp the C API.
target_sources(mall PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/mall.cpp
  ${CMAKE_CURRENT_LIST_DIR}/open_config.cpp
  ${CMAKE_CURRENT_LIST_DIR}/lifecycle.cpp
  ${CMAKE_CURRENT_LIST_DIR}/attach.cpp
  ${CMAKE_CURRENT_LIST_DIR}/monitor.cpp
  ${CMAKE_CURRENT_LIST_DIR}/notify.cpp
  ${CMAKE_CURRENT_LIST_DIR}/change.cpp
  ${CMAKE_CURRENT_LIST_DIR}/control_by_signal.cpp
  ${CMAKE_CURRENT_LIST_DIR}/process_effects.cpp)
