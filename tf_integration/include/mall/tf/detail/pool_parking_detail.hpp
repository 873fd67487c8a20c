// SPDX-License-Identifier: BSD-3-Clause
// pool_parking_detail.hpp — the machinery behind mall::tf::PoolParking (mall/tf/pool_parking.hpp
// holds the contract and includes this file): the state the parker tasks share, the parker, the
// release at exit (hazard 3), the census of the pool's workers, the /proc readers and the stall
// guard with its probe (hazard 2). Nothing here is API; names and layout may change.
// Words: a worker is "active" when it is not parked (it runs the pool's work or waits for it);
// "runnable" and "on a cpu" are a thread's scheduler state (/proc state R), whatever the pool.
// Header-only for the reason pool_parking.hpp gives; std::min and std::max are parenthesised, as there.
#pragma once

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <unsupported/Eigen/CXX11/ThreadPool>

namespace mall::tf::detail {

// Shared by the PoolParking, its parker tasks and its stall guard: it lives as long as any of them
// (a parker still queued when its PoolParking is gone finds it and returns at once).
struct ParkingState {
  std::mutex mutex;                    // guards everything but probe_pending
  std::condition_variable released;    // parkers wait here (notified only to release or shut down)
  std::condition_variable changed;     // resize() and ~PoolParking wait here for parkers to settle
  std::condition_variable guard_wake;  // the stall guard sleeps here
  int pool_threads = 1;   // N: NumThreads() at construction, lowered by a census (size_by_census)
  int wanted_parked = 0;  // what resize() asked for
  int lent = 0;           // parked workers the stall guard gave back for now (hazard 2)
  int parked = 0;         // workers blocked in a parker now
  int queued = 0;         // parkers scheduled that have not started yet
  int scheduling = 0;     // threads inside pool.Schedule() for this state right now
  bool shut = false;      // released for good: parkers return, nothing is scheduled any more
  bool guard_running = false;  // the stall guard (a detached thread) has not left its loop yet
  const void* pool = nullptr;  // the pool it controls: one PoolParking per pool (the registry checks)
  std::chrono::steady_clock::time_point probe_sent{};  // when the pending probe was scheduled
  uint64_t probe_sent_cpu_ns = 0;  // the active workers' cpu time then (UINT64_MAX: unknown)
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
  // Not needed (any more), or run inline by the thread that scheduled it (not a worker to park):
  // the worker goes on with the pool's work.
  if (state->shut || state->parked >= state->parked_target() || scheduling_for() == state.get()) {
    state->changed.notify_all();
    return;
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

// Schedules n parkers, outside the lock: a pool whose queue is full runs a task inline, and the
// parker takes the lock. `scheduling` tells ~PoolParking to wait until we are out of Schedule().
inline void schedule_parkers(Eigen::ThreadPoolInterface& pool, const std::shared_ptr<ParkingState>& state,
                             std::unique_lock<std::mutex>& lock, int n) {
  state->queued += n;
  ++state->scheduling;
  lock.unlock();
  for (int i = 0; i < n; ++i) {
    schedule_marked(pool, state.get(), [state] { park_this_worker(state); });
  }
  lock.lock();
  --state->scheduling;
  state->changed.notify_all();
}

// The pool's workers as the census found them: all N, or fewer when it was cut short (a busy pool).
struct Workers {
  mutable std::mutex mutex;  // taken after ParkingState::mutex where both are held
  std::vector<pthread_t> handles;
  std::vector<pid_t> tids;
};

// The census: runs one task on each of `expected` workers at once (each waits for the others, so
// no worker runs two), recording its thread into workers; gives up after 2 s. Does nothing from a
// worker of the pool (it would wait on itself).
inline void learn_workers(Eigen::ThreadPoolInterface& pool, int expected, Workers& workers) {
  if (pool.CurrentThreadId() >= 0) return;
  struct Census {
    std::mutex mutex;
    std::condition_variable all_here;
    int expected = 0, arrived = 0;
    bool gave_up = false;
    std::vector<pthread_t> handles;
    std::vector<pid_t> tids;
  };
  auto census = std::make_shared<Census>();
  census->expected = expected;
  for (int i = 0; i < census->expected; ++i) {
    schedule_marked(pool, census.get(), [census] {
      if (scheduling_for() == census.get()) return;  // run inline by the scheduler
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
  std::lock_guard workers_lock(workers.mutex);
  workers.handles = census->handles;
  workers.tids = census->tids;
}

// The /proc readers. Called by the stall guard with state's lock held.

// Calls read(file) on /proc/self/task/TID/<name> of each active worker, until it returns false;
// false when the workers are not all known (a census cut short) or a file cannot be opened for
// another reason than the thread being gone.
template <typename Read>
bool read_active_workers(const Workers& workers, const ParkingState& state, const char* name, Read read) {
  std::lock_guard workers_lock(workers.mutex);
  if (static_cast<int>(workers.tids.size()) < state.pool_threads) return false;
  const auto& parked = state.parked_tids;
  for (pid_t tid : workers.tids) {
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

// The cpu time (ns, schedstat) the active workers have used so far; UINT64_MAX when it cannot be
// known.
inline uint64_t active_workers_cpu_ns(const Workers& workers, const ParkingState& state) {
  uint64_t total = 0;
  bool readable = true;
  const bool known = read_active_workers(workers, state, "schedstat", [&](std::FILE* file) {
    unsigned long long ns = 0;
    readable = std::fscanf(file, "%llu", &ns) == 1;
    total += ns;
    return readable;
  });
  return known && readable ? total : UINT64_MAX;
}

// Whether an active worker is runnable (state R in /proc: on a cpu or waiting for one), i.e. the
// pool is progressing. Unknown workers count as runnable, so they never cause a loan.
inline bool an_active_worker_is_runnable(const Workers& workers, const ParkingState& state) {
  bool runnable = false;
  const bool known = read_active_workers(workers, state, "stat", [&](std::FILE* file) {
    char text[512];
    const size_t length = std::fread(text, 1, sizeof text - 1, file);
    text[length] = '\0';
    const char* close = std::strrchr(text, ')');  // the name may hold spaces and parentheses
    runnable = close != nullptr && close[1] == ' ' && close[2] == 'R';
    return !runnable;
  });
  return runnable || !known;
}

// Stuck, not busy: no active worker is runnable now AND together they ran under 5% of a cpu since
// the probe was sent (a worker that waits for other work but goes on with its own, as a
// TensorFlow inter-op worker waiting for intra-op shards does, keeps using cpu). Anything unknown
// (a census cut short, an unreadable /proc file) counts as progress: the guard never lends on a
// guess.
inline bool active_workers_stalled(const Workers& workers, const ParkingState& state,
                                   std::chrono::steady_clock::time_point now) {
  if (an_active_worker_is_runnable(workers, state)) return false;
  const uint64_t cpu_now = active_workers_cpu_ns(workers, state);
  if (cpu_now == UINT64_MAX || state.probe_sent_cpu_ns == UINT64_MAX || cpu_now < state.probe_sent_cpu_ns)
    return false;
  const auto waited = std::chrono::duration_cast<std::chrono::nanoseconds>(now - state.probe_sent).count();
  return (cpu_now - state.probe_sent_cpu_ns) * 20 < static_cast<uint64_t>(waited);
}

// The stall guard (hazard 2): one detached thread per PoolParking, started by the first resize()
// that parks a worker (never when Options::stall_after <= 0), asleep while resize() asks for no
// parking (wanted_parked == 0), otherwise waking every stall_after (sooner when a resize() wakes it).
//
// Invariant, under ParkingState::mutex: 0 <= lent <= wanted_parked, and the parkers follow
// parked_target() = wanted_parked - lent:
//  - parked <= parked_target(), but for the moment released parkers take to wake: a parker blocks
//    only when it starts with parked < target, and leaves as soon as parked > target;
//  - parked + queued >= parked_target() after each resize() and each wake of the guard: both
//    schedule the shortfall. A parker run inline by a full queue returns without parking and
//    opens a shortfall until the next wake; queued parkers beyond the target return when they start.
// So a loan (++lent) unblocks exactly one parked worker, and taking the loans back (lent = 0)
// schedules parkers for the workers that went back to work.
//
// At each wake with wanted_parked > 0, after that top-up, it judges its probe (a task that only
// clears probe_pending; it takes no lock, so run inline by a full queue it cannot deadlock):
//  - still pending: when it has been untaken for a whole stall_after, the parkers are settled
//    (parked >= target, parked > 0), lent < wanted_parked and active_workers_stalled(), it lends
//    one more parked worker. No new probe is sent, so each further period that the same probe
//    stays untaken with the active workers stalled lends one more, up to every parked worker;
//  - taken: loans are kept (a nested region needs the help for as long as it runs) until a wake
//    that finds the probe taken at least 4 stall_after after the first loan; that wake takes every
//    loan back at once. Then it sends a new probe.
// A resize() also takes every loan back (it sets lent = 0).
class StallGuard {
 public:
  // Starts the guard's thread on the first call and wakes it on later ones; called by resize()
  // with state's lock held. pool and workers must outlive the thread: the PoolParking that owns
  // them waits in its destructor until guard_running is false.
  void start(Eigen::ThreadPoolInterface& pool, const std::shared_ptr<ParkingState>& state,
             const Workers& workers, std::chrono::milliseconds stall_after) {
    if (stall_after.count() <= 0) return;
    if (started_) {
      state->guard_wake.notify_all();
      return;
    }
    started_ = true;
    try {
      // Detached, so a PoolParking that is never destroyed (a framework's global pool) leaves no
      // unjoined thread at exit; ~PoolParking waits until it has left its loop instead.
      std::thread([&pool, state, &workers, stall_after] { loop(pool, state, workers, stall_after); }).detach();
      state->guard_running = true;
    } catch (...) {
      // No thread for the guard: parking still works; only hazard 2's recovery is missing.
    }
  }

 private:
  static void loop(Eigen::ThreadPoolInterface& pool, const std::shared_ptr<ParkingState>& state,
                   const Workers& workers, std::chrono::milliseconds stall_after) {
    using Clock = std::chrono::steady_clock;
    std::unique_lock lock(state->mutex);
    while (!state->shut) {
      if (state->wanted_parked == 0) {
        state->guard_wake.wait(lock);
        continue;
      }
      state->guard_wake.wait_for(lock, stall_after);
      if (state->shut || state->wanted_parked == 0) continue;
      // A parker that found itself run inline by its scheduler (a full queue) returned: send it again.
      if (const int missing = state->parked_target() - (state->parked + state->queued); missing > 0) {
        schedule_parkers(pool, state, lock, missing);
        if (state->shut) break;
      }
      const auto now = Clock::now();
      if (state->probe_pending.load(std::memory_order_acquire)) {
        const bool untaken_for_a_period = now - state->probe_sent >= stall_after;
        const bool parkers_settled = state->parked >= state->parked_target() && state->parked > 0;
        if (untaken_for_a_period && parkers_settled && state->lent < state->wanted_parked &&
            active_workers_stalled(workers, *state, now)) {
          if (state->lent == 0) state->lent_since = now;
          ++state->lent;
          ++state->loans;
          state->released.notify_all();
          state->changed.notify_all();
        }
        continue;
      }
      if (state->lent > 0) {
        if (now - state->lent_since < 4 * stall_after) {
          send_probe(pool, state, workers, lock);
          continue;
        }
        state->lent = 0;
        state->changed.notify_all();
        const int missing = state->parked_target() - (state->parked + state->queued);
        if (missing > 0) schedule_parkers(pool, state, lock, missing);
        if (state->shut) break;
      }
      send_probe(pool, state, workers, lock);
    }
    state->guard_running = false;
    state->changed.notify_all();
  }

  // Schedules the probe, outside the lock, noting when and the active workers' cpu time then.
  static void send_probe(Eigen::ThreadPoolInterface& pool, const std::shared_ptr<ParkingState>& state,
                         const Workers& workers, std::unique_lock<std::mutex>& lock) {
    state->probe_pending.store(true, std::memory_order_release);
    state->probe_sent = std::chrono::steady_clock::now();
    state->probe_sent_cpu_ns = active_workers_cpu_ns(workers, *state);
    ++state->scheduling;
    lock.unlock();
    pool.Schedule([state] { state->probe_pending.store(false, std::memory_order_release); });
    lock.lock();
    --state->scheduling;
    state->changed.notify_all();
  }

  bool started_ = false;  // under ParkingState::mutex
};

}  // namespace mall::tf::detail
