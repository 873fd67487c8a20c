// Benchmarks the resizable pool against Eigen's own ThreadPool at a fixed size (contractions and
// parallelFor through a ThreadPoolDevice) and times resize() in both directions. Measures only.
#define EIGEN_USE_THREADS
#include <mall/tf/resizable_thread_pool.hpp>

#include <benchmark/benchmark.h>

#include <unsupported/Eigen/CXX11/Tensor>

#include <thread>
#include <vector>

namespace {

int machine_threads() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

template <typename Pool>
void run_contraction(benchmark::State& state, Pool& pool) {
  const auto n = static_cast<Eigen::Index>(state.range(0));
  Eigen::ThreadPoolDevice device(&pool, pool.NumThreads());
  Eigen::Tensor<float, 2> a(n, n), b(n, n), c(n, n);
  a.setRandom();
  b.setRandom();
  const Eigen::array<Eigen::IndexPair<int>, 1> dims = {Eigen::IndexPair<int>(1, 0)};
  for (auto _ : state) {
    c.device(device) = a.contract(b, dims);
    benchmark::DoNotOptimize(c.data());
  }
  state.SetItemsProcessed(state.iterations() * 2 * n * n * n);  // flops
}

template <typename Pool>
void run_parallel_for(benchmark::State& state, Pool& pool) {
  const auto n = static_cast<Eigen::Index>(state.range(0));
  Eigen::ThreadPoolDevice device(&pool, pool.NumThreads());
  std::vector<float> values(static_cast<size_t>(n), 1.0f);
  for (auto _ : state) {
    device.parallelFor(n, Eigen::TensorOpCost(4, 4, 8), [&](Eigen::Index first, Eigen::Index last) {
      for (Eigen::Index i = first; i < last; ++i) values[i] = values[i] * 0.999f + 0.001f;
    });
    benchmark::DoNotOptimize(values.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
}

void BM_EigenPool_Contraction(benchmark::State& state) {
  Eigen::ThreadPool pool(machine_threads());
  run_contraction(state, pool);
}
void BM_ResizablePool_Contraction(benchmark::State& state) {
  mall::tf::ResizableThreadPool pool(machine_threads());
  run_contraction(state, pool);
}
void BM_EigenPool_ParallelFor(benchmark::State& state) {
  Eigen::ThreadPool pool(machine_threads());
  run_parallel_for(state, pool);
}
void BM_ResizablePool_ParallelFor(benchmark::State& state) {
  mall::tf::ResizableThreadPool pool(machine_threads());
  run_parallel_for(state, pool);
}

// One shrink (max -> 1, returns once the parked workers are idle) plus one grow (1 -> max, returns
// once the parked workers are woken) per iteration, timed separately via manual timing.
void BM_ResizablePool_Shrink(benchmark::State& state) {
  mall::tf::ResizableThreadPool pool(machine_threads());
  for (auto _ : state) {
    state.PauseTiming();
    pool.resize(pool.max_threads());
    state.ResumeTiming();
    pool.resize(1);
  }
}
void BM_ResizablePool_Grow(benchmark::State& state) {
  mall::tf::ResizableThreadPool pool(machine_threads());
  for (auto _ : state) {
    state.PauseTiming();
    pool.resize(1);
    state.ResumeTiming();
    pool.resize(pool.max_threads());
  }
}

BENCHMARK(BM_EigenPool_Contraction)->Arg(128)->Arg(512)->UseRealTime();
BENCHMARK(BM_ResizablePool_Contraction)->Arg(128)->Arg(512)->UseRealTime();
BENCHMARK(BM_EigenPool_ParallelFor)->Arg(1 << 16)->Arg(1 << 22)->UseRealTime();
BENCHMARK(BM_ResizablePool_ParallelFor)->Arg(1 << 16)->Arg(1 << 22)->UseRealTime();
BENCHMARK(BM_ResizablePool_Shrink)->UseRealTime();
BENCHMARK(BM_ResizablePool_Grow)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
