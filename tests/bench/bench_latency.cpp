// SPDX-License-Identifier: BSD-3-Clause
// bench_latency.cpp — publish-to-ack latency through a real malld: a mall_test_client steps every
// 100 µs; the benchmark publishes changes (Set, alternating cpus "0" and "0-1") and reads malld's
// "ack" events, whose latency_us is the time from publishing a generation to receiving its ack.
// Reports the median and p99 as counters, split by direction (a grow's latency_us also covers the
// cgroup widening done just before the publish), the gap between the publish and ack events' own
// time stamps, and the client-observed request-to-ack time.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "common/ctl_client.hpp"
#include "common/protocol.hpp"
#include "support/malld_fixture.hpp"

namespace {

using namespace mall::test;
using nlohmann::json;

// state.range(0): 1 = cgroup-v1 backend (needs root and a cpuset mount), 0 = affinity backend.
void BM_PublishToAck(benchmark::State &state) {
    const bool cgroup = state.range(0) == 1;
    if (cgroup) {
        if (auto why = missing_privileges()) {
            state.SkipWithError(("cgroup-v1 variant skipped: " + *why).c_str());
            return;
        }
    }
    MalldOptions options;
    options.backend = cgroup ? "cgroup-v1" : "affinity";
    options.ack_timeout_ms = 5000;
    options.log_level = "warn";  // an info line per event would slow malld down
    PrivateMalld malld(options);
    std::string error;
    if (!malld.start(&error)) {
        state.SkipWithError(("malld did not start: " + error).c_str());
        return;
    }
    Child client(mallrun_argv(malld.socket(), "1:2", "lat",
                              test_client_argv({"--step-us", "100", "--threads", "1", "--duration-s", "3600"})));
    if (!wait_until([&] { return job_settled_on(malld.socket(), "lat", "0-1", 1); }, 20s)) {
        state.SkipWithError("the stepping client did not attach");
        return;
    }
    EventRecorder events;
    auto ctl = mall::CtlClient::connect(malld.socket(), &error);
    if (!events.start(malld.socket(), &error) || !ctl) {
        state.SkipWithError(("cannot talk to malld: " + error).c_str());
        return;
    }

    std::vector<double> latencies, shrink_latencies, grow_latencies, event_gaps, round_trips;
    // First and last measured (generation, ack time): with the client's "change step=N gen=G"
    // lines they give its real step period (the 100 us sleep plus wake-up and timer slack).
    std::optional<std::pair<uint64_t, double>> first_ack, last_ack;
    bool narrow = true;
    for (auto _ : state) {
        const std::string cpus = narrow ? "0" : "0-1";
        const size_t from = events.size();
        const auto sent = std::chrono::steady_clock::now();
        auto reply = ctl->request(mall::proto::Type::Set, json{{"job", "lat"}, {"cpus", cpus}}, 5s);
        if (!reply.ok) {
            state.SkipWithError(("Set refused: " + reply.error).c_str());
            break;
        }
        auto published = events.wait_for([](const json &e) { return is_event(e, "publish", "lat"); }, 5s, from);
        if (!published) {
            state.SkipWithError("no publish event");
            break;
        }
        const uint64_t generation = events.at(*published).value("generation", 0ull);
        auto acked = events.wait_for(
            [&](const json &e) { return is_event(e, "ack", "lat") && e.value("generation", 0ull) == generation; },
            5s, *published);
        if (!acked) {
            state.SkipWithError("no ack event (ack timeout?)");
            break;
        }
        const auto seen = std::chrono::steady_clock::now();
        if (narrow) {
            // A shrink ends with the narrowing cgroup write, after the ack: let it finish.
            events.wait_for([](const json &e) { return is_event(e, "enforce", "lat"); }, 5s, *acked);
        }
        const json ack = events.at(*acked);
        const double latency_us = ack.value("latency_us", -1.0);
        latencies.push_back(latency_us);
        (narrow ? shrink_latencies : grow_latencies).push_back(latency_us);
        // The same interval from the two events' own time stamps: publish written -> ack handled.
        event_gaps.push_back((ack.value("time", 0.0) - events.at(*published).value("time", 0.0)) * 1e6);
        round_trips.push_back(std::chrono::duration<double, std::micro>(seen - sent).count());
        last_ack = std::make_pair(generation, ack.value("time", 0.0));
        if (!first_ack) first_ack = last_ack;
        state.SetIterationTime(latency_us / 1e6);
        narrow = !narrow;
    }
    if (first_ack && last_ack && last_ack->first > first_ack->first) {
        auto step_of = [&](uint64_t generation) -> std::optional<double> {
            const std::string gen = " gen=" + std::to_string(generation) + " ";
            auto line = client.wait_for_line([&](const std::string &l) { return l.find(gen) != std::string::npos; },
                                             5s);
            if (!line || line->rfind("change step=", 0) != 0) return std::nullopt;
            return std::stod(line->substr(std::strlen("change step=")));
        };
        auto first_step = step_of(first_ack->first), last_step = step_of(last_ack->first);
        if (first_step && last_step && *last_step > *first_step)
            state.counters["client_step_period_us"] =
                (last_ack->second - first_ack->second) * 1e6 / (*last_step - *first_step);
    }
    state.counters["samples"] = static_cast<double>(latencies.size());
    state.counters["median_us"] = percentile(latencies, 0.5);
    state.counters["p99_us"] = percentile(latencies, 0.99);
    state.counters["max_us"] = percentile(latencies, 1.0);
    state.counters["shrink_median_us"] = percentile(shrink_latencies, 0.5);
    state.counters["grow_median_us"] = percentile(grow_latencies, 0.5);
    state.counters["event_gap_median_us"] = percentile(event_gaps, 0.5);
    state.counters["event_gap_p99_us"] = percentile(event_gaps, 0.99);
    state.counters["request_to_ack_median_us"] = percentile(round_trips, 0.5);
    state.counters["request_to_ack_p99_us"] = percentile(round_trips, 0.99);
    state.SetLabel(cgroup ? "cgroup-v1, client steps every 100 us" : "affinity, client steps every 100 us");
}

BENCHMARK(BM_PublishToAck)
    ->ArgName("cgroup")
    ->Arg(1)
    ->Arg(0)
    ->Iterations(400)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char **argv) {
    mall_test_watchdog_arm(900);
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
