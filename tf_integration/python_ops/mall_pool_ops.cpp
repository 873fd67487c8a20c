// SPDX-License-Identifier: BSD-3-Clause
// mall_pool_ops.cpp — the op library Python TensorFlow loads (tf.load_op_library; mall.tensorflow
// does it) to make Keras model.fit and tf.function loops malleable with an unpatched TensorFlow:
// the op MallPoolThreads parks or releases workers of TensorFlow's OWN pools (park, don't replace:
// pool_parking.hpp) — the intra-op pool, reached from the kernel's device
// (tensorflow_cpu_worker_threads()), and the inter-op pool, reached through the kernel's runner —
// and sets TensorFlow's per-thread split (GetPerThreadMaxParallelism: Shard() and the Eigen device
// a kernel gets) on the calling thread and every running worker, so kernels cut as many pieces as
// there are running workers.
//
// Contract: MallPoolThreads(intra, inter, inter_pool_size) sets the running intra-op and inter-op
// workers (each clamped to 1..the pool's size; 0 leaves that pool as it is) and returns, once the
// parked workers block, [intra running, intra size, inter running, inter size] and the Linux thread
// ids of each pool's workers and of those parked now. The pools are process-wide, and so is the
// state: the first call learns them (inter_pool_size is the inter-op pool's size as TensorFlow was
// configured, since the runner does not tell it; a census corrects it downwards). Call it eagerly
// from Python, between steps (mall.tensorflow does): from inside a tf.function it would run on an
// inter-op worker and wait on itself. Everything parked is released at process exit.
#include <unistd.h>

#include <mutex>
#include <stdexcept>
#include <vector>

#include <mall/tf/pool_parking.hpp>
#include <mall/tf/runner_pool.hpp>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/platform/threadpool.h"
#include "tensorflow/core/util/work_sharder.h"

namespace {

using tensorflow::OpKernelContext;

REGISTER_OP("MallPoolThreads")
    .Input("intra: int32")
    .Input("inter: int32")
    .Input("inter_pool_size: int32")
    .Output("counts: int32")
    .Output("intra_workers: int32")
    .Output("intra_parked: int32")
    .Output("inter_workers: int32")
    .Output("inter_parked: int32")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->Vector(4));
      for (int i = 1; i <= 4; ++i) c->set_output(i, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Parks or releases workers of TensorFlow's own intra-op and inter-op pools (mall: park, don't replace).

On a change it also sets TensorFlow's per-thread max parallelism (SetPerThreadMaxParallelism: the
pieces Shard() and the Eigen device cut a kernel into) to the running intra-op count, on the calling
thread and every running worker of both pools. The op has no attrs.

intra: running intra-op workers wanted, clamped to 1..the pool's size (0: unchanged).
inter: running inter-op workers wanted, clamped to 1..the pool's size (0: unchanged).
inter_pool_size: the inter-op pool's size as configured, read once: at the first call where it is above 0.
counts: [intra running, intra size, inter running, inter size] (inter: 0, 0 without an inter-op pool).
intra_workers: the Linux thread ids of the intra-op pool's workers.
intra_parked: the Linux thread ids of the intra-op workers parked now.
inter_workers: the Linux thread ids of the inter-op pool's workers (empty without one).
inter_parked: the Linux thread ids of the inter-op workers parked now (empty without one).
)doc");

// The process's parkings (TensorFlow's pools are process-wide and never destroyed): leaked, so
// nothing is torn down at exit under a parked worker; pool_parking.hpp releases them at exit.
struct Pools {
  std::mutex mutex;
  mall::tf::PoolParking* intra = nullptr;
  mall::tf::PoolParking* inter = nullptr;
  bool inter_tried = false;

  static Pools& instance() {
    static Pools* pools = new Pools;
    return *pools;
  }
};

// Sets TensorFlow's per-thread max parallelism (tensorflow::SetPerThreadMaxParallelism, which
// Shard() and the Eigen device a kernel gets read to decide how many pieces to cut it into) to
// `parallelism` on every running worker of `pool`: each thread that may run a kernel.
void split_by(mall::tf::PoolParking* pool, int parallelism) {
  if (pool == nullptr) return;
  pool->run_on_each_running_worker([parallelism] { tensorflow::SetPerThreadMaxParallelism(parallelism); });
}

void output_tids(OpKernelContext* context, int index, const std::vector<pid_t>& tids) {
  tensorflow::Tensor* out = nullptr;
  OP_REQUIRES_OK(context, context->allocate_output(index, tensorflow::TensorShape({static_cast<int64_t>(tids.size())}),
                                                   &out));
  auto flat = out->flat<int32_t>();
  for (size_t i = 0; i < tids.size(); ++i) flat(static_cast<int64_t>(i)) = static_cast<int32_t>(tids[i]);
}

class MallPoolThreadsOp : public tensorflow::OpKernel {
 public:
  explicit MallPoolThreadsOp(tensorflow::OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const int intra = context->input(0).scalar<int32_t>()();
    const int inter = context->input(1).scalar<int32_t>()();
    const int inter_pool_size = context->input(2).scalar<int32_t>()();
    OP_REQUIRES(context, intra >= 0 && inter >= 0 && inter_pool_size >= 0,
                absl::InvalidArgumentError("MallPoolThreads: counts must be >= 0 (0: unchanged)"));
    Pools& pools = Pools::instance();
    std::lock_guard lock(pools.mutex);
    try {
      if (pools.intra == nullptr) {
        const auto* workers = context->device()->tensorflow_cpu_worker_threads();
        OP_REQUIRES(context, workers != nullptr && workers->workers != nullptr,
                    absl::FailedPreconditionError("MallPoolThreads: this device has no intra-op pool (not a CPU device)"));
        pools.intra = new mall::tf::PoolParking(*workers->workers->AsEigenThreadPool());
      }
      if (!pools.inter_tried && context->runner() != nullptr && inter_pool_size > 0) {
        pools.inter_tried = true;
        auto* runner_pool = new mall::tf::RunnerPool(*context->runner(), inter_pool_size);  // leaked with it
        mall::tf::PoolParking::Options options;
        options.size_by_census = true;  // the runner does not tell its pool's size
        pools.inter = new mall::tf::PoolParking(*runner_pool, options);
      }
    } catch (const std::invalid_argument&) {
      context->CtxFailure(absl::AlreadyExistsError(
          "MallPoolThreads: TensorFlow's pools are already parked by another mall parking in this process"));
      return;
    }
    const bool changed = intra > 0 || inter > 0;
    if (intra > 0) pools.intra->resize(intra);
    if (inter > 0 && pools.inter != nullptr) pools.inter->resize(inter);
    if (changed) {
      const int parallelism = pools.intra->active_threads();
      tensorflow::SetPerThreadMaxParallelism(parallelism);  // eager kernels run on this thread
      split_by(pools.intra, parallelism);
      split_by(pools.inter, parallelism);
    }

    tensorflow::Tensor* counts = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, tensorflow::TensorShape({4}), &counts));
    auto c = counts->flat<int32_t>();
    c(0) = pools.intra->active_threads();
    c(1) = pools.intra->max_threads();
    c(2) = pools.inter != nullptr ? pools.inter->active_threads() : 0;
    c(3) = pools.inter != nullptr ? pools.inter->max_threads() : 0;
    output_tids(context, 1, pools.intra->worker_tids());
    output_tids(context, 2, pools.intra->parked_tids());
    output_tids(context, 3, pools.inter != nullptr ? pools.inter->worker_tids() : std::vector<pid_t>{});
    output_tids(context, 4, pools.inter != nullptr ? pools.inter->parked_tids() : std::vector<pid_t>{});
  }
};

REGISTER_KERNEL_BUILDER(Name("MallPoolThreads").Device(tensorflow::DEVICE_CPU), MallPoolThreadsOp);

}  // namespace
