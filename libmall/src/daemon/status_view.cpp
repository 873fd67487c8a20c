// SPDX-License-Identifier: BSD-3-Clause
// status_view.cpp — see status_view.hpp. What another user's job shows is a short allow-list
// (kOtherJobFields, kOtherEventFields): a field added to the status or an event later stays
// hidden from other users until it is added here on purpose.
#include "status_view.hpp"

#include <string>

namespace mall {

namespace {

// The fields of another user's job a non-admin sees: how much of the node it holds.
constexpr const char *kOtherJobFields[] = {"cpus", "ncpus", "min", "max"};
// The events about another user's job a non-admin still gets (reduced), and what they keep.
constexpr const char *kOtherJobEvents[] = {"register", "publish", "end"};
constexpr const char *kOtherEventFields[] = {"event", "time", "cpus", "ncpus"};

std::optional<uid_t> uid_field(const nlohmann::json &object) {
    auto it = object.find("uid");
    if (it == object.end() || !it->is_number_unsigned()) return std::nullopt;
    return static_cast<uid_t>(it->get<uint64_t>());
}

}  // namespace

nlohmann::json status_seen_by(const nlohmann::json &full, const StatusViewer &viewer) {
    nlohmann::json seen = full;
    if (viewer.admin) {
        seen["view"] = "all";
        return seen;
    }
    seen["view"] = "own";
    nlohmann::json own = nlohmann::json::array(), others = nlohmann::json::array();
    if (auto jobs = full.find("jobs"); jobs != full.end() && jobs->is_array()) {
        for (const auto &job : *jobs) {
            if (!job.is_object()) continue;
            if (uid_field(job) == viewer.uid) {
                own.push_back(job);
                continue;
            }
            nlohmann::json summary = nlohmann::json::object();
            for (const char *field : kOtherJobFields)
                if (auto it = job.find(field); it != job.end()) summary[field] = *it;
            others.push_back(std::move(summary));
        }
    }
    seen["jobs"] = std::move(own);
    seen["other_jobs"] = std::move(others);
    return seen;
}

std::optional<nlohmann::json> event_seen_by(const nlohmann::json &event, const StatusViewer &viewer,
                                            std::optional<uid_t> job_owner) {
    if (viewer.admin || !event.is_object() || !event.contains("job")) return event;
    if (auto uid = uid_field(event)) job_owner = uid;
    if (job_owner == viewer.uid) return event;
    const std::string name = event.value("event", std::string());
    bool kept = false;
    for (const char *e : kOtherJobEvents) kept = kept || name == e;
    if (!kept) return std::nullopt;
    nlohmann::json reduced = nlohmann::json::object();
    for (const char *field : kOtherEventFields)
        if (auto it = event.find(field); it != event.end()) reduced[field] = *it;
    reduced["other_job"] = true;
    return reduced;
}

}  // namespace mall
