// SPDX-License-Identifier: BSD-3-Clause
// pool_parking.hpp — park, don't replace: resizes a framework's OWN thread pool (any
// Eigen::ThreadPoolInterface: Eigen's ThreadPool, TensorFlow's intra-op and inter-op pools) by
// parking some of its workers inside tasks that block until released, and releasing them to grow.
//
// Words: a worker is "active" when it is not parked (it runs the pool's work or waits for it);
// "runnable" and "on a cpu" are a thread's scheduler state.
//
// Contract. PoolParking(pool) controls the pool's N workers: N is its NumThreads(), read once by
// the constructor, which lowers it to the workers its census found when Options::size_by_census is
// set and the census found fewer. resize(A) leaves A workers (clamped to 1..N) active and parks
// N-A: it schedules N-A "parker" tasks, each of which blocks the worker that runs it on a
// condition variable (no cpu, no task), and returns once they are parked (or released, to grow), so
// a caller that acks after resize() runs no more threads than it was given. The active workers
// steal whatever lands in the parked workers' queues. Unparked (A == N) nothing of mall runs: the
// pool is exactly the framework's. Which workers park is the pool's choice (whichever ran a parker).
//
// The four hazards, each handled here (tests/unit/tf_test_pool_parking.cpp pins each one):
// 1. The last worker is never parked: A is clamped to >= 1, and at most N-1 parkers exist.
// 2. A nested parallel region (a task that itself runs a parallelFor sized for the whole pool and
//    waits for it) with one active worker: Eigen queues the children a worker schedules on that
//    worker's own queue, so they wait behind the very worker that waits for them, and the parked
//    workers take nothing. A stall guard (one thread per PoolParking, asleep while resize() asks
//    for no parking) keeps a tiny probe task in the pool, sending a new one each `stall_after`
//    once the last was taken. A probe untaken for a whole period while the parkers are settled, no
//    active worker is runnable (/proc state R) and the active workers used under 5% of a cpu since
//    it was sent (schedstat) means the pool is stuck: the guard lends one parked worker back, and
//    one more for each further period the same probe stays untaken with the workers stalled. It
//    takes every loan back at once when it finds a probe taken at least 4 periods after the first
//    loan (a nested region needs the help for as long as it runs); a resize() takes them back too.
//    (A busy pool gets no loan: its workers are runnable or use cpu, and take the probe when their
//    own queues are done.) Where the framework re-reads a thread count (Eigen's ThreadPoolDevice
//    built with active_threads() each step) a one-worker region runs inline and never stalls.
// 3. Process exit with workers parked: every PoolParking's state is registered with an atexit
//    handler that releases all parkers (a static pool's destructor joins its workers), and the
//    state the parkers wait on is shared with them, so it never dies under a waiter.
// 4. Destroying a pool with parked workers would join blocked threads: ~PoolParking releases every
//    parker and waits until none blocks. Destroy the PoolParking before its pool (declare it after).
//
// Threads. resize(), set_affinity() and the queries may be called from any thread outside the
// pool; resize() from a worker of the pool itself does not wait (it would wait on itself).
// Header-only, and nothing of libmall: the TensorFlow op library (python_ops/mall_pool_ops.cpp)
// parks TensorFlow's pools with it and links no libmall, only libtensorflow_framework. Needs
// Eigen's ThreadPoolInterface and pthreads. The machinery (the parker, the release at exit, the
// census, the /proc readers, the stall guard) is in detail/pool_parking_detail.hpp. (std::min and
// std::max are parenthesised: it also builds under Eigen's test harness, which defines min/max.)
#pragma once

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

#include <unsupported/Eigen/CXX11/ThreadPool>

#include <mall/tf/detail/pool_parking_detail.hpp>

namespace mall::tf {

// What the libmall glue (mall_pool_glue.hpp) drives: a pool whose active thread count follows an
// allocation, whatever framework owns the pool.
class ResizablePool {
 public:
  virtual ~ResizablePool() = default;
  // Sets the active worker count (clamped to 1..max_threads()); returns the count applied.
  virtual int resize(int active_count) = 0;
  // Pins every worker to cpus; 0 or the errno of the first worker that could not be pinned.
  virtual int set_affinity(const cpu_set_t& cpus) = 0;
  virtual int max_threads() const = 0;
  virtual int active_threads() const = 0;

 protected:
  ResizablePool() = default;
  ResizablePool(const ResizablePool&) = default;
  ResizablePool& operator=(const ResizablePool&) = default;
};

class PoolParking : public ResizablePool {
 public:
  struct Options {
    // How long a probe may go untaken while workers are parked before a parked worker is lent
    // back (hazard 2). Also the guard's wake-up period while anything is parked. Zero or less
    // turns the guard off (only to show the hazard in a test).
    std::chrono::milliseconds stall_after{50};
    // The longest resize() waits for parkers to block (a parker queued behind a long task runs
    // when that task ends; the wait is bounded so a step boundary never hangs).
    std::chrono::milliseconds settle_timeout{5000};
    // The pool's NumThreads() is only a guess (a pool seen through a runner that does not tell its
    // size): the size is what the census finds, when it finds fewer workers. Ask this only of a
    // pool that is idle when the PoolParking is made.
    bool size_by_census = false;
  };

  // Controls pool's workers; pool must outlive this object: declare the PoolParking after its
  // pool, so that it is destroyed first (hazard 4). Learns the workers' thread handles (for
  // set_affinity) by running one short task on each (the census); returns after that, or after 2 s.
  // Throws std::invalid_argument when another live PoolParking controls the same pool (between
  // them they could park every worker), std::bad_alloc when memory runs out.
  explicit PoolParking(Eigen::ThreadPoolInterface& pool) : PoolParking(pool, Options{}) {}
  PoolParking(Eigen::ThreadPoolInterface& pool, Options options)
      : pool_(pool), options_(options), state_(std::make_shared<detail::ParkingState>()) {
    state_->pool_threads = (std::max)(1, pool.NumThreads());
    state_->pool = &pool;
    active_.store(state_->pool_threads, std::memory_order_release);
    if (!detail::ParkingRegistry::instance().add(state_)) {
      throw std::invalid_argument("mall: another PoolParking already controls this pool");
    }
    detail::learn_workers(pool_, state_->pool_threads, workers_);
    if (options_.size_by_census && !workers_.tids.empty() &&
        static_cast<int>(workers_.tids.size()) < state_->pool_threads) {
      std::lock_guard lock(state_->mutex);
      state_->pool_threads = static_cast<int>(workers_.tids.size());
      active_.store(state_->pool_threads, std::memory_order_release);
    }
  }

  PoolParking(const PoolParking&) = delete;
  PoolParking& operator=(const PoolParking&) = delete;

  // Releases every parked worker and waits until none is blocked and nothing of ours is being
  // scheduled, so the pool can then be destroyed (hazard 4). Must not run on a worker of the pool.
  ~PoolParking() override {
    std::unique_lock lock(state_->mutex);
    state_->shut = true;
    state_->released.notify_all();
    state_->guard_wake.notify_all();
    state_->changed.wait(lock, [&] {
      return state_->parked == 0 && state_->scheduling == 0 && !state_->guard_running;
    });
  }

  // Leaves active_count workers (clamped to 1..max_threads()) active and parks the rest; returns
  // the count applied, once the parked workers are blocked (or released), bounded by
  // Options::settle_timeout.
  int resize(int active_count) override {
    const int threads = state_->pool_threads;
    const int active = (std::clamp)(active_count, 1, threads);
    std::unique_lock lock(state_->mutex);
    if (state_->shut) return threads;
    state_->wanted_parked = threads - active;
    state_->lent = 0;  // a resize re-parks anything the guard lent
    active_.store(active, std::memory_order_release);
    const int target = state_->parked_target();
    if (state_->parked > target) state_->released.notify_all();
    const int missing = target - (state_->parked + state_->queued);
    if (missing > 0) detail::schedule_parkers(pool_, state_, lock, missing);
    if (target > 0) guard_.start(pool_, state_, workers_, options_.stall_after);
    // Two-phase: return only when the pool runs no more workers than asked (or the bound passed).
    // From a worker of this pool: do not wait, the parker may be queued behind this very task.
    if (pool_.CurrentThreadId() < 0) {
      state_->changed.wait_for(lock, options_.settle_timeout, [&] {
        return state_->shut || state_->parked == state_->parked_target();
      });
    }
    return active;
  }

  // Runs fn once on each active worker (the name's "running" means not parked), all at once (each
  // waits for the others, so no worker runs it twice), e.g. to set a framework's thread-local
  // setting on every thread that may run its kernels. Returns how many ran it; waits at most
  // `bound` for busy workers (those run it later, once free, unless the bound passed). From a
  // worker of the pool: does nothing.
  int run_on_each_running_worker(const std::function<void()>& fn,
                                 std::chrono::milliseconds bound = std::chrono::milliseconds(1000)) {
    if (pool_.CurrentThreadId() >= 0) return 0;
    struct Rendezvous {
      std::mutex mutex;
      std::condition_variable all_here;
      int expected = 0, arrived = 0;
      bool gave_up = false;
      std::function<void()> fn;
    };
    auto meeting = std::make_shared<Rendezvous>();
    meeting->expected = active_threads();
    meeting->fn = fn;
    for (int i = 0; i < meeting->expected; ++i) {
      detail::schedule_marked(pool_, meeting.get(), [meeting, bound] {
        if (detail::scheduling_for() == meeting.get()) return;  // run inline by the scheduler
        std::unique_lock lock(meeting->mutex);
        if (meeting->gave_up) return;
        meeting->fn();
        ++meeting->arrived;
        meeting->all_here.notify_all();
        meeting->all_here.wait_for(lock, bound, [&] { return meeting->gave_up || meeting->arrived == meeting->expected; });
      });
    }
    std::unique_lock lock(meeting->mutex);
    meeting->all_here.wait_for(lock, bound, [&] { return meeting->arrived == meeting->expected; });
    meeting->gave_up = true;
    meeting->all_here.notify_all();
    return meeting->arrived;
  }

  // Pins every worker the census learned (active or parked) to cpus.
  int set_affinity(const cpu_set_t& cpus) override {
    std::lock_guard lock(workers_.mutex);
    int first_error = 0;
    for (pthread_t handle : workers_.handles) {
      const int rc = pthread_setaffinity_np(handle, sizeof(cpu_set_t), &cpus);
      if (rc != 0 && first_error == 0) first_error = rc;
    }
    return first_error;
  }

  int max_threads() const override { return state_->pool_threads; }
  // The active worker count resize() last set: what a framework should size its work by (e.g.
  // Eigen::ThreadPoolDevice device(&pool, parking.active_threads())).
  int active_threads() const override { return active_.load(std::memory_order_acquire); }

  // Workers blocked in a parker right now, and their Linux thread ids.
  int parked_now() const {
    std::lock_guard lock(state_->mutex);
    return state_->parked;
  }
  std::vector<pid_t> parked_tids() const {
    std::lock_guard lock(state_->mutex);
    return state_->parked_tids;
  }
  // Linux thread ids of the workers the census learned (all N unless the pool was busy).
  std::vector<pid_t> worker_tids() const {
    std::lock_guard lock(workers_.mutex);
    return workers_.tids;
  }
  // Parkers that blocked a worker since the start, and loans the stall guard made (hazard 2).
  uint64_t parks() const {
    std::lock_guard lock(state_->mutex);
    return state_->parks;
  }
  uint64_t loans() const {
    std::lock_guard lock(state_->mutex);
    return state_->loans;
  }

 private:
  Eigen::ThreadPoolInterface& pool_;
  const Options options_;
  std::shared_ptr<detail::ParkingState> state_;
  std::atomic<int> active_{0};
  detail::StallGuard guard_;  // its started flag is under state_->mutex
  detail::Workers workers_;   // what the census found
};

}  // namespace mall::tf
