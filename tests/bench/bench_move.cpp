// SPDX-License-Identifier: BSD-3-Clause
// bench_move.cpp — a full two-phase move of one core between two jobs stepping every 1 ms, cgroup
// writes included (cgroup-v1, root). Job A (mallrun, 1:2) holds both cores; each iteration registers
// job B (a stepping mall_test_client): malld publishes A's shrink, waits for A's ack, narrows A's
// cgroup, widens B's and publishes B's allocation. Measured from the Register request to B's grow
// publish (event times); then B is deregistered and A grows back (not measured).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include <unistd.h>

#include <benchmark/benchmark.h>

#include "common/ctl_client.hpp"
#include "common/protocol.hpp"
#include "support/malld_fixture.hpp"

namespace {

using namespace mall::test;
using nlohmann::json;

double wall_seconds() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void BM_TwoPhaseMove(benchmark::State &state) {
    if (auto why = missing_privileges()) {
        state.SkipWithError(why->c_str());
        return;
    }
    MalldOptions options;
    options.backend = "cgroup-v1";
    options.ack_timeout_ms = 5000;
    options.log_level = "warn";
    PrivateMalld malld(options);
    std::string error;
    if (!malld.start(&error)) {
        state.SkipWithError(("malld did not start: " + error).c_str());
        return;
    }
    const std::vector<std::string> stepping = {"--step-us", "1000", "--threads", "2", "--duration-s", "3600"};
    Child a(mallrun_argv(malld.socket(), "1:2", "move_a", test_client_argv(stepping)));
    if (!wait_until([&] { return job_settled_on(malld.socket(), "move_a", "0-1", 1); }, 20s)) {
        state.SkipWithError("job A did not settle on the whole pool");
        return;
    }
    // B steps too; it attaches by itself whenever the benchmark has registered it.
    Child b(test_client_argv(stepping), ChildOptions{{{"MALL_SOCKET", malld.socket()}, {"MALL_JOB_ID", "move_b"}}});
    EventRecorder events;
    auto ctl = mall::CtlClient::connect(malld.socket(), &error);
    if (!events.start(malld.socket(), &error) || !ctl) {
        state.SkipWithError(("cannot talk to malld: " + error).c_str());
        return;
    }

    std::vector<double> moves, ack_waits, reply_times;
    for (auto _ : state) {
        const size_t from = events.size();
        const double sent = wall_seconds();
        auto reply = ctl->request(mall::proto::Type::Register,
                                  json{{"job", "move_b"}, {"uid", 0}, {"pids", {b.pid()}}, {"min", 1}, {"max", 1}},
                                  10s);
        const double replied = wall_seconds();
        if (!reply.ok) {
            state.SkipWithError(("Register refused: " + reply.error).c_str());
            break;
        }
        auto a_publish = events.wait_for([](const json &e) { return is_event(e, "publish", "move_a"); }, 5s, from);
        auto b_grow = events.wait_for(
            [](const json &e) { return is_event(e, "publish", "move_b") && e.value("ncpus", 0) > 0; }, 5s, from);
        auto a_ack = a_publish ? events.wait_for([](const json &e) { return is_event(e, "ack", "move_a"); }, 5s,
                                                 *a_publish)
                               : std::nullopt;
        if (!a_publish || !b_grow || !a_ack) {
            state.SkipWithError("the move's events did not arrive (ack timeout?)");
            break;
        }
        const double move_us = (events.at(*b_grow).value("time", 0.0) - sent) * 1e6;
        moves.push_back(move_us);
        ack_waits.push_back(events.at(*a_ack).value("latency_us", -1.0));
        reply_times.push_back((replied - sent) * 1e6);
        state.SetIterationTime(move_us / 1e6);

        // Undo, unmeasured (manual time counts only the move): B leaves, A grows back and acks.
        auto gone = ctl->request(mall::proto::Type::Deregister, json{{"job", "move_b"}}, 10s);
        bool settled =
            gone.ok && wait_until([&] { return job_settled_on(malld.socket(), "move_a", "0-1", 1); }, 10s, 1ms);
        if (!settled) {
            state.SkipWithError(("job A did not grow back after B left: " + gone.error).c_str());
            break;
        }
    }
    state.counters["samples"] = static_cast<double>(moves.size());
    state.counters["median_us"] = percentile(moves, 0.5);
    state.counters["p99_us"] = percentile(moves, 0.99);
    state.counters["max_us"] = percentile(moves, 1.0);
    state.counters["a_ack_median_us"] = percentile(ack_waits, 0.5);
    state.counters["register_reply_median_us"] = percentile(reply_times, 0.5);
    state.SetLabel("cgroup-v1, both jobs step every 1 ms");
}

BENCHMARK(BM_TwoPhaseMove)->Iterations(150)->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char **argv) {
    mall_test_watchdog_arm(900);
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
