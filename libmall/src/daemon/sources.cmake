# SPDX-License-Identifier: BSD-3-Clause
# sources.cmake — the files of mall_daemon (included by libmall/CMakeLists.txt, which declares the
# target and its links); paths are relative to libmall/.
target_sources(mall_daemon PRIVATE
  src/daemon/log.cpp
  src/daemon/procfs.cpp
  src/daemon/backend.cpp
  src/daemon/backend_probe.cpp
  src/daemon/cgroup_tree.cpp
  src/daemon/backend_cgroup.cpp
  src/daemon/backend_cgroup_v1.cpp
  src/daemon/backend_cgroup_v2.cpp
  src/daemon/backend_in_place.cpp
  src/daemon/backend_own_folder.cpp
  src/daemon/backend_slice_mode.cpp
  src/daemon/cgroup_modes.cpp
  src/daemon/affinity_backend.cpp
  src/daemon/job_cpu_time.cpp
  src/daemon/systemd_slice.cpp
  src/daemon/state_file.cpp
  src/daemon/persistence.cpp
  src/daemon/connections.cpp
  src/daemon/pid_watch.cpp
  src/daemon/kernel_effects.cpp
  src/daemon/access.cpp
  src/daemon/handlers.cpp
  src/daemon/handlers_reservations.cpp
  src/daemon/status_view.cpp
  src/daemon/slurm_jobs.cpp
  src/daemon/slurm_reconcile.cpp
  src/daemon/slurmd_spool.cpp
  src/daemon/server.cpp
)
