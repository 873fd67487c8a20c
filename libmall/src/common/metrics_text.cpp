// SPDX-License-Identifier: BSD-3-Clause
// metrics_text.cpp — render_prometheus: malld's status object as Prometheus text (see
// metrics_text.hpp for the contract). One table lists every metric with the status field it
// comes from; the writer below walks it.
#include "metrics_text.hpp"

#include <charconv>
#include <cmath>
#include <functional>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "cpuset.hpp"

namespace mall {

namespace {

using nlohmann::json;

// A number as Prometheus reads it, in the shortest form that reads back exactly: plain decimals
// (0.0001, not 1e-04) for the magnitudes metrics have, exponents only beyond; NaN and
// infinities by name.
std::string number_text(double x) {
    if (std::isnan(x)) return "NaN";
    if (std::isinf(x)) return x > 0 ? "+Inf" : "-Inf";
    char buffer[400];
    const double magnitude = std::fabs(x);
    const bool plain = x == 0 || (magnitude >= 1e-6 && magnitude < 1e15);
    auto [end, ec] = plain ? std::to_chars(buffer, buffer + sizeof buffer, x, std::chars_format::fixed)
                           : std::to_chars(buffer, buffer + sizeof buffer, x);
    if (ec != std::errc()) return "NaN";
    return std::string(buffer, end);
}

// Label values: backslash, double quote and newline escaped.
std::string label_value(const std::string &text) {
    std::string out;
    out.reserve(text.size());
    for (char c : text) {
        if (c == '\\') out += "\\\\";
        else if (c == '"') out += "\\\"";
        else if (c == '\n') out += "\\n";
        else out += c;
    }
    return out;
}

std::optional<double> number(const json &object, const char *field) {
    auto it = object.find(field);
    if (it == object.end() || !it->is_number()) return std::nullopt;
    return it->get<double>();
}

std::optional<double> cpu_count(const json &object, const char *field) {
    auto it = object.find(field);
    if (it == object.end() || !it->is_string()) return std::nullopt;
    auto cpus = CpuSet::parse(it->get<std::string>());
    if (!cpus) return std::nullopt;
    return cpus->count();
}

// Where a metric's value comes from: the status (node metrics) or one job's object.
using Extract = std::function<std::optional<double>(const json &)>;
Extract field(const char *name) {
    return [name](const json &o) { return number(o, name); };
}
Extract cpus_of(const char *name) {
    return [name](const json &o) { return cpu_count(o, name); };
}
Extract node_field(const char *name) {
    return [name](const json &status) -> std::optional<double> {
        auto node = status.find("node");
        if (node == status.end() || !node->is_object()) return std::nullopt;
        return number(*node, name);
    };
}

enum class Scope { Node, Job };

struct Metric {
    MetricInfo info;
    Scope scope;
    Extract value;  // histograms: none (the histogram field is `histogram`)
    const char *histogram = nullptr;  // the {counts, sum, count} field (node: under "node")
};

const std::vector<Metric> &metrics() {
    static const std::vector<Metric> table = {
        {{"mall_pool_cpus", "gauge", "Cpus in malld's malleable pool (--cpus)."}, Scope::Node, cpus_of("pool")},
        {{"mall_available_cpus", "gauge", "Cpus of the pool the policy divides now (the pool minus reclaimed cpus)."},
         Scope::Node, cpus_of("available")},
        {{"mall_free_cpus", "gauge", "Cpus of the available pool no job holds."}, Scope::Node, cpus_of("free")},
        {{"mall_reclaimed_cpus", "gauge", "Cpus taken out of the pool by mallctl reclaim (e.g. a Slurm prolog)."},
         Scope::Node, cpus_of("reclaimed")},
        {{"mall_jobs", "gauge", "Malleable jobs registered with malld."}, Scope::Node,
         [](const json &s) -> std::optional<double> {
             // A non-admin's status lists other users' jobs apart, in "other_jobs" (status_view.hpp).
             auto others = s.find("other_jobs");
             return static_cast<double>(s["jobs"].size() +
                                        (others != s.end() && others->is_array() ? others->size() : 0));
         }},
        {{"mall_ack_timeout_seconds", "gauge", "How long malld waits for a job's processes to acknowledge a change."},
         Scope::Node,
         [](const json &s) -> std::optional<double> {
             auto ms = number(s, "ack_timeout_ms");
             return ms ? std::optional<double>(*ms / 1000) : std::nullopt;
         }},
        {{"mall_jobs_ended_total", "counter", "Jobs that ended (their accounting is in the node totals and the history)."},
         Scope::Node, node_field("jobs_ended")},
        {{"mall_core_seconds_total", "counter", "Cpus held by malleable jobs times the time they held them."},
         Scope::Node, node_field("core_seconds")},
        {{"mall_lent_core_seconds_total", "counter",
          "Cpus held above the jobs' guaranteed cpus times the time held: idle capacity turned into work."},
         Scope::Node, node_field("lent_core_seconds")},
        {{"mall_oversubscribed_seconds_total", "counter",
          "Time jobs ran more threads than cpus after an ack timeout of a shrink, summed over jobs."},
         Scope::Node, node_field("oversubscribed_seconds")},
        {{"mall_cpu_seconds_total", "counter",
          "Cpu time the malleable jobs' processes ran, measured by malld: over mall_core_seconds_total, how busy "
          "the jobs kept the cpus they held."},
         Scope::Node, node_field("cpu_seconds")},
        {{"mall_resizes_total", "counter", "New cpu sets published to jobs."}, Scope::Node, node_field("resizes")},
        {{"mall_ack_timeouts_total", "counter", "Changes a job's processes did not acknowledge in time."},
         Scope::Node, node_field("ack_timeouts")},
        {{"mall_ack_latency_seconds", "histogram", "From a change's publication to its acknowledgement by every process."},
         Scope::Node, nullptr, "ack_latency_seconds"},
        {{"mall_reclaims_total", "counter", "Reclaim requests answered (mallctl reclaim, Slurm prologs)."},
         Scope::Node, node_field("reclaims")},
        {{"mall_reclaim_timeouts_total", "counter", "Reclaims whose cpus were still held when the wait ended."},
         Scope::Node, node_field("reclaim_timeouts")},
        {{"mall_reclaim_duration_seconds", "histogram", "From a reclaim request to the moment no job held its cpus."},
         Scope::Node, nullptr, "reclaim_duration_seconds"},

        {{"mall_job_cpus", "gauge", "Cpus published to the job."}, Scope::Job, field("ncpus")},
        {{"mall_job_min_cpus", "gauge", "The job's least cpus (--malleable=MIN)."}, Scope::Job, field("min")},
        {{"mall_job_max_cpus", "gauge", "The job's most cpus (--malleable=MIN:MAX)."}, Scope::Job, field("max")},
        {{"mall_job_guaranteed_cpus", "gauge", "Cpus the job owns (its Slurm allocation on this node)."}, Scope::Job,
         cpus_of("guaranteed")},
        {{"mall_job_lent_cpus", "gauge", "Cpus the job holds above its guaranteed cpus (or its min)."}, Scope::Job,
         field("lent_cpus")},
        {{"mall_job_threads", "gauge", "Threads the job's processes run on its cpus."}, Scope::Job,
         field("active_threads")},
        {{"mall_job_attached_processes", "gauge", "The job's processes attached to malld."}, Scope::Job,
         field("attached")},
        {{"mall_job_generation", "gauge", "The generation of the job's last published allocation."}, Scope::Job,
         field("generation")},
        {{"mall_job_oversubscribed", "gauge", "1 while the job runs more threads than cpus after an ack timeout."},
         Scope::Job,
         [](const json &j) -> std::optional<double> {
             auto it = j.find("oversubscribed");
             if (it == j.end() || !it->is_boolean()) return std::nullopt;
             return it->get<bool>() ? 1 : 0;
         }},
        {{"mall_job_core_seconds_total", "counter", "Cpus the job held times the time it held them."}, Scope::Job,
         field("core_seconds")},
        {{"mall_job_lent_core_seconds_total", "counter", "Cpus the job held above its guaranteed cpus times the time held."},
         Scope::Job, field("lent_core_seconds")},
        {{"mall_job_oversubscribed_seconds_total", "counter", "Time the job ran more threads than cpus after an ack timeout."},
         Scope::Job, field("oversubscribed_seconds")},
        {{"mall_job_cpu_seconds_total", "counter", "Cpu time the job's processes ran, as malld measured it."},
         Scope::Job, field("cpu_seconds")},
        {{"mall_job_cpu_busy_ratio", "gauge",
          "Cpu time the job ran over the core-seconds it held, in malld's last window of about 2 s."},
         Scope::Job, field("cpu_busy")},
        {{"mall_job_resizes_total", "counter", "New cpu sets published to the job."}, Scope::Job, field("transitions")},
        {{"mall_job_ack_timeouts_total", "counter", "The job's changes not acknowledged in time."}, Scope::Job,
         field("ack_timeouts")},
        {{"mall_job_last_ack_latency_seconds", "gauge", "The latency of the job's last acknowledged change."},
         Scope::Job,
         [](const json &j) -> std::optional<double> {
             auto us = number(j, "last_ack_latency_us");
             if (!us || *us < 0) return std::nullopt;  // no ack yet
             return *us / 1e6;
         }},
        {{"mall_job_ack_latency_seconds", "histogram", "From a change's publication to the job's acknowledgement."},
         Scope::Job, nullptr, "ack_latency_seconds"},
        {{"mall_job_work_units_total", "counter", "Work the job reported (mall_report_progress)."}, Scope::Job,
         field("work_units")},
        {{"mall_job_steps_total", "counter", "Training steps the job reported."}, Scope::Job, field("steps")},
    };
    return table;
}

std::string job_labels(const json &job) {
    std::string name = job.value("job", std::string());
    std::string uid = job.contains("uid") && job["uid"].is_number() ? std::to_string(job["uid"].get<uint64_t>()) : "";
    return "mall_job=\"" + label_value(name) + "\",uid=\"" + label_value(uid) + "\"";
}

// A histogram {counts, sum, count} with `bounds`: cumulative buckets, sum and count.
void write_histogram(std::ostringstream &out, const char *name, const std::string &labels,
                     const std::vector<double> &bounds, const json &histogram) {
    if (!histogram.is_object()) return;
    const auto &counts = histogram.value("counts", json::array());
    if (!counts.is_array() || counts.size() != bounds.size() + 1) return;
    const std::string sep = labels.empty() ? "" : ",";
    double cumulative = 0;
    for (size_t i = 0; i <= bounds.size(); ++i) {
        cumulative += counts[i].is_number() ? counts[i].get<double>() : 0;
        const std::string le = i < bounds.size() ? number_text(bounds[i]) : "+Inf";
        out << name << "_bucket{" << labels << sep << "le=\"" << le << "\"} " << number_text(cumulative) << "\n";
    }
    const std::string braces = labels.empty() ? "" : "{" + labels + "}";
    out << name << "_sum" << braces << " " << number_text(number(histogram, "sum").value_or(0)) << "\n";
    out << name << "_count" << braces << " " << number_text(number(histogram, "count").value_or(0)) << "\n";
}

}  // namespace

const std::vector<MetricInfo> &metric_catalog() {
    static const std::vector<MetricInfo> catalog = [] {
        std::vector<MetricInfo> list;
        list.push_back({"mall_info", "gauge", "Always 1: malld's version, policy and enforcement backend as labels."});
        for (const Metric &m : metrics()) list.push_back(m.info);
        return list;
    }();
    return catalog;
}

std::string render_prometheus(const json &status) {
    if (!status.is_object() || !status.contains("jobs") || !status["jobs"].is_array() || !status.contains("pool"))
        throw std::invalid_argument("not a malld status object (no \"pool\" or \"jobs\")");
    std::vector<double> bounds;
    if (auto it = status.find("histogram_bounds_seconds"); it != status.end() && it->is_array())
        for (const auto &b : *it)
            if (b.is_number()) bounds.push_back(b.get<double>());

    std::ostringstream out;
    out << "# HELP mall_info " << metric_catalog().front().help << "\n# TYPE mall_info gauge\n";
    out << "mall_info{version=\"" << label_value(status.value("version", std::string())) << "\",policy=\""
        << label_value(status.value("policy", std::string())) << "\",backend=\""
        << label_value(status.value("backend", std::string())) << "\"} 1\n";
    for (const Metric &m : metrics()) {
        std::ostringstream samples;
        if (m.histogram) {
            if (bounds.empty()) continue;  // an older malld: no histograms
            if (m.scope == Scope::Node) {
                if (auto node = status.find("node"); node != status.end() && node->contains(m.histogram))
                    write_histogram(samples, m.info.name, "", bounds, (*node)[m.histogram]);
            } else {
                for (const auto &job : status["jobs"])
                    if (job.contains(m.histogram))
                        write_histogram(samples, m.info.name, job_labels(job), bounds, job[m.histogram]);
            }
        } else if (m.scope == Scope::Node) {
            if (auto v = m.value(status)) samples << m.info.name << " " << number_text(*v) << "\n";
        } else {
            for (const auto &job : status["jobs"])
                if (auto v = m.value(job))
                    samples << m.info.name << "{" << job_labels(job) << "} " << number_text(*v) << "\n";
        }
        const std::string text = samples.str();
        if (text.empty() && m.scope == Scope::Node) continue;  // a field an older malld lacks
        out << "# HELP " << m.info.name << " " << m.info.help << "\n# TYPE " << m.info.name << " "
            << m.info.type << "\n"
            << text;
    }
    return out.str();
}

}  // namespace mall
