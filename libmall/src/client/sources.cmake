# SPDX-License-Identifier: BSD-3-Clause
# sources.cmake — the files of libmall.so, the client library (included by libmall/CMakeLists.txt,
# which declares the target, its exports and links); paths are relative to libmall/.
target_sources(mall PRIVATE
  src/client/mall.cpp
  src/client/attach.cpp
  src/client/notify.cpp
  src/client/monitor.cpp
  src/client/control_by_signal.cpp
  src/client/process_effects.cpp)
