// A resizable Eigen::ThreadPoolInterface for TensorFlow-style kernels (header-only, templated on the
// Eigen thread environment like Eigen::ThreadPoolTempl). Contract: NumThreads() is the active count,
// changed only by resize() between steps; active ids stay dense; no queued task is lost when workers
// park; at least one worker stays active; Cancel() is harmless; parked workers sleep on a condvar.
#pragma once

#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <type_traits>
#include <mutex>
#include <utility>
#include <vector>

#include <unsupported/Eigen/CXX11/ThreadPool>

#include <mall/tf/pool_parking.hpp>  // ResizablePool

namespace mall::tf {

// Design (why it looks like this):
// - One shared FIFO queue under one mutex. A parking worker therefore never holds queued work, so
//   nothing can be stranded on a parked worker's private queue (the failure mode of resizing
//   Eigen's per-thread RunQueues). The cost is one lock per Schedule and per task pop.
// - Worker i is active when i < active count. Active workers wait for work on `work_ready_`;
//   parked workers wait on `unparked_`, a different condition variable, so a wake-up meant for
//   queued work can never be consumed by a parked worker.
// - resize() returns only after every worker that was just parked has finished the task it was
//   running, so once it returns at most NumThreads() tasks run at once.
// - Speed at a fixed size: an active worker that runs out of work spins briefly (a few µs, on an
//   atomic copy of the queue length) before sleeping, and Schedule() signals the condition
//   variable only when some worker sleeps, so fine-grained parallelFor avoids futex round trips.
//
// Threading rules for callers:
// - resize() is meant to be called between steps, by the thread that owns the pool, while no
//   parallel region is running (TensorFlow re-reads NumThreads() at each Session::Run; Eigen's
//   ThreadPoolDevice copies the count when it is built). Calling it while tasks are in flight is
//   still safe (no task is lost or run twice, no data race), but a running parallelFor may then
//   see ids or a thread count from the old size. Called from inside one of this pool's tasks it
//   does not wait for the parked workers to finish (waiting could deadlock two tasks that shrink
//   the pool at once), so the concurrency bound then holds once the in-flight tasks end.
// - The destructor must run outside the pool. It lets the active workers run every queued task
//   (including tasks those tasks schedule), then joins all workers.
//
// Interface is the pool interface the framework expects: Eigen::ThreadPoolInterface for Eigen's
// ThreadPoolDevice, tensorflow::thread::ThreadPoolInterface (an empty subclass of it) for
// TensorFlow's Session::Run (see mall/tf/tensorflow_session.hpp).
template <typename Environment = Eigen::StlThreadEnvironment,
          typename Interface = Eigen::ThreadPoolInterface>
class ResizableThreadPoolTempl : public Interface, public ResizablePool {
  static_assert(std::is_base_of_v<Eigen::ThreadPoolInterface, Interface>,
                "Interface must derive from Eigen::ThreadPoolInterface");

 public:
  using Task = typename Environment::Task;

  // max_threads < 1 is treated as 1; initial_active defaults to max_threads and is clamped to
  // 1..max_threads. Returns after every worker has started (so set_affinity() reaches all).
  explicit ResizableThreadPoolTempl(int max_threads, int initial_active = -1,
                                    Environment env = Environment())
      : env_(std::move(env)),
        max_threads_(std::max(1, max_threads)),
        active_(clamp_count(initial_active < 0 ? max_threads_ : initial_active)),
        worker_busy_(static_cast<size_t>(max_threads_), false),
        worker_tasks_run_(static_cast<size_t>(max_threads_), 0),
        worker_handles_(static_cast<size_t>(max_threads_)),
        worker_tids_(static_cast<size_t>(max_threads_), 0) {
    threads_.reserve(static_cast<size_t>(max_threads_));
    for (int index = 0; index < max_threads_; ++index) {
      threads_.emplace_back(env_.CreateThread([this, index] { worker_loop(index); }));
    }
    std::unique_lock lock(mutex_);
    all_started_.wait(lock, [this] { return started_workers_ == max_threads_; });
  }

  ResizableThreadPoolTempl(const ResizableThreadPoolTempl&) = delete;
  ResizableThreadPoolTempl& operator=(const ResizableThreadPoolTempl&) = delete;

  ~ResizableThreadPoolTempl() override {
    {
      std::lock_guard lock(mutex_);
      shutting_down_ = true;
    }
    work_ready_.notify_all();
    unparked_.notify_all();
    threads_.clear();  // EnvThread's destructor joins
  }

  // Queues fn; some active worker runs it. Safe from any thread, including pool workers.
  void Schedule(std::function<void()> fn) override {
    Task task = env_.CreateTask(std::move(fn));
    bool worker_sleeping;
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(task));
      queued_tasks_.store(queue_.size(), std::memory_order_relaxed);
      worker_sleeping = sleeping_workers_ > 0;
    }
    // A worker that is awake (running or spinning) finds the task itself: skip the futex wake.
    if (worker_sleeping) work_ready_.notify_one();
  }

  // The hint names workers [start, end), possibly beyond the active range (a caller that read
  // NumThreads() before a resize). Clamping it to the active range would change nothing here: with
  // one shared queue the task goes to whichever active worker is free, never to a parked one, so
  // any hint, in range or not, is accepted and the task always runs.
  void ScheduleWithHint(std::function<void()> fn, int /*start*/, int /*end*/) override {
    Schedule(std::move(fn));
  }

  // Harmless by design: queued tasks still run and the pool stays usable. It only forwards the
  // cancellation to each thread's environment (EnvThread::OnCancel, a no-op for the STL one).
  // Eigen's pool drops queued work and stops for good on Cancel(); callers blocked on a Barrier
  // would then hang, and a pool shared across steps could not be reused.
  void Cancel() override {
    for (auto& thread : threads_) thread->OnCancel();
  }

  // The active worker count (1..max_threads()).
  int NumThreads() const override { return active_.load(std::memory_order_acquire); }

  // 0..NumThreads()-1 on an active worker of this pool, -1 on any other thread (including a worker
  // that was parked while it finished its last task).
  int CurrentThreadId() const override {
    const WorkerIdentity& me = this_thread_identity();
    if (me.pool != this) return -1;
    return me.index < NumThreads() ? me.index : -1;
  }

  int max_threads() const override { return max_threads_; }
  int active_threads() const override { return NumThreads(); }

  // Sets the active count to active_count clamped to 1..max_threads(); returns the count applied.
  // Growing wakes parked workers; shrinking parks the highest ids and, when called from outside
  // the pool, waits until they have finished their current task. Queued tasks stay in the shared
  // queue for the active workers.
  int resize(int active_count) override {
    const int target = clamp_count(active_count);
    const bool called_from_own_worker = this_thread_identity().pool == this;
    std::unique_lock lock(mutex_);
    const int previous = active_.load(std::memory_order_relaxed);
    if (target == previous) return target;
    active_.store(target, std::memory_order_release);
    if (target > previous) {
      lock.unlock();
      unparked_.notify_all();
      // New workers find queued work themselves: they check the queue before sleeping.
      return target;
    }
    // Move idle workers that must park off work_ready_, so a later notify_one reaches an active one.
    work_ready_.notify_all();
    // A worker of this pool must not wait: two tasks shrinking at once would wait for each other.
    if (called_from_own_worker) return target;
    parked_drained_.wait(lock, [&] {
      for (int index = target; index < max_threads_; ++index) {
        if (worker_busy_[static_cast<size_t>(index)]) return false;
      }
      return true;
    });
    return target;
  }

  // Pins every worker (active and parked) to cpus now, with pthread_setaffinity_np. Returns 0, or
  // the errno of the first worker that could not be pinned (EINVAL: no allowed cpu in the set).
  int set_affinity(const cpu_set_t& cpus) override {
    std::lock_guard lock(mutex_);
    int first_error = 0;
    for (pthread_t handle : worker_handles_) {
      const int rc = pthread_setaffinity_np(handle, sizeof(cpu_set_t), &cpus);
      if (rc != 0 && first_error == 0) first_error = rc;
    }
    return first_error;
  }

  // Tasks each worker has run since the pool started, by worker index (counted under the queue's
  // lock when a task is taken, so it costs nothing extra): shows where a framework's work ran.
  std::vector<uint64_t> tasks_run_by_worker() const {
    std::lock_guard lock(mutex_);
    return worker_tasks_run_;
  }

  // Linux thread ids of the workers, by worker index (for tests and /proc inspection).
  std::vector<pid_t> worker_tids() const {
    std::lock_guard lock(mutex_);
    return worker_tids_;
  }

 private:
  struct WorkerIdentity {
    const ResizableThreadPoolTempl* pool = nullptr;
    int index = -1;
  };

  static WorkerIdentity& this_thread_identity() {
    static thread_local WorkerIdentity identity;
    return identity;
  }

  int clamp_count(int count) const { return std::clamp(count, 1, max_threads_); }

  void worker_loop(int index) {
    this_thread_identity() = WorkerIdentity{this, index};
    const auto slot = static_cast<size_t>(index);
    std::unique_lock lock(mutex_);
    worker_handles_[slot] = pthread_self();
    worker_tids_[slot] = static_cast<pid_t>(syscall(SYS_gettid));
    if (++started_workers_ == max_threads_) all_started_.notify_all();
    bool spun_since_last_task = false;
    for (;;) {
      if (index >= active_.load(std::memory_order_relaxed)) {
        if (shutting_down_) return;  // the active workers drain the queue
        unparked_.wait(lock, [&] {
          return shutting_down_ || index < active_.load(std::memory_order_relaxed);
        });
        continue;
      }
      if (!queue_.empty()) {
        Task task = std::move(queue_.front());
        queue_.pop_front();
        queued_tasks_.store(queue_.size(), std::memory_order_relaxed);
        worker_busy_[slot] = true;
        ++worker_tasks_run_[slot];
        spun_since_last_task = false;
        lock.unlock();
        env_.ExecuteTask(task);
        lock.lock();
        worker_busy_[slot] = false;
        if (index >= active_.load(std::memory_order_relaxed)) parked_drained_.notify_all();
        continue;
      }
      if (shutting_down_) return;
      if (!spun_since_last_task) {
        // Fine-grained kernels schedule the next task within microseconds: a short spin by an
        // active worker avoids a sleep/wake round trip (Eigen's pool spins too). Parked workers
        // never spin.
        spun_since_last_task = true;
        lock.unlock();
        spin_briefly_for_work(index);
        lock.lock();
        continue;
      }
      ++sleeping_workers_;
      work_ready_.wait(lock);
      --sleeping_workers_;
    }
  }

  void spin_briefly_for_work(int index) const {
    for (int round = 0; round < kSpinRounds; ++round) {
      if (queued_tasks_.load(std::memory_order_relaxed) > 0) return;
      if (index >= active_.load(std::memory_order_relaxed)) return;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
  }

  static constexpr int kSpinRounds = 2000;

  Environment env_;
  const int max_threads_;
  std::atomic<int> active_;

  mutable std::mutex mutex_;  // guards everything below, and writes to active_
  std::condition_variable work_ready_;      // active workers wait here for queued tasks
  std::condition_variable unparked_;        // parked workers wait here for resize() or shutdown
  std::condition_variable parked_drained_;  // resize() waits here for shrinking workers to go idle
  std::condition_variable all_started_;     // the constructor waits here for every worker
  std::deque<Task> queue_;
  std::vector<bool> worker_busy_;
  std::vector<uint64_t> worker_tasks_run_;
  std::vector<pthread_t> worker_handles_;
  std::vector<pid_t> worker_tids_;
  std::atomic<size_t> queued_tasks_{0};  // queue_.size(), readable without the lock while spinning
  int sleeping_workers_ = 0;              // active workers waiting on work_ready_
  int started_workers_ = 0;
  bool shutting_down_ = false;

  // Declared last: destroyed (joined) first, while the members the workers use still exist.
  std::vector<std::unique_ptr<typename Environment::EnvThread>> threads_;
};

using ResizableThreadPool = ResizableThreadPoolTempl<>;

}  // namespace mall::tf
