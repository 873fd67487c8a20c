// Benchmarks the resizable pool against Eigen's own ThreadPool at a fixed size (contractions and
// parallelFor through a ThreadPoolDevice) and times resize() in both directions. Measures only.
#define EIGEN_USE_THREADS
#include <mall/tf/resizable_thread_pool.hpp>

#include <benchmark/benchmark.h>

#include <unsupported/Eigen/CXX11/Tensor>

#include <atomic>
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

// Resize cost, on pools of state.range(0) workers (more workers than cores is fine: parked ones
// sleep). Shrink: max -> 1, from the call until it returns, i.e. until every parked worker is idle
// (no task of theirs still runs). Grow: 1 -> max, from the call until all max workers are running
// at once (each runs one task that waits, yielding, until all have started), which includes the
// wake-up of every parked worker.
void BM_ResizablePool_Shrink(benchmark::State& state) {
  mall::tf::ResizableThreadPool pool(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    state.PauseTiming();
    pool.resize(pool.max_threads());
    state.ResumeTiming();
    pool.resize(1);
  }
}
void BM_ResizablePool_GrowUntilAllRunning(benchmark::State& state) {
  mall::tf::ResizableThreadPool pool(static_cast<int>(state.range(0)));
  const int workers = pool.max_threads();
  std::atomic<int> started{0}, finished{0};
  for (auto _ : state) {
    state.PauseTiming();
    pool.resize(1);
    started = 0;
    finished = 0;
    state.ResumeTiming();
    pool.resize(workers);
    for (int i = 0; i < workers; ++i) {
      pool.Schedule([&] {
        started.fetch_add(1);
        while (started.load() < workers) std::this_thread::yield();
        finished.fetch_add(1);
      });
    }
    while (started.load() < workers) std::this_thread::yield();
    state.PauseTiming();
    while (finished.load() < workers) std::this_thread::yield();
    state.ResumeTiming();
  }
}

BENCHMARK(BM_EigenPool_Contraction)->Arg(128)->Arg(512)->UseRealTime();
BENCHMARK(BM_ResizablePool_Contraction)->Arg(128)->Arg(512)->UseRealTime();
BENCHMARK(BM_EigenPool_ParallelFor)->Arg(1 << 16)->Arg(1 << 22)->UseRealTime();
BENCHMARK(BM_ResizablePool_ParallelFor)->Arg(1 << 16)->Arg(1 << 22)->UseRealTime();
BENCHMARK(BM_ResizablePool_Shrink)->Arg(2)->Arg(8)->UseRealTime();
BENCHMARK(BM_ResizablePool_GrowUntilAllRunning)->Arg(2)->Arg(8)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
