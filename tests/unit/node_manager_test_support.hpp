// SPDX-License-Identifier: BSD-3-Clause
// node_manager_test_support.hpp — what test_node_manager.cpp and test_node_manager_steering.cpp
// share: RecordingEffects (every effect as one line, events kept apart) and NodeManagerTest (a
// NodeManager on a small topology with a clock the test moves). Contract: header-only, no I/O.
#pragma once

#include <cmath>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <random>

#include "support/core_effects.hpp"
#include "support/unit_helpers.hpp"
#include "support/watchdog.h"
#include "daemon/core/node_manager.hpp"

namespace mall::test::node_manager {

using namespace mall;
using namespace std::chrono_literals;
using mall::test::cpus;

// Records every effect as one line ("enforce a 0-1 grow", "publish a 2 0-1", "removed a"; a
// publication says " threads N" and " signals" when it carries them) and keeps the events apart.
class RecordingEffects : public Effects {
public:
    bool enforce(const std::string &job, const CpuSet &set, bool growing,
                 std::string *error) override {
        calls.push_back("enforce " + job + " " + set.to_string() + (growing ? " grow" : " shrink"));
        if (fail_enforce) {
            *error = "simulated failure";
            return false;
        }
        return true;
    }
    void publish(const std::string &job, uint64_t generation, const CpuSet &set, int threads,
                 bool signal_control) override {
        calls.push_back("publish " + job + " " + std::to_string(generation) + " " + set.to_string() +
                        (threads > 0 ? " threads " + std::to_string(threads) : "") +
                        (signal_control ? " signals" : ""));
    }
    void job_removed(const std::string &job) override { calls.push_back("removed " + job); }
    std::optional<double> event_time() override { return wall_time; }  // the core has no wall clock
    void event(const nlohmann::json &ev) override {
        EXPECT_TRUE(ev.contains("event"));
        EXPECT_TRUE(ev.contains("time"));
        events.push_back(ev);
    }
    std::vector<std::string> take() {
        auto out = std::move(calls);
        calls.clear();
        return out;
    }
    std::vector<nlohmann::json> events_named(const std::string &name) const {
        std::vector<nlohmann::json> out;
        for (const auto &ev : events) {
            if (ev["event"] == name) out.push_back(ev);
        }
        return out;
    }

    std::vector<std::string> calls;
    std::vector<nlohmann::json> events;
    bool fail_enforce = false;
    double wall_time = 1.7e9;
};

using Calls = std::vector<std::string>;

class NodeManagerTest : public ::testing::Test {
protected:
    void SetUp() override { make("pack:2 core:2 pu:1", "0-3"); }

    void make(const std::string &topology_spec, const std::string &pool,
              PolicyKind policy = PolicyKind::Equal) {
        std::string error;
        manager_.reset();
        topology_ = Topology::load(topology_spec, &error);
        ASSERT_NE(topology_, nullptr) << error;
        manager_ = std::make_unique<NodeManager>(*topology_, cpus(pool), policy, 2000ms, effects_);
    }

    NodeManager &nm() { return *manager_; }

    static JobSpec spec(const std::string &id, int min, int max, const std::string &guaranteed = "",
                        std::vector<pid_t> pids = {100}) {
        return test::job_spec(id, min, max, cpus(guaranteed), std::move(pids));
    }

    // The invariant of node_manager.hpp plus the bookkeeping it relies on; called after every
    // operation in these tests.
    void check() {
        const auto &jobs = nm().jobs();
        for (auto a = jobs.begin(); a != jobs.end(); ++a) {
            const Job &job = a->second;
            const CpuSet held = job.cpuset | job.published;
            EXPECT_TRUE(nm().pool().contains(held)) << a->first << " holds " << held.to_string();
            EXPECT_TRUE(job.cpuset.contains(job.published))
                << a->first << ": published " << job.published.to_string() << " not in cpuset "
                << job.cpuset.to_string();
            if (!job.awaiting_ack && !job.enforce_retry_at) {  // a failed narrowing awaits retry
                EXPECT_EQ(job.cpuset, job.published) << a->first;
            }
            for (auto b = std::next(a); b != jobs.end(); ++b) {
                const CpuSet other = b->second.cpuset | b->second.published;
                EXPECT_FALSE(held.intersects(other))
                    << a->first << " and " << b->first << " share " << (held & other).to_string();
            }
        }
        CpuSet free = nm().free_cpus();
        EXPECT_FALSE(nm().holds_any(free));
        EXPECT_FALSE(free.intersects(nm().reclaimed()));
    }

    void ok(const Outcome &outcome) {
        EXPECT_TRUE(outcome.ok) << outcome.error;
        check();
    }

    // A request that must fail with `code` and leave everything as it was.
    template <typename Request>
    void refused(int code, Request request, const std::string &words = "") {
        const nlohmann::json before = nm().status();
        effects_.take();
        const size_t events_before = effects_.events.size();
        Outcome outcome = request();
        EXPECT_FALSE(outcome.ok);
        EXPECT_EQ(outcome.code, code) << outcome.error;
        EXPECT_FALSE(outcome.error.empty());
        if (!words.empty()) {
            EXPECT_NE(outcome.error.find(words), std::string::npos) << outcome.error;
        }
        EXPECT_EQ(nm().status(), before) << outcome.error;
        EXPECT_TRUE(effects_.take().empty());
        EXPECT_EQ(effects_.events.size(), events_before);
        check();
    }

    const Job &job(const std::string &id) {
        const Job *j = nm().find(id);
        EXPECT_NE(j, nullptr) << id;
        static Job none;
        return j != nullptr ? *j : none;
    }

    TimePoint at(std::chrono::microseconds offset) { return t0_ + offset; }

    RecordingEffects effects_;
    std::unique_ptr<Topology> topology_;
    std::unique_ptr<NodeManager> manager_;
    TimePoint t0_ = TimePoint{} + 1000s;
};


}  // namespace mall::test::node_manager
