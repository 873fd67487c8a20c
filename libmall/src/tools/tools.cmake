# SPDX-License-Identifier: BSD-3-Clause
# tools.cmake — the command-line tools built from src/tools/ (included by libmall/CMakeLists.txt
# after mall_common and mall_core are declared); paths are relative to libmall/.
add_executable(mallctl src/tools/mallctl.cpp src/tools/mallctl_session.cpp src/tools/mallctl_status.cpp
  src/tools/mallctl_steer.cpp src/tools/mallctl_signal.cpp src/tools/mallctl_reports.cpp src/tools/mallctl_top.cpp
  src/tools/mallctl_top_frame.cpp)
target_link_libraries(mallctl PRIVATE mall_common Boost::program_options)
add_executable(mallsim src/tools/mallsim.cpp)
target_link_libraries(mallsim PRIVATE mall_core Boost::program_options)
add_executable(mallrun src/tools/mallrun.cpp src/tools/mallrun_options.cpp src/tools/mallrun_container.cpp)
target_link_libraries(mallrun PRIVATE mall_common Boost::program_options)
# The OCI runtime hook (hooks.d, createRuntime/poststop): containers started by any engine that
# reads hooks.d files join malld as malleable jobs (launch_scripts/examples/mall-hooks.d).
add_executable(mall-oci-hook src/tools/mall_oci_hook.cpp src/tools/mall_oci_hook_container.cpp)
target_link_libraries(mall-oci-hook PRIVATE mall_common Boost::program_options)

