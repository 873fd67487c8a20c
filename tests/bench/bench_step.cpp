// SPDX-License-Identifier: BSD-3-Clause
// bench_step.cpp — measures mall_step(): the fast path (nothing changed) on an attached and on a
// detached handle, and the change path (publish, step with callback and ack, ack received) against
// the in-process fake malld of tests/support. Figures are reported, never asserted.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <benchmark/benchmark.h>

#include "mall/mall.h"
#include "support/fake_daemon.hpp"
#include "support/watchdog.h"

namespace {

using mall::test::FakeDaemon;

struct BenchEnv {
    std::string dir;
    std::string socket;
    std::unique_ptr<FakeDaemon> daemon;
    mall_t *attached = nullptr;
    mall_t *detached = nullptr;
    uint64_t callback_calls = 0;
};

BenchEnv *env = nullptr;

void count_callback(const mall_alloc_t *, void *arg) { ++*static_cast<uint64_t *>(arg); }

void BM_StepNoChangeAttached(benchmark::State &state) {
    for (auto _ : state) benchmark::DoNotOptimize(mall_step(env->attached));
}
BENCHMARK(BM_StepNoChangeAttached);

void BM_StepNoChangeDetached(benchmark::State &state) {
    for (auto _ : state) benchmark::DoNotOptimize(mall_step(env->detached));
}
BENCHMARK(BM_StepNoChangeDetached);

// Both threads of this 2-core machine stepping one handle: the fast path only reads shared lines.
void BM_StepNoChangeAttachedTwoThreads(benchmark::State &state) {
    for (auto _ : state) benchmark::DoNotOptimize(mall_step(env->attached));
}
BENCHMARK(BM_StepNoChangeAttachedTwoThreads)->Threads(2);

// The fake daemon writes a new generation; mall_step() reads it, runs one callback and sends the
// ack (not waited for).
void BM_PublishAndStep(benchmark::State &state) {
    bool flip = false;
    for (auto _ : state) {
        env->daemon->publish(flip ? "0" : "0-1", /*notify=*/false);
        flip = !flip;
        if (mall_step(env->attached) != MALL_SUCCESS) {
            state.SkipWithError("mall_step did not apply the published change");
            break;
        }
    }
}
BENCHMARK(BM_PublishAndStep);

// As above, then waits until the fake daemon's thread has received the ack: a full round trip
// with two thread wake-ups.
void BM_PublishStepAck(benchmark::State &state) {
    // The benchmarks before this one leave a flood of unawaited acks; libmall drops an ack rather
    // than block when the socket is full, so the first change here may go unacked under load.
    // Settle first: the fake daemon has read the backlog once one change is acked.
    bool settled = false;
    for (int attempt = 0; attempt < 5 && !settled; ++attempt) {
        const uint64_t g = env->daemon->publish(attempt % 2 ? "0" : "0-1", /*notify=*/false);
        settled = mall_step(env->attached) == MALL_SUCCESS && env->daemon->wait_for_ack(g, std::chrono::seconds(2));
    }
    if (!settled) {
        state.SkipWithError("no change was acked before the timed loop");
        return;
    }
    bool flip = false;
    for (auto _ : state) {
        uint64_t g = env->daemon->publish(flip ? "0" : "0-1", /*notify=*/false);
        flip = !flip;
        if (mall_step(env->attached) != MALL_SUCCESS || !env->daemon->wait_for_ack(g, std::chrono::seconds(5))) {
            state.SkipWithError("change not applied or not acked");
            break;
        }
    }
}
BENCHMARK(BM_PublishStepAck);

// The change path with the stepping thread bound: adds the sched_setaffinity of one thread.
void BM_PublishAndStepBoundThread(benchmark::State &state) {
    mall_bind_thread(env->attached);
    bool flip = false;
    for (auto _ : state) {
        env->daemon->publish(flip ? "0" : "0-1", /*notify=*/false);
        flip = !flip;
        if (mall_step(env->attached) != MALL_SUCCESS) {
            state.SkipWithError("mall_step did not apply the published change");
            break;
        }
    }
    env->daemon->publish("0-1", false);
    mall_step(env->attached);
    mall_unbind_thread(env->attached);
}
BENCHMARK(BM_PublishAndStepBoundThread);

bool set_up(BenchEnv *e) {
    char pattern[] = "/tmp/mall-bench-step-XXXXXX";
    if (!mkdtemp(pattern)) return false;
    e->dir = pattern;
    e->socket = e->dir + "/malld.sock";
    unsetenv("MALL_JOB_ID");
    e->daemon = std::make_unique<FakeDaemon>(e->socket);
    std::string error;
    if (!e->daemon->start(1, "0-1", &error)) {
        std::fprintf(stderr, "bench_step: cannot start the fake daemon: %s\n", error.c_str());
        return false;
    }
    mall_error_t err{};
    int rc = mall_open(e->socket.c_str(), &e->attached, &err);
    if (rc != MALL_SUCCESS) {
        std::fprintf(stderr, "bench_step: mall_open: %s: %s\n", mall_strerror(rc), err.text);
        return false;
    }
    mall_on_resize(e->attached, count_callback, &e->callback_calls);
    if (mall_step(e->attached) != MALL_SUCCESS) {
        std::fprintf(stderr, "bench_step: the first mall_step did not apply the allocation\n");
        return false;
    }
    std::string missing = e->dir + "/no-daemon.sock";
    rc = mall_open(missing.c_str(), &e->detached, &err);
    if (rc != MALL_ERR_NODAEMON || !e->detached) {
        std::fprintf(stderr, "bench_step: expected a detached handle, got %s\n", mall_strerror(rc));
        return false;
    }
    return true;
}

void tear_down(BenchEnv *e) {
    mall_close(e->attached);
    mall_close(e->detached);
    if (e->daemon) e->daemon->stop();
    e->daemon.reset();
    unlink(e->socket.c_str());
    rmdir(e->dir.c_str());
}

}  // namespace

int main(int argc, char **argv) {
    mall_test_watchdog_arm(600);
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
    BenchEnv e;
    env = &e;
    bool ready = set_up(&e);
    if (ready) benchmark::RunSpecifiedBenchmarks();
    tear_down(&e);
    benchmark::Shutdown();
    return ready ? 0 : 1;
}
