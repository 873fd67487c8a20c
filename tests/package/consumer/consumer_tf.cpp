// A user's C++ program on the installed mall::tf: runs an Eigen parallelFor on the resizable pool
// before and after a resize, and checks the libmall glue refuses a null handle. Exit 0 when right.
#define EIGEN_USE_THREADS
#include <cstdio>
#include <vector>

#include <unsupported/Eigen/CXX11/Tensor>

#include <mall/tf/mall_pool_glue.hpp>
#include <mall/tf/resizable_thread_pool.hpp>

int main() {
    mall::tf::ResizableThreadPool pool(2);
    std::vector<int> hits(1000, 0);
    for (int size : {2, 1, 2}) {
        pool.resize(size);
        Eigen::ThreadPoolDevice device(&pool, pool.NumThreads());
        device.parallelFor(1000, Eigen::TensorOpCost(1, 1, 10),
                           [&](Eigen::Index first, Eigen::Index last) {
                               for (Eigen::Index i = first; i < last; ++i) ++hits[i];
                           });
        if (pool.NumThreads() != size) return 1;
    }
    for (int h : hits)
        if (h != 3) return 1;
    if (mall::tf::attach_pool(nullptr, pool) != MALL_ERR_INVAL) return 1;
    std::puts("consumer_tf: ok");
    return 0;
}
