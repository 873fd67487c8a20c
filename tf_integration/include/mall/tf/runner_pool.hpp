// SPDX-License-Identifier: BSD-3-Clause
// runner_pool.hpp — a pool TensorFlow only lets us reach through a runner (the
// std::function<void(std::function<void()>)> an OpKernelContext's runner() gives a kernel, which
// schedules onto the inter-op pool the op runs under), seen as an Eigen::ThreadPoolInterface so
// that PoolParking can park its workers. Header-only; needs only Eigen's ThreadPoolInterface.
#pragma once

#include <algorithm>
#include <functional>
#include <utility>

#include <unsupported/Eigen/CXX11/ThreadPool>

namespace mall::tf {

// What an OpKernelContext's runner() is: it runs a closure on the op's inter-op pool.
using InterOpRunner = std::function<void(std::function<void()>)>;

// TensorFlow's inter-op pool as an Eigen::ThreadPoolInterface, through a runner TensorFlow gave an
// op: Schedule() runs the closure on that pool. The runner does not tell the pool's size or which
// thread is a worker, so the size is the caller's (TensorFlow's inter_op_parallelism_threads) and
// CurrentThreadId() says -1.
class RunnerPool : public Eigen::ThreadPoolInterface {
 public:
  RunnerPool(InterOpRunner runner, int threads) : runner_(std::move(runner)), threads_(std::max(1, threads)) {}
  void Schedule(std::function<void()> fn) override { runner_(std::move(fn)); }
  void ScheduleWithHint(std::function<void()> fn, int, int) override { runner_(std::move(fn)); }
  void Cancel() override {}
  int NumThreads() const override { return threads_; }
  int CurrentThreadId() const override { return -1; }

 private:
  InterOpRunner runner_;
  int threads_;
};

}  // namespace mall::tf
