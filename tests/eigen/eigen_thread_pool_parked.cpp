// SPDX-License-Identifier: BSD-3-Clause
// eigen_thread_pool_parked.cpp — Eigen's own test of its thread pool and tensor device
// (unsupported/test/cxx11_tensor_thread_pool.cpp), run with mall's parking under every pool it
// makes: each Eigen::ThreadPool of N workers has PoolParking park all but max(1, N/2) of them for
// its whole life, while the test still sizes its devices with N (as a framework that does not
// re-read the count would), so Eigen's kernels, async evaluation, reductions and allocator paths
// run with their work landing in parked workers' queues. The test file is Eigen's, from Debian's
// eigen3 source package, fetched at test time by run-eigen-pool-test.sh: none of it is in this
// repository. This file only renames the pool type the test makes (a macro defined after Eigen's
// headers are in, so it reaches the test's own code and nothing of Eigen).
#define EIGEN_USE_THREADS
#include "main.h"
#include <Eigen/CXX11/Tensor>

#include <mall/tf/pool_parking.hpp>

namespace Eigen {

// Eigen's own ThreadPool, with half its workers parked from birth to death (the parking is a
// member, so it is destroyed, and the workers released, before the pool joins them).
class MallParkedThreadPool : public ThreadPool {
 public:
  explicit MallParkedThreadPool(int threads) : ThreadPool(threads), parking_(*this) {
    parking_.resize((std::max)(1, threads / 2));
    ++pools_made;
    parked_at_most = (std::max)(parked_at_most, parking_.parked_now());
  }
  static inline int pools_made = 0;
  static inline int parked_at_most = 0;

 private:
  mall::tf::PoolParking parking_;
};

}  // namespace Eigen

#define ThreadPool MallParkedThreadPool
#include "cxx11_tensor_thread_pool.cpp"
#undef ThreadPool

// Proof that the parked pools were the ones used: printed at exit by the harness script.
namespace {
struct ReportAtExit {
  ~ReportAtExit() {
    std::printf("mall: %d pools made, up to %d workers parked in one\n", Eigen::MallParkedThreadPool::pools_made,
                Eigen::MallParkedThreadPool::parked_at_most);
  }
} report_at_exit;
}  // namespace
