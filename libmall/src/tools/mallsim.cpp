// SPDX-License-Identifier: BSD-3-Clause
// mallsim.cpp — replays a job trace against mall's real policy code on a simulated node: the real
// NodeManager (two-phase core; the static, equal and throughput policies) on an hwloc synthetic or
// XML topology, driven by a simulated clock, with jobs whose speedup curves are given. It compares
// the ways a node can be shared — a static partition (each job its min cores), oversubscription
// (every job sized for its max, no mall; a stated contention model), and mall's policies — by
// makespan, mean completion time and total work per second. Lets policies be compared at 64-256
// cores and hundreds of jobs in seconds. Deterministic for a given trace or seed.
//
// Model: a job is `work` one-core-seconds; on n cores it progresses speedup(n) per second, with
// speedup linear (n), amdahl:S (1 / (S + (1 - S) / n)) or flat:K (min(n, K)). Under mall the job
// reports its progress to the NodeManager every 0.5 s like libmall does, and moves take effect at
// once (the simulated jobs never attach, so no move waits for an ack). Jobs start in arrival order
// when the pool can hold their min (static and mall), or at arrival (oversubscription: T threads
// on P cores, T > P, gives each job speedup(max) * P / T * efficiency, efficiency
// --oversub-efficiency, default 0.85: the model, not a measurement; bench-oversubscription.sh
// measures it on a real node).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "../common/rules.hpp"
#include "../daemon/core/node_manager.hpp"
#include "../daemon/core/topology.hpp"

namespace po = boost::program_options;
using namespace std::chrono_literals;

namespace {

struct Curve {
    enum Kind { Linear, Amdahl, Flat } kind = Linear;
    double parameter = 0;
    double speedup(double n) const {
        if (n <= 0) return 0;
        switch (kind) {
            case Linear: return n;
            case Amdahl: return 1.0 / (parameter + (1.0 - parameter) / n);
            case Flat: return std::min(n, parameter);
        }
        return n;
    }
    std::string text() const {
        std::ostringstream s;
        if (kind == Linear) s << "linear";
        if (kind == Amdahl) s << "amdahl:" << parameter;
        if (kind == Flat) s << "flat:" << parameter;
        return s.str();
    }
};

std::optional<Curve> parse_curve(const std::string &text) {
    Curve c;
    if (text == "linear") return c;
    auto colon = text.find(':');
    if (colon == std::string::npos) return std::nullopt;
    const std::string kind = text.substr(0, colon);
    char *end = nullptr;
    const double value = std::strtod(text.c_str() + colon + 1, &end);
    if (*end != '\0') return std::nullopt;
    if (kind == "amdahl" && value >= 0 && value <= 1) {
        c.kind = Curve::Amdahl;
    } else if (kind == "flat" && value >= 1) {
        c.kind = Curve::Flat;
    } else {
        return std::nullopt;
    }
    c.parameter = value;
    return c;
}

struct TraceJob {
    std::string id;
    double arrival = 0, work = 0;
    int min = 1, max = 1;
    Curve curve;
};

// arrival_s,work,min,max,curve per line; '#' comments and a header line starting "arrival" skipped.
std::optional<std::vector<TraceJob>> read_trace(const std::string &path, int pool, std::string *error) {
    std::ifstream in(path);
    if (!in) {
        *error = "cannot read " + path;
        return std::nullopt;
    }
    std::vector<TraceJob> jobs;
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
        if (line.empty() || line[0] == '#' || line.rfind("arrival", 0) == 0) continue;
        std::istringstream fields(line);
        std::string a, w, mn, mx, cv;
        if (!std::getline(fields, a, ',') || !std::getline(fields, w, ',') || !std::getline(fields, mn, ',') ||
            !std::getline(fields, mx, ',') || !std::getline(fields, cv)) {
            *error = path + ":" + std::to_string(number) + ": expected arrival_s,work,min,max,curve";
            return std::nullopt;
        }
        TraceJob j;
        j.id = "j" + std::to_string(jobs.size());
        try {
            j.arrival = std::stod(a);
            j.work = std::stod(w);
            j.min = std::stoi(mn);
            j.max = std::stoi(mx);
        } catch (...) {
            *error = path + ":" + std::to_string(number) + ": numbers expected in '" + line + "'";
            return std::nullopt;
        }
        auto curve = parse_curve(cv);
        if (!curve || j.arrival < 0 || !(j.work > 0) || j.min < 1 || j.max < j.min || j.max > pool) {
            *error = path + ":" + std::to_string(number) + ": need arrival >= 0, work > 0, 1 <= min <= max <= " +
                     std::to_string(pool) + " and a curve linear | amdahl:S (0..1) | flat:K (>= 1)";
            return std::nullopt;
        }
        j.curve = *curve;
        jobs.push_back(j);
    }
    std::stable_sort(jobs.begin(), jobs.end(), [](auto &x, auto &y) { return x.arrival < y.arrival; });
    return jobs;
}

// A seeded mixed trace: a third each linear, amdahl:0.3 and flat:4 (the poorly scaling kind).
std::vector<TraceJob> generate_trace(int count, int pool, double mean_gap, uint64_t seed) {
    uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
    auto next = [&state] {
        uint64_t z = (state += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return static_cast<double>((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
    };
    std::vector<TraceJob> jobs;
    double t = 0;
    for (int i = 0; i < count; ++i) {
        TraceJob j;
        j.id = "j" + std::to_string(i);
        t += -std::log(std::max(next(), 1e-12)) * mean_gap;
        j.arrival = t;
        j.work = 50 + 450 * next();
        j.min = 1 + static_cast<int>(next() * std::min(4, pool));
        j.max = std::max(j.min, pool / 2);
        const double kind = next();
        j.curve = kind < 1.0 / 3 ? Curve{} : kind < 2.0 / 3 ? Curve{Curve::Amdahl, 0.3} : Curve{Curve::Flat, 4};
        jobs.push_back(j);
    }
    return jobs;
}

struct Result {
    std::string way;
    double makespan = 0, mean_completion = 0, work_per_s = 0;
    int unfinished = 0;
};

Result summarize(const std::string &way, const std::vector<TraceJob> &jobs, const std::vector<double> &finish) {
    Result r;
    r.way = way;
    double first = jobs.empty() ? 0 : jobs.front().arrival, last = first, completion = 0, work = 0;
    int done = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
        if (finish[i] < 0) {
            ++r.unfinished;
            continue;
        }
        last = std::max(last, finish[i]);
        completion += finish[i] - jobs[i].arrival;
        work += jobs[i].work;
        ++done;
    }
    r.makespan = last - first;
    r.mean_completion = done ? completion / done : 0;
    r.work_per_s = r.makespan > 0 ? work / r.makespan : 0;
    return r;
}

// Effects of a simulated node: nothing to enforce, nobody to notify.
class SimulatedEffects : public mall::Effects {
public:
    bool enforce(const std::string &, const mall::CpuSet &, bool, std::string *) override { return true; }
    void publish(const std::string &, uint64_t, const mall::CpuSet &, int, bool) override {}
    void job_removed(const std::string &) override {}
    void event(const nlohmann::json &) override {}
};

// Static partition and mall's policies: the real NodeManager decides the cores.
Result run_managed(const std::string &way, mall::PolicyKind policy, const mall::Topology &topology,
                   const std::vector<TraceJob> &jobs, double dt, double horizon) {
    SimulatedEffects effects;
    mall::NodeManager manager(topology, topology.all_cpus(), policy, mall::kDefaultAckTimeout, effects);
    const mall::TimePoint t0 = mall::TimePoint{} + 1000s;
    auto at = [&](double seconds) {
        return t0 + std::chrono::duration_cast<mall::Clock::duration>(std::chrono::duration<double>(seconds));
    };
    std::vector<double> done(jobs.size(), 0), finish(jobs.size(), -1);
    std::vector<bool> running(jobs.size(), false);
    size_t next_arrival = 0;
    double next_report = 0;
    for (double t = jobs.empty() ? 0 : jobs.front().arrival; t <= horizon; t += dt) {
        // Arrivals start in order while the pool can hold their min (FIFO: a job waits behind the first
        // one that does not fit).
        while (next_arrival < jobs.size() && jobs[next_arrival].arrival <= t) {
            const TraceJob &j = jobs[next_arrival];
            mall::JobSpec spec;
            spec.id = j.id;
            spec.min = j.min;
            spec.max = j.max;
            spec.pids = {static_cast<pid_t>(100000 + next_arrival)};
            if (!manager.register_job(spec, at(t)).ok) break;
            running[next_arrival] = true;
            ++next_arrival;
        }
        const bool report = t >= next_report;
        if (report) next_report = t + 0.5;
        bool all_done = next_arrival == jobs.size();
        for (size_t i = 0; i < jobs.size(); ++i) {
            if (!running[i]) continue;
            const mall::Job *job = manager.find(jobs[i].id);
            const int cores = job ? job->published.count() : 0;
            done[i] += jobs[i].curve.speedup(cores) * dt;
            if (done[i] >= jobs[i].work) {
                finish[i] = t + dt;
                running[i] = false;
                (void)manager.deregister_job(jobs[i].id, at(t + dt));
                continue;
            }
            all_done = false;
            if (report) manager.progress(jobs[i].id, static_cast<uint64_t>(done[i] * 1000), 0, at(t));
        }
        manager.tick(at(t));
        if (all_done) break;
    }
    return summarize(way, jobs, finish);
}

// Oversubscription: no mall, every job runs its max threads at once on the shared cores.
Result run_oversubscribed(const std::vector<TraceJob> &jobs, int pool, double efficiency, double dt,
                          double horizon) {
    std::vector<double> done(jobs.size(), 0), finish(jobs.size(), -1);
    for (double t = jobs.empty() ? 0 : jobs.front().arrival; t <= horizon; t += dt) {
        int threads = 0;
        bool all_done = true;
        for (size_t i = 0; i < jobs.size(); ++i) {
            if (finish[i] >= 0) continue;
            all_done = false;
            if (jobs[i].arrival <= t) threads += jobs[i].max;
        }
        if (all_done) break;
        const double share = threads > pool ? static_cast<double>(pool) / threads * efficiency : 1.0;
        for (size_t i = 0; i < jobs.size(); ++i) {
            if (finish[i] >= 0 || jobs[i].arrival > t) continue;
            done[i] += jobs[i].curve.speedup(jobs[i].max) * share * dt;
            if (done[i] >= jobs[i].work) finish[i] = t + dt;
        }
    }
    return summarize("oversub", jobs, finish);
}

}  // namespace

int main(int argc, char **argv) {
    std::string topology_spec = "pack:2 core:32 pu:1", trace_path, csv_path;
    int generate = 0;
    uint64_t seed = 1;
    double mean_gap = 10, dt = 0.5, efficiency = 0.85, horizon = 1e7;
    po::options_description opts("Options");
    opts.add_options()("help,h", "show this text")(
        "topology", po::value(&topology_spec)->default_value(topology_spec),
        "the simulated node: an hwloc synthetic description or XML file")(
        "trace", po::value(&trace_path), "job trace: CSV lines arrival_s,work,min,max,curve")(
        "generate", po::value(&generate), "instead of --trace: N seeded jobs (linear, amdahl:0.3, flat:4 mixed)")(
        "seed", po::value(&seed)->default_value(seed), "seed of --generate")(
        "mean-gap", po::value(&mean_gap)->default_value(mean_gap), "mean seconds between arrivals for --generate")(
        "step", po::value(&dt)->default_value(dt), "simulated seconds per step")(
        "oversub-efficiency", po::value(&efficiency)->default_value(efficiency, "0.85"),
        "fraction of its share an oversubscribed job gets done (contention model, 0..1]")(
        "csv", po::value(&csv_path), "also write the per-way metrics to this CSV file");
    po::variables_map vm;
    try {
        po::store(po::parse_command_line(argc, argv, opts), vm);
        po::notify(vm);
    } catch (const po::error &e) {
        std::fprintf(stderr, "mallsim: %s\nsee `mallsim --help`\n", e.what());
        return 2;
    }
    if (vm.count("help")) {
        std::cout << "mallsim - replay a job trace against mall's real policies on a simulated node\n\n"
                     "Usage: mallsim [--topology SPEC] (--trace FILE | --generate N [--seed S]) [options]\n\n"
                     "Runs the trace four ways on the same simulated node and prints, for each, the\n"
                     "makespan, mean completion time and total work per second, with ratios against the\n"
                     "static partition and oversubscription. static, equal and throughput run mall's real\n"
                     "NodeManager and policies on a simulated clock; oversub is a contention model (see\n"
                     "--oversub-efficiency). Work is in one-core-seconds; a job on n cores progresses\n"
                     "speedup(n) per second: linear | amdahl:S | flat:K.\n\n"
                  << opts
                  << "\nLast line: throughput_vs_static=X.XX throughput_vs_oversub=Y.YY (work per second).\n"
                     "\nExample:\n  mallsim --topology 'pack:2 core:32 pu:1' --generate 1000 --seed 7\n";
        return 0;
    }
    if ((vm.count("trace") != 0) == (generate > 0) || generate < 0 || !(dt > 0) || !(efficiency > 0) ||
        efficiency > 1 || !(mean_gap >= 0)) {
        std::fprintf(stderr, "mallsim: give --trace FILE or --generate N (N > 0), --step > 0, "
                             "0 < --oversub-efficiency <= 1, --mean-gap >= 0\n");
        return 2;
    }
    std::string error;
    auto topology = mall::Topology::load(topology_spec, &error);
    if (!topology) {
        std::fprintf(stderr, "mallsim: topology '%s': %s\n", topology_spec.c_str(), error.c_str());
        return 2;
    }
    const int pool = topology->all_cpus().count();
    std::vector<TraceJob> jobs;
    if (generate > 0) {
        jobs = generate_trace(generate, pool, mean_gap, seed);
    } else {
        auto loaded = read_trace(trace_path, pool, &error);
        if (!loaded) {
            std::fprintf(stderr, "mallsim: %s\n", error.c_str());
            return 2;
        }
        jobs = std::move(*loaded);
    }
    const auto started = std::chrono::steady_clock::now();
    std::vector<Result> results;
    results.push_back(run_managed("static", mall::PolicyKind::Static, *topology, jobs, dt, horizon));
    results.push_back(run_oversubscribed(jobs, pool, efficiency, dt, horizon));
    results.push_back(run_managed("equal", mall::PolicyKind::Equal, *topology, jobs, dt, horizon));
    results.push_back(run_managed("throughput", mall::PolicyKind::Throughput, *topology, jobs, dt, horizon));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

    const Result &st = results[0], &ov = results[1];
    std::printf("mallsim: %zu jobs on %d cpus (%s), step %.2f s; simulated in %.2f s\n", jobs.size(), pool,
                topology_spec.c_str(), dt, seconds);
    std::printf("%-11s %12s %16s %12s %10s %10s %10s\n", "way", "makespan_s", "mean_completion_s", "work_per_s",
                "vs_static", "vs_oversub", "unfinished");
    for (const auto &r : results)
        std::printf("%-11s %12.1f %16.1f %12.2f %10.2f %10.2f %10d\n", r.way.c_str(), r.makespan, r.mean_completion,
                    r.work_per_s, st.work_per_s > 0 ? r.work_per_s / st.work_per_s : 0,
                    ov.work_per_s > 0 ? r.work_per_s / ov.work_per_s : 0, r.unfinished);
    if (!csv_path.empty()) {
        std::ofstream csv(csv_path);
        csv << "way,makespan_s,mean_completion_s,work_per_s,unfinished\n";
        for (const auto &r : results)
            csv << r.way << ',' << r.makespan << ',' << r.mean_completion << ',' << r.work_per_s << ',' << r.unfinished
                << '\n';
        if (!csv) {
            std::fprintf(stderr, "mallsim: could not write %s\n", csv_path.c_str());
            return 1;
        }
    }
    const Result &tp = results[3];
    std::printf("throughput_vs_static=%.2f throughput_vs_oversub=%.2f\n",
                st.work_per_s > 0 ? tp.work_per_s / st.work_per_s : 0, ov.work_per_s > 0 ? tp.work_per_s / ov.work_per_s : 0);
    return 0;
}
