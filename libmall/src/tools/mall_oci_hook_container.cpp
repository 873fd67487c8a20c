// SPDX-License-Identifier: BSD-3-Clause
// mall_oci_hook_container.cpp — what mall-oci-hook reads of a container (see
// mall_oci_hook_container.hpp): the OCI state, the bundle's user mapping, the io.mall.* annotations
// within the admin's limits (job-name prefix, weight and core caps).
#include "tools/mall_oci_hook_container.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "common/core_range.hpp"
#include "common/files.hpp"
#include "common/protocol.hpp"
#include "common/rules.hpp"

using nlohmann::json;

namespace mall::tools::oci_hook {

namespace {

std::string fix_hint(const char *key, const std::string &example) {
    return std::string("; fix the container's annotation, e.g. --annotation ") + key + "=" + example;
}

}  // namespace

std::optional<State> parse_state(const std::string &text, std::string *error) {
    const json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
        *error = "the OCI state on stdin is not a JSON object (the runtime passes "
                 "{\"ociVersion\",\"id\",\"status\",\"pid\",\"bundle\",\"annotations\"})";
        return std::nullopt;
    }
    State s;
    auto id = j.find("id");
    if (id == j.end() || !id->is_string() || id->get<std::string>().empty()) {
        *error = "the OCI state on stdin has no container \"id\"";
        return std::nullopt;
    }
    s.id = id->get<std::string>();
    if (auto b = j.find("bundle"); b != j.end() && b->is_string()) s.bundle = b->get<std::string>();
    if (auto p = j.find("pid"); p != j.end() && !p->is_null()) {
        if (!p->is_number_integer() || p->get<int64_t>() < 0 || p->get<int64_t>() > mall::proto::kMaxPid) {
            *error = "the OCI state's \"pid\" is not a process id: " + shown(p->dump());
            return std::nullopt;
        }
        s.pid = p->get<int64_t>();
    }
    if (auto a = j.find("annotations"); a != j.end() && !a->is_null()) {
        if (!a->is_object()) {
            *error = "the OCI state's \"annotations\" is not an object";
            return std::nullopt;
        }
        for (auto it = a->begin(); it != a->end(); ++it)
            if (it->is_string()) s.annotations.emplace_back(it.key(), it->get<std::string>());
    }
    return s;
}

// The host uid the container's process runs as: process.user.uid mapped through
// linux.uidMappings (none: the same uid). nullopt with *error when config.json says otherwise.
std::optional<uint32_t> host_uid_of(const std::string &bundle, std::string *error) {
    if (bundle.empty()) {
        *error = "the OCI state has no \"bundle\", so the container's user cannot be read from its config.json";
        return std::nullopt;
    }
    const std::string path = bundle + "/config.json";
    std::string text;
    int err = 0;
    if (!mall::read_text_file(path, &text, &err)) {
        *error = "cannot read " + path + ": " + std::strerror(err);
        return std::nullopt;
    }
    const json config = json::parse(text, nullptr, false);
    if (config.is_discarded() || !config.is_object()) {
        *error = path + " is not a JSON object (an OCI runtime config)";
        return std::nullopt;
    }
    int64_t uid = 0;  // the runtime spec's default user is root
    if (auto process = config.find("process"); process != config.end() && process->is_object()) {
        if (auto user = process->find("user"); user != process->end() && user->is_object()) {
            if (auto u = user->find("uid"); u != user->end()) {
                if (!u->is_number_integer() || u->get<int64_t>() < 0 || u->get<int64_t>() > mall::proto::kMaxUid) {
                    *error = path + ": process.user.uid is not a uid: " + shown(u->dump());
                    return std::nullopt;
                }
                uid = u->get<int64_t>();
            }
        }
    }
    auto linux_section = config.find("linux");
    if (linux_section == config.end() || !linux_section->is_object()) return static_cast<uint32_t>(uid);
    auto maps = linux_section->find("uidMappings");
    if (maps == linux_section->end() || maps->is_null() || (maps->is_array() && maps->empty()))
        return static_cast<uint32_t>(uid);
    if (!maps->is_array()) {
        *error = path + ": linux.uidMappings is not an array";
        return std::nullopt;
    }
    for (const auto &m : *maps) {
        auto field = [&](const char *name) -> std::optional<int64_t> {
            auto f = m.find(name);
            if (!m.is_object() || f == m.end() || !f->is_number_integer() || f->get<int64_t>() < 0)
                return std::nullopt;
            return f->get<int64_t>();
        };
        auto inside = field("containerID"), host = field("hostID"), size = field("size");
        if (!inside || !host || !size) {
            *error = path + ": a linux.uidMappings entry lacks containerID, hostID or size: " + shown(m.dump());
            return std::nullopt;
        }
        if (uid >= *inside && uid - *inside < *size) {
            const int64_t mapped = *host + (uid - *inside);
            if (mapped > mall::proto::kMaxUid) {
                *error = path + ": uid " + std::to_string(uid) + " maps to " + std::to_string(mapped) +
                         ", which is not a host uid";
                return std::nullopt;
            }
            return static_cast<uint32_t>(mapped);
        }
    }
    *error = path + ": the container's uid " + std::to_string(uid) +
             " is in none of its linux.uidMappings, so it has no host uid to own the job";
    return std::nullopt;
}

// A value from the container's definition as it is shown in a message: one line, printable, short.
std::string shown(const std::string &value) {
    constexpr size_t kMaxShown = 80;
    std::string out;
    for (char c : value.substr(0, kMaxShown)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
    return value.size() > kMaxShown ? out + "..." : out;
}


std::string job_prefix_problem(const std::string &prefix) {
    if (prefix.size() > kMaxJobPrefixLength)
        return "--job-prefix '" + shown(prefix) + "' is longer than " + std::to_string(kMaxJobPrefixLength) +
               " characters (the job name after it needs room: names have at most " +
               std::to_string(mall::proto::kMaxJobNameLength) + ")";
    for (char c : prefix)
        if (!mall::proto::is_job_name_char(c))
            return "--job-prefix '" + shown(prefix) + "' holds a character job names cannot have (use A-Z a-z 0-9 . _ : -)";
    if (std::string reserved = mall::reserved_job_name_problem(prefix, mall::JobNamer::Other); !reserved.empty())
        return "--job-prefix '" + shown(prefix) + "' would make every container's job name reserved: " + reserved +
               "; choose another, e.g. " + kDefaultJobPrefix;
    return "";
}

std::optional<std::string> job_name_of(const State &s, const std::string &prefix, std::string *error) {
    if (auto named = s.annotation(kAnnJob)) {
        const std::string job = prefix + *named;
        if (named->empty() || mall::proto::invalid_job_name(job)) {
            const auto why = mall::proto::invalid_job_name(job);
            *error = std::string("bad annotation ") + kAnnJob + "='" + shown(*named) + "': " +
                     (named->empty() ? std::string("empty")
                                     : "the job's name '" + shown(job) + "' (this node's prefix '" + prefix +
                                           "', then the annotation) is not a job name: " + why.value_or("")) +
                     fix_hint(kAnnJob, "train-a");
            return std::nullopt;
        }
        if (std::string reserved = mall::reserved_job_name_problem(job, mall::JobNamer::Other); !reserved.empty()) {
            *error = std::string("bad annotation ") + kAnnJob + "='" + shown(*named) + "': the job's name '" +
                     shown(job) + "' is reserved, which a container may not take (" + reserved + ")" +
                     fix_hint(kAnnJob, "train-a");
            return std::nullopt;
        }
        return job;
    }
    std::string job = prefix;
    for (char c : s.id.substr(0, 12)) job += mall::proto::is_job_name_char(c) ? c : '_';
    if (mall::proto::invalid_job_name(job) || mall::reserved_job_prefix(job)) {
        // Only a hook run without the usual --job-prefix can get here (an empty prefix and an id
        // that reads "slurm-..." or "self-...").
        *error = "the container's default job name '" + shown(job) + "' (this node's prefix '" + prefix +
                 "', then its id) cannot be used; give it a name" + fix_hint(kAnnJob, "train-a");
        return std::nullopt;
    }
    return job;
}

std::optional<Request> parse_request(const State &s, const Limits &limits, std::string *error) {
    Request r;
    const std::string rule = std::string(mall::kCoreRangeRule) + " (MIN alone: up to the whole pool)";
    auto malleable = s.annotation(kAnnMalleable);
    if (!malleable) {
        *error = std::string("the container has no annotation ") + kAnnMalleable +
                 ", so it asks for no malleability; give it --annotation " + kAnnMalleable +
                 "=MIN[:MAX], or make the hooks.d file run this hook only for such containers "
                 "(\"when\": {\"annotations\": {\"^io\\\\.mall\\\\.malleable$\": \".+\"}})";
        return std::nullopt;
    }
    const std::string &text = *malleable;
    // MIN[:MAX] by the tools' shared parser (common/core_range.hpp), counts 1 to
    // mall::kMaxCoreCount, with mallrun --malleable's words: only MAX below MIN has its own.
    const mall::CoreRangeParse parsed = mall::parse_core_range(text, mall::kMaxCoreCount);
    if (parsed.fault == mall::CoreRangeFault::max_below_min && *parsed.range.max != 0) {
        const std::string min = std::to_string(parsed.range.min), max = std::to_string(*parsed.range.max);
        *error = std::string("bad annotation ") + kAnnMalleable + "='" + shown(text) + "': MIN (" + min +
                 ") is larger than MAX (" + max + "); use " + rule + fix_hint(kAnnMalleable, max + ":" + min);
        return std::nullopt;
    }
    if (!parsed.ok()) {
        *error = std::string("bad annotation ") + kAnnMalleable + "='" + shown(text) + "': use " + rule +
                 fix_hint(kAnnMalleable, "1:4");
        return std::nullopt;
    }
    r.min = static_cast<int>(parsed.range.min);
    if (parsed.range.max) r.max = static_cast<int>(*parsed.range.max);
    if (r.max && *r.max > limits.max_cores) {  // a request: cut to what this node's hooks allow
        r.asked_max = r.max;
        r.max = std::max(limits.max_cores, r.min);  // MIN above the cap: the caller refuses the job
    }
    auto job = job_name_of(s, limits.job_prefix, error);
    if (!job) return std::nullopt;
    r.job = *job;
    if (auto w = s.annotation(kAnnWeight)) {
        const char *begin = w->c_str();
        char *end = nullptr;
        errno = 0;
        const double value = std::strtod(begin, &end);
        const bool whole = !w->empty() && end == begin + w->size() && errno == 0 && std::isfinite(value) &&
                           !std::isspace(static_cast<unsigned char>((*w)[0]));
        if (!whole || !mall::proto::valid_weight(value)) {
            *error = std::string("bad annotation ") + kAnnWeight + "='" + shown(*w) + "': the weight must be " +
                     mall::kWeightRule + fix_hint(kAnnWeight, "2");
            return std::nullopt;
        }
        if (value > limits.max_weight) {
            std::ostringstream cap;
            cap << limits.max_weight;
            *error = std::string("bad annotation ") + kAnnWeight + "='" + shown(*w) +
                     "': this node's containers may ask for a weight of at most " + cap.str() +
                     " (mall-oci-hook --max-weight in the hooks.d file)" + fix_hint(kAnnWeight, "2");
            return std::nullopt;
        }
        r.weight = value;
    }
    if (auto req = s.annotation(kAnnRequire)) {
        std::string v = *req;
        std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
        if (v == "true" || v == "yes" || v == "1") {
            r.require = true;
        } else if (v == "false" || v == "no" || v == "0") {
            r.require = false;
        } else {
            *error = std::string("bad annotation ") + kAnnRequire + "='" + shown(*req) + "': use true or false" +
                     fix_hint(kAnnRequire, "true");
            return std::nullopt;
        }
    }
    return r;
}

}  // namespace mall::tools::oci_hook
