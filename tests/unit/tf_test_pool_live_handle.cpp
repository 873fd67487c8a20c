// SPDX-License-Identifier: BSD-3-Clause
// Proves that Eigen's own pool, parked by mall (PoolParking attached to a live libmall handle with
// mall::tf::attach_pool), stays
// exact while every kind of thread a training process has uses that handle at once: the stepping
// thread steps and runs parallelFor on the pool, the pool's workers report progress, side threads
// bind and unbind themselves and wait on mall_fd(), and the (fake, in-process) malld publishes new
// allocations and restarts meanwhile. Written for ThreadSanitizer (tests/tsan/run-tsan.sh); in a
// plain build it checks the same results.
#define EIGEN_USE_THREADS
#include <mall/tf/mall_pool_glue.hpp>
#include <mall/tf/pool_parking.hpp>

#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <unsupported/Eigen/CXX11/Tensor>

#include "support/fake_daemon.hpp"
#include "support/watchdog.h"

namespace {

using namespace std::chrono_literals;
using mall::test::FakeDaemon;
using mall::tf::PoolParking;

// A hang fails the program instead of stalling the suite (ctest's TIMEOUT is 120 s).
MALL_TEST_WATCHDOG(110);

constexpr int kPoolThreads = 4;

// Cpu lists of 1 to 4 cpus that each hold a cpu this process may use, so pinning never fails
// (the kernel drops ids that do not exist; the pool still follows the list's size).
std::vector<std::string> allocation_lists() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) CPU_SET(0, &allowed);
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &allowed)) cpus.push_back(cpu);
  const std::string first = std::to_string(cpus.front());
  std::vector<std::string> lists = {first, first + ",900", first + ",900-901", first + ",900-902"};
  if (cpus.size() >= 2) lists.push_back(first + "," + std::to_string(cpus[1]));
  return lists;
}

// A copy of the allocation whose parts agree with each other (a torn copy would not).
bool allocation_consistent(const mall_alloc_t& alloc) {
  int bits = 0;
  for (uint64_t word : alloc.mask) bits += std::popcount(word);
  return bits == alloc.ncpus && std::memchr(alloc.cpus, '\0', sizeof alloc.cpus) != nullptr;
}

class PoolLiveHandle : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/mall-pool-handle-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    socket_ = dir_ + "/malld.sock";
    for (const char* name : {"MALL_JOB_ID", "MALL_MIN", "MALL_MAX", "MALL_SOCKET"}) unsetenv(name);
    daemon_ = std::make_unique<FakeDaemon>(socket_);
  }
  void TearDown() override {
    if (m_ != nullptr) mall_close(m_);
    daemon_.reset();
    unlink(socket_.c_str());
    rmdir(dir_.c_str());
  }

  // The whole process: stepping thread + pool workers + binders + an fd poller, against a daemon
  // that publishes `changes` allocations and restarts every `restart_every` of them (renaming the
  // job at each restart when rename_job is set).
  void run_process(int changes, int restart_every, bool rename_job);

  std::string dir_, socket_;
  std::unique_ptr<FakeDaemon> daemon_;
  mall_t* m_ = nullptr;
};

void PoolLiveHandle::run_process(int changes, int restart_every, bool rename_job) {
  const std::vector<std::string> lists = allocation_lists();
  std::string error;
  ASSERT_TRUE(daemon_->start(1, lists.back(), &error)) << error;
  mall_error_t err{};
  ASSERT_EQ(mall_open(socket_.c_str(), &m_, &err), MALL_SUCCESS) << err.text;
  Eigen::ThreadPool pool(kPoolThreads);
  PoolParking parking(pool);  // after the pool: released before it goes
  parking.resize(1);
  ASSERT_EQ(mall::tf::attach_pool(m_, parking), MALL_SUCCESS);
  mall_t* const m = m_;

  std::atomic<bool> stop{false};
  std::atomic<int> inconsistent{0}, fd_wakeups{0}, bind_failures{0};
  std::vector<std::thread> threads;
  // Stops and joins every side thread, also when an assertion below returns early.
  struct JoinAll {
    std::atomic<bool>& stop;
    std::vector<std::thread>& threads;
    ~JoinAll() {
      stop = true;
      for (auto& thread : threads) thread.join();
    }
  } join_all{stop, threads};

  // Threads that come and go from the re-pin list, as short-lived helper threads do.
  for (int b = 0; b < 2; ++b) {
    threads.emplace_back([&] {
      while (!stop.load()) {
        if (mall_bind_thread(m) != MALL_SUCCESS) bind_failures.fetch_add(1);
        std::this_thread::sleep_for(200us);
        mall_unbind_thread(m);
      }
    });
  }
  // An event loop: waits on mall_fd() and reads the handle's state (never steps).
  threads.emplace_back([&] {
    const int fd = mall_fd(m);
    std::string job;
    while (!stop.load()) {
      pollfd pfd{fd, POLLIN, 0};
      if (poll(&pfd, 1, 5) == 1) fd_wakeups.fetch_add(1);
      mall_alloc_t alloc{};
      if (mall_get_allocation(m, &alloc) != MALL_SUCCESS || (alloc.generation != 0 && !allocation_consistent(alloc)))
        inconsistent.fetch_add(1);
      if (mall_attached(m) == MALL_SUCCESS) job = mall_job_id(m);  // copies the text
    }
  });
  // malld: publishes (with and without Notify) and restarts, counting generations upwards.
  std::atomic<uint64_t> final_generation{0};
  threads.emplace_back([&] {
    for (int i = 1; i <= changes && !stop.load(); ++i) {
      if (i % restart_every == 0) {
        const uint64_t next = daemon_->generation() + 1;
        daemon_->stop();
        if (rename_job) daemon_->set_job(i / restart_every % 2 ? "job-b" : "job-a");
        std::string start_error;
        if (!daemon_->start(next, lists[static_cast<size_t>(i) % lists.size()], &start_error)) {
          ADD_FAILURE() << "the fake malld did not restart: " << start_error;
          break;
        }
      } else {
        daemon_->publish(lists[static_cast<size_t>(i) % lists.size()], /*notify=*/i % 3 != 0);
      }
      std::this_thread::sleep_for(3ms);
    }
    final_generation = daemon_->publish(lists.front(), /*notify=*/true);
  });

  // The stepping thread: a training loop whose kernels run on the pool and report progress.
  constexpr Eigen::Index kElements = 2048;
  std::vector<long> values(kElements, 0);
  int step = 0, applied = 0;
  mall_alloc_t seen{};
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  for (;; ++step) {
    if (mall_step(m) == MALL_SUCCESS) ++applied;
    const Eigen::ThreadPoolDevice device(&pool, parking.active_threads());
    device.parallelFor(kElements, Eigen::TensorOpCost(8, 8, 200), [&](Eigen::Index first, Eigen::Index last) {
      for (Eigen::Index i = first; i < last; ++i) values[static_cast<size_t>(i)] = i * 3 + step;
      mall_report_progress(m, static_cast<uint64_t>(last - first));
    });
    for (Eigen::Index i = 0; i < kElements; ++i)
      ASSERT_EQ(values[static_cast<size_t>(i)], i * 3 + step) << "step " << step << " with " << parking.active_threads();
    const uint64_t target = final_generation.load();
    if (target != 0 && mall_get_allocation(m, &seen) == MALL_SUCCESS && seen.generation == target) break;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline)
        << "the last allocation (generation " << target << ") was not applied; " << applied << " applied";
  }
  // The last allocation was applied before its ack, and the pool follows it.
  EXPECT_EQ(seen.ncpus, 1);
  EXPECT_EQ(parking.active_threads(), 1);
  EXPECT_EQ(parking.parked_now(), kPoolThreads - 1);
  EXPECT_TRUE(daemon_->wait_for_ack(final_generation.load(), 5s));
  EXPECT_GT(applied, 1);
  EXPECT_EQ(inconsistent.load(), 0);
  EXPECT_EQ(bind_failures.load(), 0);
  std::printf("steps %d, allocations applied %d, fd wake-ups %d\n", step + 1, applied, fd_wakeups.load());
}

TEST_F(PoolLiveHandle, EveryThreadUsesTheHandleWhileAllocationsChangeAndMalldRestarts) {
  run_process(/*changes=*/240, /*restart_every=*/40, /*rename_job=*/false);
}

// The same with a job name that changes at each restart (a malld that forgot a self-registered
// job names the new one differently). Regression (issue 12): libmall rewrote the text
// mall_job_id() had returned (snprintf into the handle's job_id on re-attach) while the poller was
// still reading it, which ThreadSanitizer reports here; mall.h now promises that text never changes
// until mall_close().
TEST_F(PoolLiveHandle, JobRenamedAtEachRestart) {
  run_process(/*changes=*/600, /*restart_every=*/20, /*rename_job=*/true);
}

}  // namespace
