// SPDX-License-Identifier: BSD-3-Clause
// tensorflow_session.hpp — TensorFlow's OWN thread pools, parked to follow mall, for the C++
// Session API (park, don't replace: see pool_parking.hpp).
//
// Contract: SessionPoolParking::find(session, inter_op_threads) reaches the two pools a created
// DirectSession runs on, without any ThreadPoolOptions: the intra-op pool through the session's
// device manager (the CPU device's tensorflow_cpu_worker_threads()), the inter-op pool through the
// runner TensorFlow hands a tiny op of ours (MallInterOpRunner, run once in a private one-node
// session: TensorFlow's inter-op pool is process-wide unless a session asks for its own, so the
// private session's runner schedules onto the pool the user's session uses). A session made with
// use_per_session_threads or session_inter_op_thread_pool has an inter-op pool of its own that
// this cannot reach: pass inter_op_threads < 0 there (its intra-op pool is still parked). attach(m) makes every mall_step() on m that brings a new
// allocation pin both pools' workers to its cpus and park or release workers to its thread count,
// before the ack. Session::Run is called exactly as before (no pool options): TensorFlow's kernels
// run on TensorFlow's pools, at TensorFlow's speed. TensorFlow still splits a kernel's work by its
// own (fixed) pool size; the running workers steal the parked workers' shares.
//
// Lifetime: destroy the SessionPoolParking (which releases every parked worker) before the session
// is closed or destroyed (a session-owned pool, use_per_session_threads, is destroyed with it), and
// call mall_close() on the handle before that. TensorFlow's global pools live to process exit; a
// parked worker is released at exit too.
//
// Built and tested against TensorFlow's CPU wheel from PyPI (2.21.0, pinned in
// launch_scripts/requirements-tensorflow.txt; install-deps.sh puts it in <repo>/.venv): CMake gives
// it the target mall::tf_tensorflow when it finds TensorFlow (MALL_WITH_TENSORFLOW).
// tests/integration/tf_test_session_adapter.cpp checks that parked TensorFlow workers run no kernel
// and that results do not change.
//
// Usage (C++, TensorFlow 2.x; error handling shortened):
//
//   #include <mall/mall.h>
//   #include <mall/tf/tensorflow_session.hpp>
//
//   tensorflow::SessionOptions options;                    // TensorFlow's pools, sized as usual
//   std::unique_ptr<tensorflow::Session> session(tensorflow::NewSession(options));
//   TF_CHECK_OK(session->Create(graph));
//   std::unique_ptr<mall::tf::SessionPoolParking> parking;
//   TF_CHECK_OK(mall::tf::SessionPoolParking::find(*session, /*inter_op_threads=*/0, &parking));
//   mall_t* m = nullptr;
//   mall_error_t err;
//   if (mall_open(nullptr, &m, &err) == MALL_SUCCESS) parking->attach(m);
//   for (int step = 0; step < steps; ++step) {
//     if (m) mall_step(m);  // two atomic loads when nothing changed; parks/releases workers when it did
//     TF_CHECK_OK(session->Run(feeds, {"loss"}, {"train_op"}, &outputs));
//   }
//   mall_close(m);
//   parking.reset();  // before the session goes
//
// CMake: find_package(mall) then target_link_libraries(app PRIVATE mall::tf_tensorflow).
#pragma once

#include <sys/syscall.h>
#include <unistd.h>

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <stdexcept>
#include <utility>

#include <mall/mall.h>
#include <mall/tf/mall_pool_glue.hpp>
#include <mall/tf/pool_parking.hpp>
#include <mall/tf/runner_pool.hpp>

#include "tensorflow/core/common_runtime/device.h"
#include "tensorflow/core/common_runtime/device_mgr.h"
#include "tensorflow/core/framework/graph.pb.h"
#include "tensorflow/core/framework/kernel_def_builder.h"
#include "tensorflow/core/framework/node_def.pb.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_def_builder.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/threadpool.h"
#include "tensorflow/core/public/session.h"
#include "tensorflow/core/util/work_sharder.h"

namespace mall::tf {

namespace detail {

// The runner the last MallInterOpRunner kernel saw (it schedules onto the Run's inter-op pool).
struct InterOpRunnerCapture {
  std::mutex finding;  // one find() at a time
  std::mutex mutex;
  InterOpRunner runner;
  static InterOpRunnerCapture& instance() {
    static InterOpRunnerCapture* capture = new InterOpRunnerCapture;  // leaked: used at exit
    return *capture;
  }
};

class MallInterOpRunnerKernel : public tensorflow::OpKernel {
 public:
  explicit MallInterOpRunnerKernel(tensorflow::OpKernelConstruction* context) : OpKernel(context) {}
  void Compute(tensorflow::OpKernelContext* context) override {
    InterOpRunnerCapture& capture = InterOpRunnerCapture::instance();
    std::lock_guard lock(capture.mutex);
    if (context->runner() != nullptr) capture.runner = *context->runner();
  }
};

// Registers the op and its CPU kernel once per process (at run time, so this header can be
// included in any number of translation units).
inline void register_inter_op_runner_op() {
  static std::once_flag once;
  std::call_once(once, [] {
    tensorflow::OpRegistry::Global()->Register([](tensorflow::OpRegistrationData* op) {
      return tensorflow::OpDefBuilder("MallInterOpRunner").SetIsStateful().Finalize(op);
    });
    tensorflow::KernelDefBuilder kernel("MallInterOpRunner");
    kernel.Device(tensorflow::DEVICE_CPU);
    static tensorflow::kernel_factory::OpKernelRegistrar* registrar =  // leaked: lives with the registry
        new tensorflow::kernel_factory::OpKernelRegistrar(
            kernel.Build(), "MallInterOpRunnerKernel",
            [](tensorflow::OpKernelConstruction* context) -> tensorflow::OpKernel* {
              return new MallInterOpRunnerKernel(context);
            });
    (void)registrar;
  });
}

}  // namespace detail

class SessionPoolParking {
 public:
  // Finds session's pools and puts a PoolParking on each (every worker running until attached).
  // inter_op_threads: the inter-op pool's size as configured (SessionOptions' ConfigProto
  // inter_op_parallelism_threads); 0 means TensorFlow's default, the schedulable cpus; < 0 leaves
  // the inter-op pool alone (TensorFlow then runs ops on the caller's thread anyway).
  // Errors: the session has no local device manager or CPU device (not a DirectSession), the
  // runner op could not be run, or TensorFlow's pools are already parked by another
  // SessionPoolParking of this process (AlreadyExists: the pools are process-wide).
  static absl::Status find(tensorflow::Session& session, int inter_op_threads,
                           std::unique_ptr<SessionPoolParking>* out) {
    const tensorflow::DeviceMgr* devices = nullptr;
    absl::Status status = session.LocalDeviceManager(&devices);
    if (!status.ok()) return status;
    Eigen::ThreadPoolInterface* intra_op = nullptr;
    for (tensorflow::Device* device : devices->ListDevices()) {
      if (device->device_type() != tensorflow::DEVICE_CPU) continue;
      const auto* workers = device->tensorflow_cpu_worker_threads();
      if (workers != nullptr && workers->workers != nullptr) {
        intra_op = workers->workers->AsEigenThreadPool();
        break;
      }
    }
    if (intra_op == nullptr) return absl::NotFoundError("mall: the session has no CPU device with an intra-op pool");

    std::unique_ptr<RunnerPool> inter_op;
    std::unique_ptr<tensorflow::Session> runner_session;
    if (inter_op_threads >= 0) {
      InterOpRunner runner;
      status = capture_inter_op_runner(inter_op_threads, &runner_session, &runner);
      if (!status.ok()) return status;
      // TensorFlow's default inter-op size is the cpus the process may use (a guess the census
      // corrects downwards).
      cpu_set_t usable;
      CPU_ZERO(&usable);
      const int cpus = sched_getaffinity(0, sizeof usable, &usable) == 0
                           ? CPU_COUNT(&usable)
                           : static_cast<int>(std::thread::hardware_concurrency());
      const int threads = inter_op_threads > 0 ? inter_op_threads : std::max(1, cpus);
      inter_op = std::make_unique<RunnerPool>(std::move(runner), threads);
    }
    try {
      out->reset(new SessionPoolParking(*intra_op, std::move(runner_session), std::move(inter_op)));
    } catch (const std::invalid_argument&) {
      return absl::AlreadyExistsError(
          "mall: TensorFlow's pools are already parked by another SessionPoolParking in this process (its pools "
          "are process-wide): use that one, or destroy it first");
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError("mall: out of memory");
    }
    return absl::OkStatus();
  }

  // Releases every parked worker and gives TensorFlow back its full split before the parkings go.
  ~SessionPoolParking() {
    intra_op_parking_.resize(intra_op_parking_.max_threads());
    if (inter_op_parking_) inter_op_parking_->resize(inter_op_parking_->max_threads());
    split_by_running_workers(&intra_op_parking_, true);
    split_by_running_workers(inter_op_parking_.get(), false);
    inter_op_split_.reset();
    inter_op_parking_.reset();  // releases the parked workers first
    if (runner_session_) (void)runner_session_->Close();
  }

  SessionPoolParking(const SessionPoolParking&) = delete;
  SessionPoolParking& operator=(const SessionPoolParking&) = delete;

  // Pins and parks both pools at every mall_step() on m that applies a new allocation. Returns
  // MALL_SUCCESS or the code of mall_on_resize (see attach_pool()).
  int attach(mall_t* m) { return attach_pool(m, intra_op_split_, inter_op_split_.get()); }

  // Each pool as attach() drives it: resize() parks or releases workers, then sets the split
  // TensorFlow's kernels use (split_by_running_workers()). Call them from the stepping thread.
  ResizablePool& intra_op() { return intra_op_split_; }
  ResizablePool* inter_op() { return inter_op_split_.get(); }
  // The parkings themselves (which workers, which are parked, loans).
  PoolParking& intra_op_parking() { return intra_op_parking_; }
  PoolParking* inter_op_parking() { return inter_op_parking_.get(); }

 private:
  // Runs MallInterOpRunner once in a private one-node session and keeps the runner its kernel saw
  // (it schedules onto the process-wide inter-op pool), after checking that it does not run
  // closures inline on the caller.
  static absl::Status capture_inter_op_runner(int inter_op_threads, std::unique_ptr<tensorflow::Session>* session,
                                              InterOpRunner* runner) {
    detail::register_inter_op_runner_op();
    tensorflow::SessionOptions options;
    options.config.set_inter_op_parallelism_threads(std::max(0, inter_op_threads));
    session->reset(tensorflow::NewSession(options));
    if (!*session) return absl::InternalError("mall: TensorFlow made no session to reach its inter-op pool");
    tensorflow::GraphDef graph;
    tensorflow::NodeDef* node = graph.add_node();
    node->set_name("mall_inter_op_runner");
    node->set_op("MallInterOpRunner");
    node->set_device("/device:CPU:0");
    absl::Status status = (*session)->Create(graph);
    auto& capture = detail::InterOpRunnerCapture::instance();
    std::lock_guard one_at_a_time(capture.finding);
    {
      std::lock_guard lock(capture.mutex);
      capture.runner = nullptr;
    }
    if (status.ok()) status = (*session)->Run({}, {}, {"mall_inter_op_runner"}, nullptr);
    if (!status.ok()) return status;
    {
      std::lock_guard lock(capture.mutex);
      *runner = std::move(capture.runner);
    }
    if (!*runner) return absl::InternalError("mall: TensorFlow gave the runner op no runner");
    // A runner that runs closures on the caller (inter_op_parallelism_threads < 0) is no pool.
    // (The closure's state is shared: it may run after a timed-out wait has returned.)
    struct Ran {
      std::mutex mutex;
      std::condition_variable done;
      pid_t tid = 0;
    };
    auto ran = std::make_shared<Ran>();
    (*runner)([ran] {
      std::lock_guard lock(ran->mutex);
      ran->tid = static_cast<pid_t>(syscall(SYS_gettid));
      ran->done.notify_all();
    });
    std::unique_lock lock(ran->mutex);
    if (!ran->done.wait_for(lock, std::chrono::seconds(5), [&] { return ran->tid != 0; }))
      return absl::DeadlineExceededError("mall: TensorFlow's inter-op pool ran no closure in 5 s");
    if (ran->tid == static_cast<pid_t>(syscall(SYS_gettid)))
      return absl::FailedPreconditionError(
          "mall: TensorFlow runs ops on the caller's thread (inter_op_parallelism_threads < 0): there is no inter-op "
          "pool to park; pass inter_op_threads < 0");
    return absl::OkStatus();
  }

  // A pool's parking as the glue drives it, plus what must follow each resize: the split.
  class ParkingThatSplits : public ResizablePool {
   public:
    ParkingThatSplits(PoolParking& parking, std::function<void()> after_resize)
        : parking_(parking), after_resize_(std::move(after_resize)) {}
    int resize(int active_count) override {
      const int applied = parking_.resize(active_count);
      after_resize_();
      return applied;
    }
    int set_affinity(const cpu_set_t& cpus) override { return parking_.set_affinity(cpus); }
    int max_threads() const override { return parking_.max_threads(); }
    int active_threads() const override { return parking_.active_threads(); }

   private:
    PoolParking& parking_;
    std::function<void()> after_resize_;
  };

  // TensorFlow splits a kernel's work by a per-thread bound (GetPerThreadMaxParallelism(): Shard()
  // and the Eigen device a kernel gets both follow it) on the thread that runs the kernel: the
  // stepping thread (ops run inline on it) and the inter-op workers (and intra-op workers, for
  // nested regions). Setting it to the running intra-op count on each of them makes a kernel cut
  // as many pieces as there are running workers, and run inline at one, as a pool made that small
  // would. Runs at each resize (in mall_step(), between Runs: no kernel in flight).
  // After the intra-op pool's resize: the stepping thread and its running workers; after the
  // inter-op pool's (the glue resizes it second, also when its count did not change): its running
  // workers, the released ones included. One rendezvous per pool per change.
  void split_by_running_workers(PoolParking* pool, bool and_this_thread) {
    const int parallelism = intra_op_parking_.active_threads();
    const auto set = [parallelism] { tensorflow::SetPerThreadMaxParallelism(parallelism); };
    if (and_this_thread) set();
    if (pool != nullptr) pool->run_on_each_running_worker(set);
  }

  SessionPoolParking(Eigen::ThreadPoolInterface& intra_op, std::unique_ptr<tensorflow::Session> runner_session,
                     std::unique_ptr<RunnerPool> inter_op)
      : runner_session_(std::move(runner_session)),
        inter_op_pool_(std::move(inter_op)),
        intra_op_parking_(intra_op),
        inter_op_parking_(inter_op_pool_ ? std::make_unique<PoolParking>(*inter_op_pool_, census_sized()) : nullptr) {}

  // The runner does not tell its pool's size: never park more workers than the census found.
  static PoolParking::Options census_sized() {
    PoolParking::Options options;
    options.size_by_census = true;
    return options;
  }

  std::unique_ptr<tensorflow::Session> runner_session_;  // whose Run gave the runner
  std::unique_ptr<RunnerPool> inter_op_pool_;  // declared before its parking: outlives it
  PoolParking intra_op_parking_;
  std::unique_ptr<PoolParking> inter_op_parking_;
  ParkingThatSplits intra_op_split_{intra_op_parking_,
                                    [this] { split_by_running_workers(&intra_op_parking_, true); }};
  std::unique_ptr<ParkingThatSplits> inter_op_split_ =
      inter_op_parking_ ? std::make_unique<ParkingThatSplits>(
                              *inter_op_parking_, [this] { split_by_running_workers(inter_op_parking_.get(), false); })
                        : nullptr;
};

}  // namespace mall::tf
