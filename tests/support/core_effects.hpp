// SPDX-License-Identifier: BSD-3-Clause
// core_effects.hpp — what the tests and benchmarks that drive the node manager's core (NodeManager)
// without a kernel give it as its Effects: every enforce succeeds, publishes and removals go
// nowhere, and the events are kept for the test to read, stamped with a fixed wall-clock time (the
// core has none of its own). Tests that check the calls themselves keep their own recorder
// (test_node_manager's RecordingEffects).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/core/node_manager.hpp"

namespace mall::test {

class EventLogEffects : public Effects {
public:
    bool enforce(const std::string &, const CpuSet &, bool, std::string *) override { return true; }
    void publish(const std::string &, uint64_t, const CpuSet &, int, bool) override {}
    void job_removed(const std::string &) override {}
    void event(const nlohmann::json &ev) override { events.push_back(ev); }
    std::optional<double> event_time() override { return wall_time; }

    // The events named `name` ("end", "resize", ...), oldest first.
    std::vector<nlohmann::json> named(const std::string &name) const {
        std::vector<nlohmann::json> out;
        for (const auto &ev : events)
            if (ev.value("event", std::string()) == name) out.push_back(ev);
        return out;
    }

    std::optional<double> wall_time = 1.7e9;  // seconds since the epoch on every event
    std::vector<nlohmann::json> events;
};

// A job of uid 1000 with one process (pid 100 unless given).
inline JobSpec job_spec(const std::string &id, int min, int max, const CpuSet &guaranteed = CpuSet(),
                        std::vector<pid_t> pids = {100}) {
    JobSpec s;
    s.id = id;
    s.uid = 1000;
    s.min = min;
    s.max = max;
    s.guaranteed = guaranteed;
    s.pids = std::move(pids);
    return s;
}

}  // namespace mall::test
