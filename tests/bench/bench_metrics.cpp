// SPDX-License-Identifier: BSD-3-Clause
// bench_metrics.cpp — what malld's metrics cost it, on its event loop: the status object with
// every job's accounting (NodeManager::status(now)) and its Prometheus text (render_prometheus),
// for nodes with 1 to 256 jobs. malld does both once per --metrics-interval, and for each
// `mallctl status` / `mallctl metrics`. The labels give the sizes: a status reply must fit the
// protocol's 64 KiB payload (common/protocol.hpp), the metrics file need not. BM_StateCheckpoint:
// one accounting checkpoint (malld --checkpoint-interval) as malld's writer thread does it, the
// state file written atomically with its fsync in a temporary folder (on /tmp: the figure depends
// on the disk under --state-dir).
// Run: build/bin/bench_metrics [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>

#include "common/metrics_text.hpp"
#include "daemon/core/node_manager.hpp"
#include "daemon/state_file.hpp"
#include "support/core_effects.hpp"

namespace {

using namespace std::chrono_literals;


// A 256-cpu node (2 packages x 64 cores x 2 threads) with `jobs` registered jobs, each acked once.
struct Node {
    explicit Node(int jobs) {
        std::string error;
        topology = mall::Topology::load("pack:2 core:64 pu:2", &error);
        manager = std::make_unique<mall::NodeManager>(*topology, topology->all_cpus(), mall::PolicyKind::Equal,
                                                      2000ms, effects);
        for (int i = 0; i < jobs; ++i) {
            mall::JobSpec spec;
            spec.id = "slurm-" + std::to_string(1000 + i);
            spec.uid = 1000 + static_cast<uid_t>(i % 7);
            spec.min = 1;
            spec.max = 256 / jobs;
            spec.pids = {10000 + i};
            manager->register_job(spec, start);
            manager->attach(spec.id, static_cast<uint64_t>(i + 1));
        }
        for (const auto &[id, job] : manager->jobs())
            manager->ack(id, job.attachments.begin()->first, job.generation, start + 3ms);
    }
    mall::test::EventLogEffects effects;
    std::unique_ptr<mall::Topology> topology;
    std::unique_ptr<mall::NodeManager> manager;
    mall::TimePoint start = mall::Clock::now();
};

void BM_StatusWithAccounting(benchmark::State &state) {
    Node node(static_cast<int>(state.range(0)));
    size_t bytes = 0;
    for (auto _ : state) {
        nlohmann::json status = node.manager->status(node.start + 10s);
        bytes = status.dump().size();
        benchmark::DoNotOptimize(status);
    }
    state.SetLabel(std::to_string(state.range(0)) + " jobs, " + std::to_string(bytes / 1024) + " KiB of JSON");
}
BENCHMARK(BM_StatusWithAccounting)->Arg(1)->Arg(16)->Arg(64)->Arg(256)->Unit(benchmark::kMicrosecond);

void BM_RenderPrometheus(benchmark::State &state) {
    Node node(static_cast<int>(state.range(0)));
    nlohmann::json status = node.manager->status(node.start + 10s);
    status["backend"] = "cgroup-v1";
    size_t bytes = 0;
    for (auto _ : state) {
        std::string text = mall::render_prometheus(status);
        bytes = text.size();
        benchmark::DoNotOptimize(text);
    }
    state.SetLabel(std::to_string(state.range(0)) + " jobs, " + std::to_string(bytes / 1024) + " KiB of text");
}
BENCHMARK(BM_RenderPrometheus)->Arg(1)->Arg(16)->Arg(64)->Arg(256)->Unit(benchmark::kMicrosecond);

void BM_StateCheckpoint(benchmark::State &state) {
    Node node(static_cast<int>(state.range(0)));
    mall::SavedState saved;
    saved.pool = node.topology->all_cpus().to_string();
    saved.policy = "equal";
    for (const auto &[id, job] : node.manager->jobs()) {
        mall::SavedJob one;
        one.job = job;
        mall::NodeManager::account(one.job, node.start + 10s);
        for (pid_t pid : job.spec.pids) one.pids.push_back({pid, 12345});
        one.times = {1.7e9, 1.7e9 + 10, std::nullopt};
        one.has_times = true;
        saved.jobs.push_back(std::move(one));
    }
    saved.totals = node.manager->totals();
    char folder[] = "/tmp/mall_bench_state.XXXXXX";
    if (::mkdtemp(folder) == nullptr) {
        state.SkipWithError("mkdtemp failed");
        return;
    }
    std::string error;
    for (auto _ : state) {
        if (!mall::save_state(folder, saved, &error)) {
            state.SkipWithError(error.c_str());
            break;
        }
    }
    const auto bytes = std::filesystem::file_size(std::string(folder) + "/malld.state.json");
    std::filesystem::remove_all(folder);
    state.SetLabel(std::to_string(state.range(0)) + " jobs, " + std::to_string(bytes / 1024) + " KiB file");
}
BENCHMARK(BM_StateCheckpoint)->Arg(1)->Arg(16)->Arg(64)->Arg(256)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
