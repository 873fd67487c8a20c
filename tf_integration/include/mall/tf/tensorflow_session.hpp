// tensorflow_session.hpp — malleable thread pools for TensorFlow's C++ Session API.
//
// Contract: MalleableSessionPools owns a resizable intra-op pool (and optionally an inter-op pool)
// implementing tensorflow::thread::ThreadPoolInterface; attach() ties them to a libmall handle so
// that every mall_step() that brings a new allocation resizes and re-pins them before it acks;
// options() gives the tensorflow::thread::ThreadPoolOptions to pass to Session::Run or
// Session::RunCallable. DirectSession re-reads the intra-op pool's NumThreads() at every Run, so a
// resize at a step boundary takes effect on the next step. The pools must outlive the handle's
// last mall_step() and every Run that uses them.
//
// Built and tested against TensorFlow's CPU wheel from PyPI (2.21.0, pinned in
// launch_scripts/requirements-tensorflow.txt; install-deps.sh puts it in <repo>/.venv): CMake gives
// it the target mall::tf_tensorflow when it finds TensorFlow (MALL_WITH_TENSORFLOW, reported at
// configure time), and tests/integration/tf_test_session_adapter.cpp checks that TensorFlow's
// kernels run on these pools and that a resize applies at the next Run. The pool itself,
// ResizableThreadPoolTempl, is also compiled and tested with Debian's Eigen on every build
// (tests/unit/tf_test_resizable_pool.cpp); this file instantiates it with TensorFlow's interface.
//
// Only the graph/Session API has this hook. TensorFlow's eager mode and Keras (tf.function,
// model.fit) create their thread pools inside the runtime context and offer no way to pass
// caller-owned pools or to resize them afterwards (tf.config.threading.set_*_parallelism_threads
// raises once the context exists), so they cannot be made malleable without changing TensorFlow.
//
// Usage (C++, TensorFlow 2.x; error handling shortened):
//
//   #include <mall/mall.h>
//   #include <mall/tf/tensorflow_session.hpp>
//   #include "tensorflow/core/public/session.h"
//
//   mall_t* m = nullptr;
//   mall_error_t err;
//   if (mall_open(nullptr, &m, &err) != MALL_SUCCESS) fprintf(stderr, "not malleable: %s\n", err.text);
//   mall::tf::MalleableSessionPools pools(/*intra_op_max=*/std::thread::hardware_concurrency(),
//                                         /*inter_op_max=*/2);
//   if (m) pools.attach(m);
//   const tensorflow::thread::ThreadPoolOptions pool_options = pools.options();
//   for (int step = 0; step < steps; ++step) {
//     if (m) mall_step(m);  // one load when nothing changed; resizes the pools when it did
//     TF_CHECK_OK(session->Run(run_options, feeds, {"loss"}, {"train_op"}, &outputs,
//                              /*run_metadata=*/nullptr, pool_options));
//   }
//   mall_close(m);  // before the pools go away
//
// CMake: find_package(mall) then target_link_libraries(app PRIVATE mall::tf_tensorflow).
#pragma once

#include <algorithm>
#include <memory>

#include <mall/mall.h>
#include <mall/tf/mall_pool_glue.hpp>
#include <mall/tf/resizable_thread_pool.hpp>

#include "tensorflow/core/platform/threadpool_options.h"

namespace mall::tf {

// The resizable pool as the thread::ThreadPoolInterface that Session::Run accepts.
using TensorFlowResizableThreadPool =
    ResizableThreadPoolTempl<Eigen::StlThreadEnvironment, tensorflow::thread::ThreadPoolInterface>;

class MalleableSessionPools {
 public:
  // intra_op_max: the most intra-op workers the job may ever get (e.g. the node's cores, or the
  // job's --malleable MAX); inter_op_max: the inter-op pool's largest size, 0 for no inter-op pool
  // (TensorFlow then runs ops on its own inter-op threads, which mall does not resize). Both pools
  // start at their largest size and follow ncpus (clamped to 1..max) once attached.
  explicit MalleableSessionPools(int intra_op_max, int inter_op_max = 0)
      : intra_op_(std::make_unique<TensorFlowResizableThreadPool>(std::max(1, intra_op_max))),
        inter_op_(inter_op_max > 0 ? std::make_unique<TensorFlowResizableThreadPool>(inter_op_max)
                                   : nullptr) {}

  MalleableSessionPools(const MalleableSessionPools&) = delete;
  MalleableSessionPools& operator=(const MalleableSessionPools&) = delete;

  // Resizes and re-pins the pools at every mall_step() on m that applies a new allocation.
  // Returns MALL_SUCCESS or the mall_error_t code of mall_on_resize (see attach_pool()).
  int attach(mall_t* m) { return attach_pool(m, *intra_op_, inter_op_.get()); }

  // What Session::Run / RunCallable take. Null inter_op_threadpool when there is no inter-op pool.
  tensorflow::thread::ThreadPoolOptions options() const {
    tensorflow::thread::ThreadPoolOptions pool_options{};
    pool_options.inter_op_threadpool = inter_op_.get();
    pool_options.intra_op_threadpool = intra_op_.get();
    return pool_options;
  }

  TensorFlowResizableThreadPool& intra_op() { return *intra_op_; }
  TensorFlowResizableThreadPool* inter_op() { return inter_op_.get(); }

 private:
  std::unique_ptr<TensorFlowResizableThreadPool> intra_op_;
  std::unique_ptr<TensorFlowResizableThreadPool> inter_op_;
};

}  // namespace mall::tf
