// SPDX-License-Identifier: BSD-3-Clause
// A user's C++ program on the installed mall::tf: parks workers of Eigen's own ThreadPool
// (PoolParking), runs an Eigen parallelFor sized by the running count before and after each park,
// and checks the libmall glue refuses a null handle. Exit 0 when right.
#define EIGEN_USE_THREADS
#include <cstdio>
#include <vector>

#include <unsupported/Eigen/CXX11/Tensor>

#include <mall/tf/mall_pool_glue.hpp>
#include <mall/tf/pool_parking.hpp>

int main() {
    Eigen::ThreadPool pool(2);
    mall::tf::PoolParking parking(pool);
    std::vector<int> hits(1000, 0);
    for (int size : {2, 1, 2}) {
        parking.resize(size);
        Eigen::ThreadPoolDevice device(&pool, parking.active_threads());
        device.parallelFor(1000, Eigen::TensorOpCost(1, 1, 10),
                           [&](Eigen::Index first, Eigen::Index last) {
                               for (Eigen::Index i = first; i < last; ++i) ++hits[i];
                           });
        if (parking.active_threads() != size || parking.parked_now() != 2 - size) return 1;
    }
    for (int h : hits)
        if (h != 3) return 1;
    if (mall::tf::attach_pool(nullptr, parking) != MALL_ERR_INVAL) return 1;
    std::puts("consumer_tf: ok");
    return 0;
}
