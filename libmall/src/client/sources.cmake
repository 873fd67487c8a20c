# SPDX-License-Identifier: BSD-3-Clause
# sources.cmake — the files of libmall.so, the client library (included by libmall/CMakeLists.txt,
# which declares the target, its exports and links); paths are relative to libmall/. One room per
# concern; handle.hpp holds the handle they share, mall.cpp the C API.
target_sources(mall PRIVATE
  src/client/mall.cpp
  src/client/open_config.cpp
  src/client/lifecycle.cpp
  src/client/attach.cpp
  src/client/monitor.cpp
  src/client/notify.cpp
  src/client/change.cpp
  src/client/control_by_signal.cpp
  src/client/process_effects.cpp)
