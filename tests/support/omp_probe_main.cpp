// omp_probe_main.cpp — mall_omp_probe, a training-like OpenMP program for the adapter tests. Opens
// mall (mall_open(NULL): $MALL_SOCKET, set by mallrun), attaches the OpenMP adapter, runs an
// OpenMP parallel-for reduction every --step-ms and, after the first step that follows each
// applied allocation, prints (line-buffered):
//   resize gen G cpus LIST threads N team T ran_on LIST affinity LIST at_ack LIST pinned P
// threads: omp_get_max_threads(); team: omp_get_num_threads() in that step's region; ran_on: the
// cpus its threads ran on (sched_getcpu); affinity: the mask all its threads have ("mixed:UNION"
// when they differ); at_ack: the same, seen by a resize callback registered after the adapter's,
// i.e. before mall_step() acks (and so before malld enforces a shrink); pinned: the threads the
// adapter pinned (its OpenMPResizeResult).
// Prints "start threads N malleable yes|no" first and "done steps S" last; exits 0 after
// --seconds or as soon as --stop-file exists.
#include <omp.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <mall/mall.h>
#include <mall/tf/openmp_adapter.hpp>

namespace {

constexpr int kMaxTeam = 1024;

// Linux list text ("0-1,4") of a cpu set.
std::string cpu_list(const cpu_set_t &set) {
    std::string text;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (!CPU_ISSET(cpu, &set)) continue;
        int last = cpu;
        while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, &set)) ++last;
        if (!text.empty()) text += ",";
        text += std::to_string(cpu);
        if (last > cpu) text += "-" + std::to_string(last);
        cpu = last;
    }
    return text.empty() ? "none" : text;
}

// What each thread of one parallel region saw: its cpu and its affinity mask.
struct TeamObservation {
    int team = 0;
    int cpu[kMaxTeam];
    cpu_set_t mask[kMaxTeam];

    // Called by every thread of the region.
    void record() {
        const int id = omp_get_thread_num();
        if (id == 0) team = omp_get_num_threads();
        if (id >= kMaxTeam) return;
        cpu[id] = sched_getcpu();
        CPU_ZERO(&mask[id]);
        if (sched_getaffinity(0, sizeof mask[id], &mask[id]) != 0) CPU_ZERO(&mask[id]);
    }
    std::string ran_on() const {
        cpu_set_t set;
        CPU_ZERO(&set);
        for (int i = 0; i < team && i < kMaxTeam; ++i)
            if (cpu[i] >= 0 && cpu[i] < CPU_SETSIZE) CPU_SET(cpu[i], &set);
        return cpu_list(set);
    }
    // The common mask, or "mixed:UNION".
    std::string affinity() const {
        if (team <= 0) return "none";
        cpu_set_t all;
        CPU_ZERO(&all);
        bool equal = true;
        for (int i = 0; i < team && i < kMaxTeam; ++i) {
            CPU_OR(&all, &all, &mask[i]);
            equal = equal && CPU_EQUAL(&mask[i], &mask[0]);
        }
        return equal ? cpu_list(all) : "mixed:" + cpu_list(all);
    }
};

TeamObservation g_at_ack;  // filled by the callback that runs after the adapter's

void observe_at_ack(const mall_alloc_t *, void *) {
#pragma omp parallel
    g_at_ack.record();
}

// One training-like step: a parallel-for reduction over data (a few hundred µs).
double step_work(std::vector<double> &data, TeamObservation *observe) {
    double sum = 0.0;
    const long n = static_cast<long>(data.size());
#pragma omp parallel
    {
        if (observe != nullptr) observe->record();
#pragma omp for reduction(+ : sum)
        for (long i = 0; i < n; ++i) {
            data[i] = data[i] * 0.999 + 0.001;
            sum += data[i];
        }
    }
    return sum;
}

void usage() {
    std::fprintf(stderr, "usage: mall_omp_probe [--step-ms N] [--seconds N] [--stop-file PATH]\n");
}

}  // namespace

int main(int argc, char **argv) {
    long step_ms = 5, seconds = 120;
    std::string stop_file;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (i + 1 >= argc) return usage(), 2;
        if (arg == "--step-ms") step_ms = std::atol(argv[++i]);
        else if (arg == "--seconds") seconds = std::atol(argv[++i]);
        else if (arg == "--stop-file") stop_file = argv[++i];
        else return usage(), 2;
    }
    std::setvbuf(stdout, nullptr, _IOLBF, 0);

    mall_t *m = nullptr;
    mall_error_t err{};
    const int open_rc = mall_open(nullptr, &m, &err);
    if (open_rc != MALL_SUCCESS) {
        std::fprintf(stderr, "mall_omp_probe: not malleable (%s: %s); running with %d OpenMP threads\n",
                     mall_strerror(open_rc), err.text, omp_get_max_threads());
    }
    mall::tf::OpenMPAttachment *adapter = nullptr;
    if (m != nullptr) {
        int rc = mall::tf::attach_openmp(m, &adapter);
        if (rc == MALL_SUCCESS) rc = mall_on_resize(m, &observe_at_ack, nullptr);
        if (rc != MALL_SUCCESS) std::fprintf(stderr, "mall_omp_probe: attach: %s\n", mall_strerror(rc));
    }
    std::printf("start threads %d malleable %s\n", omp_get_max_threads(),
                open_rc == MALL_SUCCESS ? "yes" : "no");

    std::vector<double> data(1 << 16, 1.0);
    TeamObservation observed;
    bool report_pending = false;
    std::string at_ack;
    timespec start{}, now{};
    clock_gettime(CLOCK_MONOTONIC, &start);
    long steps = 0;
    for (;;) {
        if (m != nullptr && mall_step(m) == MALL_SUCCESS) {
            report_pending = true;
            at_ack = g_at_ack.affinity();
        }
        step_work(data, report_pending ? &observed : nullptr);
        if (m != nullptr) mall_report_progress(m, 1);
        if (report_pending) {
            report_pending = false;
            mall_alloc_t alloc;
            mall_get_allocation(m, &alloc);
            std::printf("resize gen %llu cpus %s threads %d team %d ran_on %s affinity %s at_ack %s "
                        "pinned %d\n",
                        static_cast<unsigned long long>(alloc.generation), alloc.cpus,
                        omp_get_max_threads(), observed.team, observed.ran_on().c_str(),
                        observed.affinity().c_str(), at_ack.c_str(),
                        adapter != nullptr ? adapter->last.pinned : -1);
        }
        ++steps;
        if (!stop_file.empty() && access(stop_file.c_str(), F_OK) == 0) break;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - start.tv_sec >= seconds) break;
        timespec pause{step_ms / 1000, (step_ms % 1000) * 1000000L};
        nanosleep(&pause, nullptr);
    }
    std::printf("done steps %ld\n", steps);
    mall_close(m);
    return 0;
}
