// Proves the resizable Eigen pool keeps Eigen kernels exact across resizes, never loses or strands
// tasks, never runs more tasks at once than NumThreads(), keeps ids dense, and that the libmall glue
// resizes and pins the pools from an allocation.
#define EIGEN_USE_THREADS
#include <mall/tf/mall_pool_glue.hpp>
#include <mall/tf/resizable_thread_pool.hpp>

#include "../support/watchdog.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <unsupported/Eigen/CXX11/Tensor>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

using mall::tf::ResizableThreadPool;

// A hang fails the program instead of stalling the suite (ctest's TIMEOUT is 120 s).
MALL_TEST_WATCHDOG(110);

const std::vector<int> kResizeSequence = {8, 3, 1, 5, 2, 8};

// Waits until counter reaches expected; the watchdog bounds the wait.
void wait_for_count(const std::atomic<long>& counter, long expected) {
  while (counter.load() < expected) std::this_thread::sleep_for(std::chrono::microseconds(200));
}

// Small integers stored as floats: every partial sum is exact, so results cannot depend on the
// order in which threads add them up, and any lost or doubled block shows as a mismatch.
Eigen::Tensor<float, 2> integer_matrix(int rows, int cols, unsigned seed) {
  std::mt19937 random(seed);
  std::uniform_int_distribution<int> value(-3, 3);
  Eigen::Tensor<float, 2> matrix(rows, cols);
  for (int c = 0; c < cols; ++c)
    for (int r = 0; r < rows; ++r) matrix(r, c) = static_cast<float>(value(random));
  return matrix;
}

Eigen::Tensor<float, 2> contract(const Eigen::Tensor<float, 2>& a, const Eigen::Tensor<float, 2>& b,
                                 const Eigen::ThreadPoolDevice* device) {
  const Eigen::array<Eigen::IndexPair<int>, 1> dims = {Eigen::IndexPair<int>(1, 0)};
  Eigen::Tensor<float, 2> result(a.dimension(0), b.dimension(1));
  if (device == nullptr) {
    result = a.contract(b, dims);
  } else {
    result.device(*device) = a.contract(b, dims);
  }
  return result;
}

bool tensors_equal(const Eigen::Tensor<float, 2>& x, const Eigen::Tensor<float, 2>& y) {
  if (x.dimension(0) != y.dimension(0) || x.dimension(1) != y.dimension(1)) return false;
  return std::memcmp(x.data(), y.data(), sizeof(float) * static_cast<size_t>(x.size())) == 0;
}

// f(i) for parallelFor: a deterministic, index-dependent value.
double element_value(Eigen::Index i) { return static_cast<double>(i) * 0.5 + static_cast<double>(i % 7); }

std::string cpus_allowed_list(pid_t tid) {
  std::ifstream status("/proc/self/task/" + std::to_string(tid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Cpus_allowed_list:", 0) == 0) {
      const auto start = line.find_first_not_of(" \t", std::strlen("Cpus_allowed_list:"));
      return line.substr(start);
    }
  }
  return "";
}

TEST(ResizablePool, ParallelForAndContractionsMatchSingleThreadedAcrossResizes) {
  ResizableThreadPool pool(8);
  const Eigen::Tensor<float, 2> a = integer_matrix(96, 300, 1);
  const Eigen::Tensor<float, 2> b = integer_matrix(300, 70, 2);
  const Eigen::Tensor<float, 2> tall_a = integer_matrix(8, 2000, 3);  // inner-dimension sharding
  const Eigen::Tensor<float, 2> tall_b = integer_matrix(2000, 6, 4);
  const Eigen::Tensor<float, 2> reference = contract(a, b, nullptr);
  const Eigen::Tensor<float, 2> tall_reference = contract(tall_a, tall_b, nullptr);
  constexpr Eigen::Index kElements = 100000;

  for (int size : kResizeSequence) {
    ASSERT_EQ(pool.resize(size), size);
    ASSERT_EQ(pool.NumThreads(), size);
    Eigen::ThreadPoolDevice device(&pool, pool.NumThreads());

    std::vector<double> values(kElements, -1.0);
    device.parallelFor(kElements, Eigen::TensorOpCost(8, 8, 20),
                       [&](Eigen::Index first, Eigen::Index last) {
                         for (Eigen::Index i = first; i < last; ++i) values[i] = element_value(i);
                       });
    for (Eigen::Index i = 0; i < kElements; ++i) {
      ASSERT_EQ(values[i], element_value(i)) << "element " << i << " at size " << size;
    }

    EXPECT_TRUE(tensors_equal(contract(a, b, &device), reference)) << "size " << size;
    EXPECT_TRUE(tensors_equal(contract(tall_a, tall_b, &device), tall_reference)) << "size " << size;
  }
}

TEST(ResizablePool, TasksScheduledWhileWorkersParkAllRun) {
  ResizableThreadPool pool(8);
  std::atomic<long> completed{0};
  std::atomic<bool> stop_resizing{false};
  std::thread resizer([&] {
    std::mt19937 random(7);
    while (!stop_resizing.load()) pool.resize(std::uniform_int_distribution<int>(1, 8)(random));
  });
  constexpr long kParents = 20000;
  for (long i = 0; i < kParents; ++i) {
    pool.Schedule([&] {
      // Children are scheduled from inside the pool, possibly by a worker that is parking.
      pool.Schedule([&] { completed.fetch_add(1); });
      completed.fetch_add(1);
    });
  }
  wait_for_count(completed, 2 * kParents);
  stop_resizing = true;
  resizer.join();
  EXPECT_EQ(completed.load(), 2 * kParents);
  // Every task is counted once, on the worker that ran it.
  const std::vector<uint64_t> by_worker = pool.tasks_run_by_worker();
  ASSERT_EQ(by_worker.size(), 8u);
  uint64_t counted = 0;
  for (uint64_t tasks : by_worker) counted += tasks;
  EXPECT_EQ(counted, static_cast<uint64_t>(2 * kParents));
}

TEST(ResizablePool, ScheduleWithHintBeyondActiveRangeRuns) {
  ResizableThreadPool pool(8, 2);
  std::atomic<long> completed{0};
  const std::vector<std::pair<int, int>> hints = {{5, 8}, {7, 8}, {-3, 100}, {2, 2}, {9, 4}, {0, 1}};
  for (const auto& [start, end] : hints) {
    pool.ScheduleWithHint([&] { completed.fetch_add(1); }, start, end);
  }
  pool.resize(1);
  pool.ScheduleWithHint([&] { completed.fetch_add(1); }, 3, 8);
  wait_for_count(completed, static_cast<long>(hints.size()) + 1);
  EXPECT_EQ(completed.load(), static_cast<long>(hints.size()) + 1);
}

TEST(ResizablePool, ConcurrencyNeverExceedsActiveCount) {
  ResizableThreadPool pool(8);
  for (int size : kResizeSequence) {
    pool.resize(size);
    std::atomic<int> running{0};
    std::atomic<int> most_running{0};
    std::atomic<long> completed{0};
    constexpr long kTasks = 300;
    for (long i = 0; i < kTasks; ++i) {
      pool.Schedule([&] {
        const int now = running.fetch_add(1) + 1;
        int seen = most_running.load();
        while (now > seen && !most_running.compare_exchange_weak(seen, now)) {
        }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        running.fetch_sub(1);
        completed.fetch_add(1);
      });
    }
    wait_for_count(completed, kTasks);
    EXPECT_LE(most_running.load(), size);
    EXPECT_GE(most_running.load(), 1);
  }
}

TEST(ResizablePool, ConcurrencyStaysBoundedWhenShrinkingUnderLoad) {
  ResizableThreadPool pool(8);
  std::atomic<int> running{0};
  std::atomic<int> violations{0};
  std::atomic<long> completed{0};
  constexpr long kTasks = 600;
  for (long i = 0; i < kTasks; ++i) {
    pool.Schedule([&] {
      running.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      running.fetch_sub(1);
      completed.fetch_add(1);
    });
  }
  pool.resize(2);
  // After resize() returns, the parked workers have finished: at most 2 tasks (plus one that may
  // have incremented just before this read but still belongs to an active worker) run at once.
  while (completed.load() < kTasks) {
    if (running.load() > 2) violations.fetch_add(1);
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  EXPECT_EQ(violations.load(), 0);
}

TEST(ResizablePool, CurrentThreadIdIsDense) {
  ResizableThreadPool pool(8);
  EXPECT_EQ(pool.CurrentThreadId(), -1) << "a thread outside the pool";
  for (int size : kResizeSequence) {
    pool.resize(size);
    // size tasks that wait for each other can only finish if size distinct active workers run them.
    Eigen::Barrier all_running(static_cast<unsigned>(size));
    std::atomic<int> arrived{0};
    std::mutex ids_mutex;
    std::set<int> ids;
    std::atomic<int> bad_ids{0};
    for (int i = 0; i < size; ++i) {
      pool.Schedule([&] {
        const int id = pool.CurrentThreadId();
        if (id < 0 || id >= pool.NumThreads()) bad_ids.fetch_add(1);
        {
          std::lock_guard lock(ids_mutex);
          ids.insert(id);
        }
        arrived.fetch_add(1);
        while (arrived.load() < size) std::this_thread::yield();
        all_running.Notify();
      });
    }
    all_running.Wait();
    EXPECT_EQ(bad_ids.load(), 0) << "size " << size;
    std::set<int> expected;
    for (int i = 0; i < size; ++i) expected.insert(i);
    EXPECT_EQ(ids, expected) << "size " << size;
  }
}

TEST(ResizablePool, CancelIsHarmless) {
  ResizableThreadPool pool(4);
  std::atomic<long> completed{0};
  for (int i = 0; i < 100; ++i) pool.Schedule([&] { completed.fetch_add(1); });
  pool.Cancel();
  for (int i = 0; i < 100; ++i) pool.Schedule([&] { completed.fetch_add(1); });
  wait_for_count(completed, 200);
  pool.resize(2);
  pool.Cancel();
  Eigen::ThreadPoolDevice device(&pool, pool.NumThreads());
  std::vector<int> values(5000, 0);
  device.parallelFor(5000, Eigen::TensorOpCost(4, 4, 10), [&](Eigen::Index first, Eigen::Index last) {
    for (Eigen::Index i = first; i < last; ++i) values[i] = static_cast<int>(i);
  });
  for (int i = 0; i < 5000; ++i) ASSERT_EQ(values[i], i);
  EXPECT_EQ(completed.load(), 200);
}

TEST(ResizablePool, DestructionRunsWorkInFlight) {
  std::atomic<long> completed{0};
  constexpr long kParents = 500;
  {
    ResizableThreadPool pool(4, 2);
    for (long i = 0; i < kParents; ++i) {
      pool.Schedule([&] {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
        pool.Schedule([&] { completed.fetch_add(1); });
        completed.fetch_add(1);
      });
    }
  }  // destroyed with most tasks still queued
  EXPECT_EQ(completed.load(), 2 * kParents);
}

// Regression: two tasks shrinking the pool at once each waited for the other's worker to go idle
// (a deadlock first seen under TSan); a resize from inside the pool no longer waits.
TEST(ResizablePool, ResizeFromInsideATaskDoesNotDeadlock) {
  ResizableThreadPool pool(4);
  std::atomic<long> completed{0};
  for (int i = 0; i < 200; ++i) {
    pool.Schedule([&pool, &completed, i] {
      pool.resize(i % 4 + 1);
      completed.fetch_add(1);
    });
  }
  wait_for_count(completed, 200);
  EXPECT_GE(pool.NumThreads(), 1);
}

TEST(ResizablePool, ShrinkAndGrowInALoop) {
  ResizableThreadPool pool(8);
  std::atomic<bool> stop_background{false};
  std::atomic<long> background_scheduled{0};
  std::atomic<long> background_completed{0};
  std::thread background([&] {  // an outside thread keeps queueing work through every resize
    while (!stop_background.load()) {
      background_scheduled.fetch_add(1);
      pool.Schedule([&] { background_completed.fetch_add(1); });
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  });
  std::mt19937 random(11);
  constexpr Eigen::Index kElements = 4096;
  for (int round = 0; round < 150; ++round) {
    const int size = std::uniform_int_distribution<int>(1, 8)(random);
    ASSERT_EQ(pool.resize(size), size);
    Eigen::ThreadPoolDevice device(&pool, pool.NumThreads());
    std::vector<long> values(kElements, 0);
    device.parallelFor(kElements, Eigen::TensorOpCost(8, 8, 100), [&](Eigen::Index first, Eigen::Index last) {
      for (Eigen::Index i = first; i < last; ++i) values[i] += i + round;
    });
    for (Eigen::Index i = 0; i < kElements; ++i) ASSERT_EQ(values[i], i + round) << "round " << round;
  }
  stop_background = true;
  background.join();
  wait_for_count(background_completed, background_scheduled.load());
  EXPECT_EQ(background_completed.load(), background_scheduled.load());
}

TEST(ResizablePool, ConstructionClampsCounts) {
  ResizableThreadPool zero(0);
  EXPECT_EQ(zero.max_threads(), 1);
  EXPECT_EQ(zero.NumThreads(), 1);
  ResizableThreadPool pool(3, 10);
  EXPECT_EQ(pool.NumThreads(), 3);
  EXPECT_EQ(pool.resize(0), 1);
  EXPECT_EQ(pool.resize(-5), 1);
  EXPECT_EQ(pool.resize(99), 3);
  EXPECT_EQ(pool.NumThreads(), 3);
}

mall_alloc_t fake_allocation(int ncpus, const std::vector<int>& cpus) {
  mall_alloc_t alloc{};
  alloc.generation = 1;
  alloc.ncpus = ncpus;
  std::string list;
  for (int cpu : cpus) {
    alloc.mask[cpu / 64] |= uint64_t{1} << (cpu % 64);
    list += (list.empty() ? "" : ",") + std::to_string(cpu);
  }
  std::snprintf(alloc.cpus, sizeof(alloc.cpus), "%s", list.c_str());
  return alloc;
}

TEST(MallPoolGlue, ResizeCallbackClampsCountAndPinsWorkers) {
  cpu_set_t process_cpus;
  ASSERT_EQ(sched_getaffinity(0, sizeof(process_cpus), &process_cpus), 0);
  std::vector<int> allowed;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &process_cpus)) allowed.push_back(cpu);
  ASSERT_FALSE(allowed.empty());

  ResizableThreadPool intra_op(4);
  ResizableThreadPool inter_op(2);
  mall::tf::PoolAttachment attachment{&intra_op, &inter_op};

  // More cpus than workers: clamped to each pool's maximum, pinned to all of them.
  mall_alloc_t wide = fake_allocation(6, allowed);
  mall::tf::apply_allocation_to_pools(&wide, &attachment);
  EXPECT_EQ(intra_op.NumThreads(), 4);
  EXPECT_EQ(inter_op.NumThreads(), 2);

  // One cpu: both pools shrink to one worker, and every worker (parked ones too) is pinned to it.
  const int only_cpu = allowed.back();
  mall_alloc_t narrow = fake_allocation(1, {only_cpu});
  mall::tf::apply_allocation_to_pools(&narrow, &attachment);
  EXPECT_EQ(intra_op.NumThreads(), 1);
  EXPECT_EQ(inter_op.NumThreads(), 1);
  for (ResizableThreadPool* pool : {&intra_op, &inter_op}) {
    for (pid_t tid : pool->worker_tids()) {
      EXPECT_EQ(cpus_allowed_list(tid), std::to_string(only_cpu)) << "worker tid " << tid;
    }
  }

  // An allocation with no cpus (a handle that never attached) changes nothing.
  mall_alloc_t empty = fake_allocation(0, {});
  mall::tf::apply_allocation_to_pools(&empty, &attachment);
  EXPECT_EQ(intra_op.NumThreads(), 1);
  EXPECT_EQ(cpus_allowed_list(intra_op.worker_tids().front()), std::to_string(only_cpu));

  // Growing back: intra_op follows ncpus up to its max; the pool still computes correctly.
  mall_alloc_t two = fake_allocation(static_cast<int>(std::min<size_t>(allowed.size(), 3)), allowed);
  mall::tf::apply_allocation_to_pools(&two, &attachment);
  EXPECT_EQ(intra_op.NumThreads(), two.ncpus);
  Eigen::ThreadPoolDevice device(&intra_op, intra_op.NumThreads());
  std::vector<int> values(1000, 0);
  device.parallelFor(1000, Eigen::TensorOpCost(4, 4, 10), [&](Eigen::Index first, Eigen::Index last) {
    for (Eigen::Index i = first; i < last; ++i) values[i] = 1;
  });
  EXPECT_EQ(std::count(values.begin(), values.end(), 1), 1000);

  EXPECT_EQ(mall::tf::attach_pool(nullptr, intra_op), MALL_ERR_INVAL);
}

}  // namespace
