// SPDX-License-Identifier: BSD-3-Clause
// pool_parking.hpp — park, don't replace: resizes a framework's OWN thread pool (any
// Eigen::ThreadPoolInterface: Eigen's ThreadPool, TensorFlow's intra-op and inter-op pools) by
// parking some of its workers inside tasks that block until released, and releasing them to grow.
//
// Contract. PoolParking(pool) controls the pool's NumThreads() workers (its size N, read once).
// resize(A) leaves A workers (clamped to 1..N) running the pool's work and parks N-A: it schedules
// N-A "parker" tasks, each of which blocks the worker that runs it on a condition variable (no cpu,
// no task), and returns once they are parked (or released, to grow), so a caller that acks after
// resize() runs no more threads than it was given. The other workers steal whatever lands in the
// parked workers' queues. Unparked (A == N) nothing of mall runs: the pool is exactly the
// framework's. Which workers park is the pool's choice (whichever ran a parker).
//
// The four hazards, each handled here (tests/unit/tf_test_pool_parking.cpp pins each one):
// 1. The last worker is never parked: A is clamped to >= 1, and at most N-1 parkers exist.
// 2. A nested parallel region (a task that itself runs a parallelFor and waits for it) with one
//    active worker: its children may sit in the queue of the blocked worker, where no active worker
//    is free to take them. A stall guard (one thread per PoolParking, asleep while nothing is
//    parked) schedules a tiny probe task every `stall_after`; a probe that no worker took for a
//    whole period while no running worker is on a cpu (/proc state R) and they used under 5% of a
//    cpu meanwhile (schedstat) means the pool is stuck, so one parked worker is lent back until a
//    probe runs again, then re-parked. (A busy pool gets no loan: its workers take the probe when
//    their own queues are done.) Where the framework re-reads a thread count (Eigen's ThreadPoolDevice
//    built with active_threads() each step) a one-worker region runs inline and never stalls.
// 3. Process exit with workers parked: every PoolParking's state is registered with an atexit
//    handler that releases all parkers (a static pool's destructor joins its workers), and the
//    state the parkers wait on is shared with them, so it never dies under a waiter.
// 4. Destroying a pool with parked workers would join blocked threads: ~PoolParking releases every
//    parker and waits until none blocks. Destroy the PoolParking before its pool (declare it after).
//
// Threads. resize(), set_affinity() and the queries may be called from any thread outside the
// pool; resize() from a worker of the pool itself does not wait (it would wait on itself).
// Header-only; needs Eigen's ThreadPoolInterface and pthreads, nothing of libmall. (std::min and
// std::max are parenthesised: it also builds under Eigen's test harness, which defines min/max.)
#pragma once

#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cerrno>
#include <stdexcept>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <unsupported/Eigen/CXX11/ThreadPool>

namespace mall::tf {

// What the libmall glue (mall_pool_glue.hpp) drives: a pool whose running thread count follows an
// allocation, whatever framework owns the pool.
class ResizablePool {
 public:
  virtual ~ResizablePool() = default;
  // Sets the running worker count (clamped to 1..max_threads()); returns the count applied.
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

namespace detail {

// Shared by the PoolParking, its parker tasks and its stall guard: it lives as long as any of them
// (a parker still queued when its PoolParking is gone finds it and returns at once).
struct ParkingState {
  std::mutex mutex;                    // guards everything but probe_pending
  std::condition_variable released;    // parkers wait here (notified only to release or shut down)
  std::condition_variable changed;     // resize() and ~PoolParking wait here for parkers to settle
  std::condition_variable guard_wake;  // the stall guard sleeps here
  int pool_threads = 1;
  int wanted_parked = 0;  // what resize() asked for
  int lent = 0;           // parked workers the stall guard gave back for now (hazard 2)
  int parked = 0;         // workers blocked in a parker now
  int queued = 0;         // parkers scheduled that have not started yet
  int scheduling = 0;     // threads inside pool.Schedule() for this state right now
  bool shut = false;      // released for good: parkers return, nothing is scheduled any more
  bool guard_running = false;  // the stall guard (a detached thread) has not left its loop yet
  const void* pool = nullptr;  // the pool it controls: one PoolParking per pool (the registry checks)
  std::chrono::steady_clock::time_point probe_sent{};  // when the pending probe was scheduled
  uint64_t probe_sent_cpu_ns = 0;  // the running workers' cpu time then (UINT64_MAX: unknown)
  std::chrono::steady_clock::time_point lent_since{};  // when the guard first lent a worker
  uint64_t parks = 0;     // parkers that blocked a worker, since the start
  uint64_t loans = 0;     // times the stall guard lent a parked worker back
  std::vector<pid_t> parked_tids;
  std::atomic<bool> probe_pending{false};

  int parked_target() const { return (std::max)(0, wanted_parked - lent); }
};

// Set on a thread while it calls the pool's Schedule() for a ParkingState: Eigen runs a task on
// the calling thread when the chosen queue is full (1024 tasks), and a parker, census or rendezvous
// task that finds itself there must return at once instead of blocking the scheduler.
inline const void*& scheduling_for() {
  static thread_local const void* state = nullptr;
  return state;
}

// Schedules fn on pool while marking this thread as scheduling for `owner`.
inline void schedule_marked(Eigen::ThreadPoolInterface& pool, const void* owner, std::function<void()> fn) {
  const void* previous = scheduling_for();
  scheduling_for() = owner;
  pool.Schedule(std::move(fn));
  scheduling_for() = previous;
}

// Every live state, for the release at exit. Never destroyed (an exit handler may run after
// static destructors), so it cannot vanish under the handler.
struct ParkingRegistry {
  std::mutex mutex;
  std::vector<std::weak_ptr<ParkingState>> states;

  static ParkingRegistry& instance() {
    static ParkingRegistry* registry = new ParkingRegistry;  // leaked on purpose
    return *registry;
  }

  // Releases every parked worker of every live state (hazard 3). Never waits on a worker; waits at
  // most 200 ms for a stall guard to leave a Schedule() call (a static pool's destructor runs next).
  static void release_all_at_exit() {
    ParkingRegistry& registry = instance();
    std::lock_guard lock(registry.mutex);
    for (auto& weak : registry.states) {
      if (auto state = weak.lock()) {
        std::unique_lock state_lock(state->mutex);
        state->shut = true;
        state->released.notify_all();
        state->guard_wake.notify_all();
        state->changed.notify_all();
        state->changed.wait_for(state_lock, std::chrono::milliseconds(200), [&] { return state->scheduling == 0; });
      }
    }
  }

  // Adds state; false when a live state already controls the same pool (two parkings on one
  // pool could park every worker between them).
  bool add(const std::shared_ptr<ParkingState>& state) {
    std::lock_guard lock(mutex);
    states.erase(std::remove_if(states.begin(), states.end(), [](auto& w) { return w.expired(); }),
                 states.end());
    for (auto& weak : states) {
      // A state outlives its PoolParking while a queued task holds it; once shut it controls
      // nothing (and a new pool may sit at the old one's address).
      if (auto other = weak.lock(); other && other->pool == state->pool) {
        std::lock_guard other_lock(other->mutex);
        if (!other->shut) return false;
      }
    }
    states.push_back(state);
    // Registered at every PoolParking's birth, so the handler runs before the destructor of any
    // static pool made before that PoolParking (exit runs handlers and static destructors in
    // reverse order of registration).
    (void)std::atexit(&ParkingRegistry::release_all_at_exit);
    return true;
  }
};

// The parker: blocks the worker that runs it until it is released (or not needed any more).
inline void park_this_worker(const std::shared_ptr<ParkingState>& state) {
  std::unique_lock lock(state->mutex);
  --state->queued;
  // Not needed (any more), or run inline by the thread that scheduled it (not a worker to park).
  if (state->shut || state->parked >= state->parked_target() || scheduling_for() == state.get()) {
    state->changed.notify_all();
    return;  // not needed (any more): the worker goes on with the pool's work
  }
  ++state->parked;
  ++state->parks;
  const pid_t tid = static_cast<pid_t>(syscall(SYS_gettid));
  state->parked_tids.push_back(tid);
  state->changed.notify_all();
  state->released.wait(lock, [&] { return state->shut || state->parked > state->parked_target(); });
  --state->parked;
  auto& tids = state->parked_tids;
  tids.erase(std::find(tids.begin(), tids.end(), tid));
  state->changed.notify_all();
}

}  // namespace detail

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

  // Controls pool's workers; pool must outlive this object. Learns the workers' thread handles
  // (for set_affinity) by running one short task on each; returns after that, or after 2 s.
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
    learn_workers();
    if (options_.size_by_census && !worker_tids_.empty() &&
        static_cast<int>(worker_tids_.size()) < state_->pool_threads) {
      std::lock_guard lock(state_->mutex);
      state_->pool_threads = static_cast<int>(worker_tids_.size());
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

  // Leaves active_count workers (clamped to 1..max_threads()) running and parks the rest; returns
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
    if (missing > 0) schedule_parkers(lock, missing);
    if (target > 0) start_guard(lock);
    // Two-phase: return only when the pool runs no more workers than asked (or the bound passed).
    // From a worker of this pool: do not wait, the parker may be queued behind this very task.
    if (pool_.CurrentThreadId() < 0) {
      state_->changed.wait_for(lock, options_.settle_timeout, [&] {
        return state_->shut || state_->parked == state_->parked_target();
      });
    }
    return active;
  }

  // Runs fn once on each running (not parked) worker, all at once (each waits for the others, so
  // no worker runs it twice), e.g. to set a framework's thread-local setting on every thread that
  // may run its kernels. Returns how many ran it; waits at most `bound` for busy workers (those
  // run it later, once free, unless the bound passed). From a worker of the pool: does nothing.
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

  // Pins every worker the constructor learned (running or parked) to cpus.
  int set_affinity(const cpu_set_t& cpus) override {
    std::lock_guard lock(workers_mutex_);
    int first_error = 0;
    for (pthread_t handle : worker_handles_) {
      const int rc = pthread_setaffinity_np(handle, sizeof(cpu_set_t), &cpus);
      if (rc != 0 && first_error == 0) first_error = rc;
    }
    return first_error;
  }

  int max_threads() const override { return state_->pool_threads; }
  // The running worker count resize() last set: what a framework should size its work by (e.g.
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
  // Linux thread ids of the workers the constructor learned (all N unless the pool was busy).
  std::vector<pid_t> worker_tids() const {
    std::lock_guard lock(workers_mutex_);
    return worker_tids_;
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
  // Schedules n parkers, outside the lock: a pool whose queue is full runs a task inline, and the
  // parker takes the lock. `scheduling` tells ~PoolParking to wait until we are out of Schedule().
  void schedule_parkers(std::unique_lock<std::mutex>& lock, int n) {
    state_->queued += n;
    ++state_->scheduling;
    lock.unlock();
    for (int i = 0; i < n; ++i) {
      detail::schedule_marked(pool_, state_.get(), [state = state_] { detail::park_this_worker(state); });
    }
    lock.lock();
    --state_->scheduling;
    state_->changed.notify_all();
  }

  void start_guard(std::unique_lock<std::mutex>& /*held*/) {
    if (options_.stall_after.count() <= 0) return;
    if (guard_started_) {
      state_->guard_wake.notify_all();
      return;
    }
    guard_started_ = true;
    try {
      // Detached, so a PoolParking that is never destroyed (a framework's global pool) leaves no
      // unjoined thread at exit; ~PoolParking waits until it has left its loop instead.
      std::thread([this, keep_alive = state_] { guard_loop(); }).detach();
      state_->guard_running = true;
    } catch (...) {
      // No thread for the guard: parking still works; only hazard 2's recovery is missing.
    }
  }

  // Hazard 2. While anything is parked: a probe task is kept in the pool; one that stays untaken
  // for a whole stall_after while every running worker is off its cpu means the pool is stuck, and
  // one more parked worker is lent back. Loans are held at least 4 periods (a nested region needs
  // the help for as long as it runs) and taken back once a probe runs promptly again.
  void guard_loop() {
    using Clock = std::chrono::steady_clock;
    std::unique_lock lock(state_->mutex);
    while (!state_->shut) {
      if (state_->wanted_parked == 0) {
        state_->guard_wake.wait(lock);
        continue;
      }
      state_->guard_wake.wait_for(lock, options_.stall_after);
      if (state_->shut || state_->wanted_parked == 0) continue;
      // A parker that found itself run inline by its scheduler (a full queue) returned: send it again.
      if (const int missing = state_->parked_target() - (state_->parked + state_->queued); missing > 0) {
        schedule_parkers(lock, missing);
        if (state_->shut) break;
      }
      const auto now = Clock::now();
      if (state_->probe_pending.load(std::memory_order_acquire)) {
        const bool untaken_for_a_period = now - state_->probe_sent >= options_.stall_after;
        const bool parkers_settled = state_->parked >= state_->parked_target() && state_->parked > 0;
        if (untaken_for_a_period && parkers_settled && state_->lent < state_->wanted_parked &&
            running_workers_stalled(now)) {
          if (state_->lent == 0) state_->lent_since = now;
          ++state_->lent;
          ++state_->loans;
          state_->released.notify_all();
          state_->changed.notify_all();
        }
        continue;
      }
      if (state_->lent > 0) {
        if (now - state_->lent_since < 4 * options_.stall_after) {
          send_probe(lock);
          continue;
        }
        state_->lent = 0;
        state_->changed.notify_all();
        const int missing = state_->parked_target() - (state_->parked + state_->queued);
        if (missing > 0) schedule_parkers(lock, missing);
        if (state_->shut) break;
      }
      send_probe(lock);
    }
    state_->guard_running = false;
    state_->changed.notify_all();
  }

  // Schedules a probe (it takes no lock: run inline by a full queue, it cannot deadlock).
  void send_probe(std::unique_lock<std::mutex>& lock) {
    state_->probe_pending.store(true, std::memory_order_release);
    state_->probe_sent = std::chrono::steady_clock::now();
    state_->probe_sent_cpu_ns = running_workers_cpu_ns();
    ++state_->scheduling;
    lock.unlock();
    pool_.Schedule([state = state_] { state->probe_pending.store(false, std::memory_order_release); });
    lock.lock();
    --state_->scheduling;
    state_->changed.notify_all();
  }

  // Stuck, not busy: no running worker is runnable now (state R) AND together they ran under 5%
  // of a cpu since the probe was sent (a worker that waits for other work but goes on with its
  // own, as a TensorFlow inter-op worker waiting for intra-op shards does, keeps using cpu).
  // Anything unknown (a census cut short, an unreadable /proc file) counts as progress: the
  // guard never lends on a guess. Called by the guard with the state's lock held.
  bool running_workers_stalled(std::chrono::steady_clock::time_point now) const {
    if (a_running_worker_is_on_cpu()) return false;
    const uint64_t cpu_now = running_workers_cpu_ns();
    if (cpu_now == UINT64_MAX || state_->probe_sent_cpu_ns == UINT64_MAX || cpu_now < state_->probe_sent_cpu_ns)
      return false;
    const auto waited = std::chrono::duration_cast<std::chrono::nanoseconds>(now - state_->probe_sent).count();
    return (cpu_now - state_->probe_sent_cpu_ns) * 20 < static_cast<uint64_t>(waited);
  }

  // Calls read(file) on /proc/self/task/TID/<name> of each worker that is not parked, until it
  // returns false; false when the workers are not all known (a census cut short) or a file cannot
  // be opened for another reason than the thread being gone. Called with the state's lock held.
  template <typename Read>
  bool read_running_workers(const char* name, Read read) const {
    std::lock_guard workers_lock(workers_mutex_);
    if (static_cast<int>(worker_tids_.size()) < state_->pool_threads) return false;
    const auto& parked = state_->parked_tids;
    for (pid_t tid : worker_tids_) {
      if (std::find(parked.begin(), parked.end(), tid) != parked.end()) continue;
      char path[64];
      std::snprintf(path, sizeof path, "/proc/self/task/%d/%s", static_cast<int>(tid), name);
      std::FILE* file = std::fopen(path, "re");
      if (file == nullptr) {
        if (errno == ENOENT) continue;  // the thread is gone
        return false;
      }
      const bool go_on = read(file);
      std::fclose(file);
      if (!go_on) break;
    }
    return true;
  }

  // The cpu time (ns, schedstat) the workers not parked have used so far; UINT64_MAX when it
  // cannot be known.
  uint64_t running_workers_cpu_ns() const {
    uint64_t total = 0;
    bool readable = true;
    const bool known = read_running_workers("schedstat", [&](std::FILE* file) {
      unsigned long long ns = 0;
      readable = std::fscanf(file, "%llu", &ns) == 1;
      total += ns;
      return readable;
    });
    return known && readable ? total : UINT64_MAX;
  }

  // Whether a worker that is not parked is runnable (state R in /proc): the pool is progressing.
  // Unknown workers count as running, so they never cause a loan.
  bool a_running_worker_is_on_cpu() const {
    bool runnable = false;
    const bool known = read_running_workers("stat", [&](std::FILE* file) {
      char text[512];
      const size_t length = std::fread(text, 1, sizeof text - 1, file);
      text[length] = '\0';
      const char* close = std::strrchr(text, ')');  // the name may hold spaces and parentheses
      runnable = close != nullptr && close[1] == ' ' && close[2] == 'R';
      return !runnable;
    });
    return runnable || !known;
  }

  // Runs one task on each worker at once (each waits for the others), recording its thread.
  void learn_workers() {
    if (pool_.CurrentThreadId() >= 0) return;  // inside the pool: would wait on itself
    struct Census {
      std::mutex mutex;
      std::condition_variable all_here;
      int expected = 0, arrived = 0;
      bool gave_up = false;
      std::vector<pthread_t> handles;
      std::vector<pid_t> tids;
    };
    auto census = std::make_shared<Census>();
    census->expected = state_->pool_threads;
    for (int i = 0; i < census->expected; ++i) {
      detail::schedule_marked(pool_, census.get(), [census] {
        if (detail::scheduling_for() == census.get()) return;  // run inline by the scheduler
        std::unique_lock lock(census->mutex);
        if (census->gave_up) return;
        census->handles.push_back(pthread_self());
        census->tids.push_back(static_cast<pid_t>(syscall(SYS_gettid)));
        ++census->arrived;
        census->all_here.notify_all();
        census->all_here.wait_for(lock, std::chrono::seconds(3),
                                  [&] { return census->gave_up || census->arrived == census->expected; });
      });
    }
    std::unique_lock lock(census->mutex);
    census->all_here.wait_for(lock, std::chrono::seconds(2), [&] { return census->arrived == census->expected; });
    census->gave_up = true;  // late census tasks return at once
    census->all_here.notify_all();
    std::lock_guard workers_lock(workers_mutex_);
    worker_handles_ = census->handles;
    worker_tids_ = census->tids;
  }

  Eigen::ThreadPoolInterface& pool_;
  const Options options_;
  std::shared_ptr<detail::ParkingState> state_;
  std::atomic<int> active_{0};
  bool guard_started_ = false;  // under state_->mutex
  mutable std::mutex workers_mutex_;
  std::vector<pthread_t> worker_handles_;
  std::vector<pid_t> worker_tids_;
};

}  // namespace mall::tf
