// SPDX-License-Identifier: BSD-3-Clause
// tf_bench_pool.cpp — what parking costs against the framework's own pool (measures only; the
// ratios are printed by launch_scripts/bench-pool.sh). For each kernel case and each running count
// A, two ways, registered one after the other so a run interleaves them:
//   own/<case>/A     Eigen's ThreadPool made with A threads, device sized A (a rigid job)
//   parked/<case>/A  Eigen's ThreadPool made with N threads, PoolParking parked to A, device sized A
//                    (a malleable job: at A = N nothing is parked, so parked/N vs own/N is the cost
//                    of being malleable at full size)
// Cases: contraction 128 and 512 (n x n by n x n), an MLP training step (batch 512, 64 inputs,
// 1024 hidden, 10 outputs: forward, backward, update, as mall_train_digits does it), parallelFor
// over 64k and 4M floats.
// Usage: tf_bench_pool [--pool-threads N] [--active A1,A2,...] [Google Benchmark flags]
//        (defaults: N = the online cpus, A = N, N/2, N/4, each at least 1, duplicates dropped).
#define EIGEN_USE_THREADS
#include <mall/tf/pool_parking.hpp>

#include <benchmark/benchmark.h>

#include <unsupported/Eigen/CXX11/Tensor>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using Matrix = Eigen::Tensor<float, 2, Eigen::RowMajor>;
using Dims = Eigen::array<Eigen::IndexPair<int>, 1>;
const Dims kMatMul = {Eigen::IndexPair<int>(1, 0)};
const Dims kATimesB = {Eigen::IndexPair<int>(0, 0)};
const Dims kATimesBT = {Eigen::IndexPair<int>(1, 1)};

// A pool as a job runs it: own (made with A threads) or parked (made with N, parked to A).
struct JobPool {
  Eigen::ThreadPool pool;
  std::optional<mall::tf::PoolParking> parking;
  int running;
  JobPool(bool parked, int pool_threads, int active) : pool(parked ? pool_threads : active), running(active) {
    if (parked) {
      parking.emplace(pool);
      parking->resize(active);
    }
  }
  Eigen::ThreadPoolDevice device() { return Eigen::ThreadPoolDevice(&pool, running); }
};

void contraction(benchmark::State& state, JobPool& job, Eigen::Index n) {
  Matrix a(n, n), b(n, n), c(n, n);
  a.setRandom();
  b.setRandom();
  const Eigen::ThreadPoolDevice device = job.device();
  for (auto _ : state) {
    c.device(device) = a.contract(b, kMatMul);
    benchmark::DoNotOptimize(c.data());
  }
  state.SetItemsProcessed(state.iterations() * 2 * n * n * n);  // flops
}

void mlp_step(benchmark::State& state, JobPool& job) {
  constexpr Eigen::Index kBatch = 512, kIn = 64, kHidden = 1024, kOut = 10;
  Matrix x(kBatch, kIn), w1(kIn, kHidden), w2(kHidden, kOut), z1(kBatch, kHidden), a1(kBatch, kHidden);
  Matrix logits(kBatch, kOut), dlogits(kBatch, kOut), da1(kBatch, kHidden), dz1(kBatch, kHidden);
  Matrix dw1(kIn, kHidden), dw2(kHidden, kOut);
  x.setRandom();
  w1.setRandom();
  w2.setRandom();
  dlogits.setRandom();
  const Eigen::ThreadPoolDevice device = job.device();
  for (auto _ : state) {
    z1.device(device) = x.contract(w1, kMatMul);
    a1.device(device) = z1.cwiseMax(0.0f);
    logits.device(device) = a1.contract(w2, kMatMul);
    dw2.device(device) = a1.contract(dlogits, kATimesB);
    da1.device(device) = dlogits.contract(w2, kATimesBT);
    dz1.device(device) = (z1 > z1.constant(0.0f)).select(da1, da1.constant(0.0f));
    dw1.device(device) = x.contract(dz1, kATimesB);
    w1.device(device) -= dw1 * 1e-6f;
    w2.device(device) -= dw2 * 1e-6f;
    benchmark::DoNotOptimize(w1.data());
  }
  state.SetItemsProcessed(state.iterations() * kBatch);  // images
}

void parallel_for(benchmark::State& state, JobPool& job, Eigen::Index n) {
  std::vector<float> values(static_cast<size_t>(n), 1.0f);
  const Eigen::ThreadPoolDevice device = job.device();
  for (auto _ : state) {
    device.parallelFor(n, Eigen::TensorOpCost(4, 4, 8), [&](Eigen::Index first, Eigen::Index last) {
      for (Eigen::Index i = first; i < last; ++i) values[static_cast<size_t>(i)] = values[static_cast<size_t>(i)] * 0.999f + 0.001f;
    });
    benchmark::DoNotOptimize(values.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
}

struct Case {
  const char* name;
  std::function<void(benchmark::State&, JobPool&)> run;
};

std::vector<int> parse_list(const char* text) {
  std::vector<int> out;
  std::stringstream list(text);
  for (std::string item; std::getline(list, item, ',');) {
    char* end = nullptr;
    const long value = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || value < 1 || value > 4096) return {};
    out.push_back(static_cast<int>(value));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int pool_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<int> active;
  std::vector<char*> rest{argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--pool-threads" || arg == "--active") && i + 1 < argc) {
      const std::vector<int> values = parse_list(argv[++i]);
      if (values.empty() || (arg == "--pool-threads" && values.size() != 1)) {
        std::fprintf(stderr, "tf_bench_pool: %s needs %s, got '%s'\n", arg.c_str(),
                     arg == "--active" ? "a list of counts 1..4096 (e.g. 16,8,4)" : "one count 1..4096", argv[i]);
        return 2;
      }
      if (arg == "--pool-threads") pool_threads = values[0];
      else active = values;
    } else {
      rest.push_back(argv[i]);
    }
  }
  if (active.empty()) active = {pool_threads, pool_threads / 2, pool_threads / 4};
  for (int& a : active) a = std::clamp(a, 1, pool_threads);
  std::sort(active.rbegin(), active.rend());
  active.erase(std::unique(active.begin(), active.end()), active.end());

  const std::vector<Case> cases = {
      {"contraction128", [](benchmark::State& s, JobPool& j) { contraction(s, j, 128); }},
      {"contraction512", [](benchmark::State& s, JobPool& j) { contraction(s, j, 512); }},
      {"mlp512x64x1024x10", [](benchmark::State& s, JobPool& j) { mlp_step(s, j); }},
      {"parallelfor64k", [](benchmark::State& s, JobPool& j) { parallel_for(s, j, 64 * 1024); }},
      {"parallelfor4M", [](benchmark::State& s, JobPool& j) { parallel_for(s, j, 4 * 1024 * 1024); }},
  };
  for (const Case& c : cases) {
    for (int a : active) {
      for (const bool parked : {false, true}) {
        const std::string name = std::string(parked ? "parked/" : "own/") + c.name + "/" + std::to_string(a);
        benchmark::RegisterBenchmark(name.c_str(), [c, parked, pool_threads, a](benchmark::State& state) {
          JobPool job(parked, pool_threads, a);
          c.run(state, job);
        })->UseRealTime()->Unit(benchmark::kMicrosecond);
      }
    }
  }
  int rest_count = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_count, rest.data());
  if (benchmark::ReportUnrecognizedArguments(rest_count, rest.data())) return 2;
  std::fprintf(stderr, "tf_bench_pool: pools of %d threads\n", pool_threads);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
