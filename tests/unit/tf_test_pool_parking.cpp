// SPDX-License-Identifier: BSD-3-Clause
// Proves that parking workers of Eigen's own ThreadPool (mall::tf::PoolParking) resizes it: the
// parked count follows resize() under concurrent scheduling, no task is lost or run twice, parked
// workers run no task and use no cpu, Eigen's kernels stay exact, the libmall glue pins and parks
// from an allocation, and each of the four hazards is handled (the last worker is never parked, a
// nested parallelFor with one running worker finishes, exit with parked workers does not hang, a
// pool is destroyed after its parking without hanging).
#define EIGEN_USE_THREADS
#include <mall/tf/mall_pool_glue.hpp>
#include <mall/tf/pool_parking.hpp>

#include "../support/watchdog.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <unsupported/Eigen/CXX11/Tensor>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <condition_variable>
#include <stdexcept>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

using mall::tf::PoolParking;
using namespace std::chrono_literals;

// A hang fails the program instead of stalling the suite (ctest's TIMEOUT is 120 s).
MALL_TEST_WATCHDOG(110);

pid_t this_tid() { return static_cast<pid_t>(syscall(SYS_gettid)); }

// Waits until pred() holds or the deadline passes; returns pred().
template <typename Pred>
bool wait_until(Pred pred, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return pred();
    std::this_thread::sleep_for(200us);
  }
  return true;
}

// Nanoseconds a thread of this process spent on a cpu (/proc/self/task/TID/schedstat).
uint64_t cpu_ns(pid_t tid) {
  std::ifstream stat("/proc/self/task/" + std::to_string(tid) + "/schedstat");
  uint64_t ns = 0;
  stat >> ns;
  return ns;
}

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

// Small integers stored as floats: exact partial sums, so a lost or doubled block shows.
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

TEST(PoolParking, ParkedCountFollowsResizeAndIsClampedToKeepOneWorker) {
  Eigen::ThreadPool pool(6);
  PoolParking parking(pool);
  EXPECT_EQ(parking.max_threads(), 6);
  EXPECT_EQ(parking.active_threads(), 6);
  EXPECT_EQ(parking.worker_tids().size(), 6u) << "the census must find every worker of an idle pool";
  for (int active : {6, 3, 1, 5, 2, 6, 4}) {
    EXPECT_EQ(parking.resize(active), active);
    // resize() returns once the parkers block (two-phase): no waiting needed here.
    EXPECT_EQ(parking.parked_now(), 6 - active) << "after resize(" << active << ")";
    EXPECT_EQ(parking.active_threads(), active);
  }
  // Hazard 1: never the last worker.
  EXPECT_EQ(parking.resize(0), 1);
  EXPECT_EQ(parking.parked_now(), 5);
  EXPECT_EQ(parking.resize(-7), 1);
  EXPECT_EQ(parking.resize(100), 6);
  EXPECT_EQ(parking.parked_now(), 0);
}

TEST(PoolParking, TheOneRunningWorkerStillRunsEveryKernel) {
  // Hazard 1's consequence: with every worker but one parked the pool still serves Eigen's
  // kernels, scheduled from outside onto any queue (the parked workers' ones included).
  Eigen::ThreadPool pool(4);
  PoolParking parking(pool);
  parking.resize(0);
  ASSERT_EQ(parking.parked_now(), 3);
  const Eigen::Tensor<float, 2> a = integer_matrix(64, 200, 1), b = integer_matrix(200, 40, 2);
  // The device sized with the pool's FULL size, as a framework that does not re-read the count
  // would: its tasks land in the parked workers' queues too and must be stolen.
  const Eigen::ThreadPoolDevice full(&pool, 4);
  EXPECT_EQ(0, std::memcmp(contract(a, b, &full).data(), contract(a, b, nullptr).data(), sizeof(float) * 64 * 40));
  std::atomic<long> done{0};
  for (int i = 0; i < 1000; ++i) pool.Schedule([&] { done.fetch_add(1); });
  EXPECT_TRUE(wait_until([&] { return done.load() == 1000; }, 20s)) << done.load();
}

TEST(PoolParking, KernelsMatchSingleThreadedAcrossParks) {
  Eigen::ThreadPool pool(8);
  PoolParking parking(pool);
  const Eigen::Tensor<float, 2> a = integer_matrix(96, 300, 1), b = integer_matrix(300, 70, 2);
  const Eigen::Tensor<float, 2> reference = contract(a, b, nullptr);
  constexpr Eigen::Index kElements = 100000;
  for (int active : {8, 3, 1, 5, 2, 8}) {
    parking.resize(active);
    const Eigen::ThreadPoolDevice device(&pool, parking.active_threads());
    std::vector<double> values(kElements, -1.0);
    device.parallelFor(kElements, Eigen::TensorOpCost(8, 8, 20), [&](Eigen::Index first, Eigen::Index last) {
      for (Eigen::Index i = first; i < last; ++i) values[i] = static_cast<double>(i) * 0.5;
    });
    for (Eigen::Index i = 0; i < kElements; ++i) ASSERT_EQ(values[i], static_cast<double>(i) * 0.5) << i;
    const Eigen::Tensor<float, 2> result = contract(a, b, &device);
    EXPECT_EQ(0, std::memcmp(result.data(), reference.data(), sizeof(float) * 96 * 70)) << "active " << active;
  }
}

TEST(PoolParking, NoTaskIsLostOrRunTwiceWhileResizingUnderConcurrentScheduling) {
  Eigen::ThreadPool pool(8);
  PoolParking parking(pool);
  constexpr int kSchedulers = 3, kParentsEach = 6000;
  // Per task: how many times it ran. Parents run inside the pool and schedule a child each.
  std::vector<std::atomic<int>> runs(static_cast<size_t>(2 * kSchedulers * kParentsEach));
  std::atomic<long> completed{0};
  std::atomic<bool> stop{false};
  std::thread resizer([&] {
    std::mt19937 random(7);
    while (!stop.load()) {
      parking.resize(std::uniform_int_distribution<int>(0, 8)(random));
      std::this_thread::sleep_for(100us);
    }
  });
  std::vector<std::thread> schedulers;
  for (int s = 0; s < kSchedulers; ++s) {
    schedulers.emplace_back([&, s] {
      for (int i = 0; i < kParentsEach; ++i) {
        const size_t parent = static_cast<size_t>(2 * (s * kParentsEach + i));
        pool.Schedule([&, parent] {
          pool.Schedule([&, parent] {
            runs[parent + 1].fetch_add(1);
            completed.fetch_add(1);
          });
          runs[parent].fetch_add(1);
          completed.fetch_add(1);
        });
      }
    });
  }
  for (auto& t : schedulers) t.join();
  const long expected = 2L * kSchedulers * kParentsEach;
  EXPECT_TRUE(wait_until([&] { return completed.load() >= expected; }, 60s)) << completed.load() << " of " << expected;
  stop = true;
  resizer.join();
  parking.resize(8);
  // A negative check over a sampling window: a task run twice would show within it.
  constexpr auto kRunTwiceWindow = 20ms;
  std::this_thread::sleep_for(kRunTwiceWindow);
  long wrong = 0;
  for (auto& r : runs) wrong += r.load() != 1;
  EXPECT_EQ(wrong, 0) << "tasks lost or run twice";
  EXPECT_EQ(completed.load(), expected);
  EXPECT_GT(parking.parks(), 0u);
}

TEST(PoolParking, AtMostTheActiveCountRunsAtOnce) {
  Eigen::ThreadPool pool(6);
  PoolParking parking(pool);
  for (int active : {6, 3, 1, 4, 2}) {
    parking.resize(active);
    std::atomic<int> running{0}, most{0};
    std::atomic<long> completed{0};
    constexpr long kTasks = 300;
    for (long i = 0; i < kTasks; ++i) {
      pool.Schedule([&] {
        const int now = running.fetch_add(1) + 1;
        int seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
        std::this_thread::sleep_for(50us);
        running.fetch_sub(1);
        completed.fetch_add(1);
      });
    }
    ASSERT_TRUE(wait_until([&] { return completed.load() == kTasks; }, 30s));
    EXPECT_LE(most.load(), active) << "active " << active;
  }
}

TEST(PoolParking, ParkedWorkersRunNoTaskAndUseNoCpu) {
  Eigen::ThreadPool pool(4);
  PoolParking parking(pool);
  parking.resize(1);
  const std::vector<pid_t> parked = parking.parked_tids();
  ASSERT_EQ(parked.size(), 3u);
  std::vector<uint64_t> before;
  for (pid_t tid : parked) before.push_back(cpu_ns(tid));
  // 300 ms of work scheduled from outside onto every queue.
  std::mutex runners_mutex;
  std::set<pid_t> runners;
  std::atomic<long> done{0};
  const auto until = std::chrono::steady_clock::now() + 300ms;
  long scheduled = 0;
  while (std::chrono::steady_clock::now() < until) {
    for (int i = 0; i < 16; ++i, ++scheduled) {
      pool.Schedule([&] {
        volatile double x = 0;
        for (int k = 0; k < 20000; ++k) x = x + k * 0.5;
        {
          std::lock_guard lock(runners_mutex);
          runners.insert(this_tid());
        }
        done.fetch_add(1);
      });
    }
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_TRUE(wait_until([&] { return done.load() == scheduled; }, 30s));
  for (size_t i = 0; i < parked.size(); ++i) {
    EXPECT_EQ(runners.count(parked[i]), 0u) << "parked worker " << parked[i] << " ran a task";
    // The stall guard's probe keeps the one running worker busy enough that no loan happens; a
    // parked worker sleeps on its condition variable: well under 1 ms of cpu in 300 ms.
    EXPECT_LT(cpu_ns(parked[i]) - before[i], 1'000'000u) << "parked worker " << parked[i] << " used cpu";
  }
  EXPECT_EQ(parking.loans(), 0u);
}

TEST(PoolParking, NestedParallelForWithOneRunningWorkerFinishes) {
  // Hazard 2: an outer task runs a parallelFor sized for the whole pool (as TensorFlow's ParallelFor
  // is: it does not re-read the count) and waits for it; its children sit in its own worker's
  // queue. With one worker running and the rest parked, nobody is free to take them.
  Eigen::ThreadPool pool(4);
  const Eigen::ThreadPoolDevice full(&pool, 4);
  auto nested_region = [&](std::atomic<int>& finished) {
    pool.Schedule([&] {
      std::vector<int> cells(4096, 0);
      full.parallelFor(4096, Eigen::TensorOpCost(0, 0, 100000), [&](Eigen::Index first, Eigen::Index last) {
        for (Eigen::Index i = first; i < last; ++i) cells[static_cast<size_t>(i)] = 1;
      });
      finished.store(std::count(cells.begin(), cells.end(), 1));
    });
  };
  {
    // Without the stall guard the region is stuck (this is the hazard) until a resize releases a
    // worker.
    PoolParking::Options no_guard;
    no_guard.stall_after = 0ms;  // (0 disables the guard: for this demonstration only)
    PoolParking parking(pool, no_guard);
    parking.resize(1);
    std::atomic<int> finished{-1};
    nested_region(finished);
    // A negative check over a sampling window: without the guard the region must still be stuck
    // at its end (it would finish well within the window otherwise).
    constexpr auto kStuckWindow = 500ms;
    std::this_thread::sleep_for(kStuckWindow);
    EXPECT_EQ(finished.load(), -1) << "the hazard did not occur: the test no longer proves the guard";
    parking.resize(4);
    EXPECT_TRUE(wait_until([&] { return finished.load() == 4096; }, 10s));
  }
  PoolParking parking(pool);
  parking.resize(1);
  for (int round = 0; round < 3; ++round) {
    std::atomic<int> finished{-1};
    nested_region(finished);
    EXPECT_TRUE(wait_until([&] { return finished.load() == 4096; }, 10s)) << "round " << round;
  }
  EXPECT_GT(parking.loans(), 0u) << "the guard lent no worker: how did the region finish?";
  // Once the region is done the loans are taken back: three workers parked again.
  EXPECT_TRUE(wait_until([&] { return parking.parked_now() == 3; }, 5s)) << parking.parked_now();
  // A device sized with the running count runs a one-worker region inline: no loan needed.
  const uint64_t loans = parking.loans();
  const Eigen::ThreadPoolDevice sized(&pool, parking.active_threads());
  std::atomic<int> finished{-1};
  pool.Schedule([&] {
    std::vector<int> cells(4096, 0);
    sized.parallelFor(4096, Eigen::TensorOpCost(0, 0, 100000), [&](Eigen::Index first, Eigen::Index last) {
      for (Eigen::Index i = first; i < last; ++i) cells[static_cast<size_t>(i)] = 1;
    });
    finished.store(std::count(cells.begin(), cells.end(), 1));
  });
  EXPECT_TRUE(wait_until([&] { return finished.load() == 4096; }, 10s));
  EXPECT_EQ(parking.loans(), loans);
}

TEST(PoolParking, ExitWithWorkersParkedDoesNotHang) {
  // Hazard 3: a static pool is destroyed at exit, which joins its workers; parked ones must have
  // been released by then. The child leaks its PoolParking, as a framework's global pool would.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    alarm(20);  // the child's own watchdog: a hang dies of SIGALRM
    static Eigen::ThreadPool pool(4);
    auto* parking = new PoolParking(pool);
    parking->resize(1);
    if (parking->parked_now() != 3) _exit(3);
    std::exit(0);  // runs atexit handlers and static destructors
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child did not exit (signal " << WTERMSIG(status) << "): exit hung";
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(PoolParking, APoolIsDestroyedAfterItsParkingWithoutHanging) {
  // Hazard 4: the parking's destructor releases every parked worker and waits for them, so the
  // pool's own destructor (which joins its workers) then returns.
  for (int round = 0; round < 20; ++round) {
    auto pool = std::make_unique<Eigen::ThreadPool>(4);
    auto parking = std::make_unique<PoolParking>(*pool);
    parking->resize(1 + round % 3);
    std::atomic<long> done{0};
    for (int i = 0; i < 100; ++i) pool->Schedule([&] { done.fetch_add(1); });
    parking.reset();
    pool.reset();  // joins: hangs if a worker were still parked
    EXPECT_EQ(done.load(), 100);
  }
}

TEST(PoolParking, ASecondParkingOfTheSamePoolIsRefused) {
  // Two parkings of one pool could park every worker between them (hazard 1).
  Eigen::ThreadPool pool(3);
  auto first = std::make_unique<PoolParking>(pool);
  EXPECT_THROW(PoolParking second(pool), std::invalid_argument);
  first->resize(1);
  EXPECT_EQ(first->parked_now(), 2);
  first.reset();
  PoolParking again(pool);  // once the first is gone
  EXPECT_EQ(again.resize(2), 2);
}

TEST(PoolParking, ATaskRunInlineByAFullQueueNeverBlocksTheCaller) {
  // Eigen runs a task on the scheduling thread when the chosen queue is full (1024 tasks). A parker
  // (or census, or rendezvous task) run that way must not block the caller; the parker is sent
  // again later, once there is room.
  Eigen::ThreadPool pool(2);
  PoolParking::Options options;
  options.settle_timeout = 300ms;
  PoolParking parking(pool, options);
  std::mutex gate_mutex;
  std::condition_variable gate;
  bool open = false;
  std::atomic<int> held{0};
  for (int i = 0; i < 2; ++i) {
    pool.Schedule([&] {
      held.fetch_add(1);
      std::unique_lock lock(gate_mutex);
      gate.wait(lock, [&] { return open; });
    });
  }
  ASSERT_TRUE(wait_until([&] { return held.load() == 2; }, 10s));
  std::atomic<long> ran{0};
  for (int i = 0; i < 2 * 1024 + 64; ++i) pool.Schedule([&] { ran.fetch_add(1); });  // both queues full
  const auto started = std::chrono::steady_clock::now();
  EXPECT_EQ(parking.resize(1), 1);  // the parker runs inline here, returns, and resize() gives up
  EXPECT_LT(std::chrono::steady_clock::now() - started, 5s) << "resize() blocked its caller";
  EXPECT_EQ(parking.run_on_each_running_worker([] {}, 200ms), 0);  // nobody free: returns, bounded
  {
    std::lock_guard lock(gate_mutex);
    open = true;
  }
  gate.notify_all();
  EXPECT_TRUE(wait_until([&] { return ran.load() == 2 * 1024 + 64; }, 30s));
  EXPECT_TRUE(wait_until([&] { return parking.parked_now() == 1; }, 10s))
      << "the parker run inline was not sent again: " << parking.parked_now() << " parked";
  EXPECT_EQ(parking.run_on_each_running_worker([] {}), 1);
}

TEST(PoolParking, GlueParksAndPinsFromAnAllocation) {
  cpu_set_t usable;
  ASSERT_EQ(sched_getaffinity(0, sizeof usable, &usable), 0);
  int first_cpu = -1;
  for (int c = 0; c < CPU_SETSIZE && first_cpu < 0; ++c)
    if (CPU_ISSET(c, &usable)) first_cpu = c;
  ASSERT_GE(first_cpu, 0);

  Eigen::ThreadPool intra(4), inter(3);
  PoolParking intra_parking(intra), inter_parking(inter);
  mall::tf::PoolAttachment attachment{&intra_parking, &inter_parking};
  mall_alloc_t alloc{};
  alloc.generation = 2;
  alloc.ncpus = 1;
  alloc.mask[first_cpu / 64] |= uint64_t{1} << (first_cpu % 64);
  std::snprintf(alloc.cpus, sizeof alloc.cpus, "%d", first_cpu);
  mall::tf::apply_allocation_to_pools(&alloc, &attachment);
  EXPECT_EQ(intra_parking.active_threads(), 1);
  EXPECT_EQ(intra_parking.parked_now(), 3);
  EXPECT_EQ(inter_parking.parked_now(), 2);
  for (pid_t tid : intra_parking.worker_tids()) EXPECT_EQ(cpus_allowed_list(tid), alloc.cpus) << tid;
  for (pid_t tid : inter_parking.worker_tids()) EXPECT_EQ(cpus_allowed_list(tid), alloc.cpus) << tid;

  // Back to every usable cpu, nthreads 2 (an admin's --threads): two workers run.
  std::memset(alloc.mask, 0, sizeof alloc.mask);
  alloc.ncpus = CPU_COUNT(&usable);
  alloc.nthreads = std::min(2, alloc.ncpus);
  for (int c = 0; c < CPU_SETSIZE && c < MALL_MAX_CPUS; ++c)
    if (CPU_ISSET(c, &usable)) alloc.mask[c / 64] |= uint64_t{1} << (c % 64);
  mall::tf::apply_allocation_to_pools(&alloc, &attachment);
  EXPECT_EQ(intra_parking.active_threads(), alloc.nthreads);
  EXPECT_EQ(intra_parking.parked_now(), 4 - alloc.nthreads);
  for (pid_t tid : intra_parking.worker_tids()) {
    cpu_set_t now;
    ASSERT_EQ(sched_getaffinity(tid, sizeof now, &now), 0);
    EXPECT_TRUE(CPU_EQUAL(&now, &usable)) << tid;
  }
  // An allocation with no cpus (never attached) changes nothing.
  mall_alloc_t empty{};
  mall::tf::apply_allocation_to_pools(&empty, &attachment);
  EXPECT_EQ(intra_parking.active_threads(), alloc.nthreads);
}

}  // namespace
