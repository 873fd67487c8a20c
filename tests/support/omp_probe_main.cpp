// SPDX-License-Identifier: BSD-3-Clause
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
#include <time.h>

#include <cstdio>
#include <string>
#include <vector>

#include <mall/mall.h>
#include <mall/openmp/adapter.hpp>

#include "support/probe_support.hpp"

namespace {

using mall::test::TeamObservation;

// Every thread of an OpenMP region records itself.
void record_team(TeamObservation &observation) {
    observation.clear();
#pragma omp parallel
    observation.record(omp_get_thread_num());
}

TeamObservation g_at_ack;  // filled by the callback that runs after the adapter's

void observe_at_ack(const mall_alloc_t *, void *) { record_team(g_at_ack); }

// One training-like step: a parallel-for reduction over data (a few hundred µs); when observe is
// given, the step's own team records itself.
double step_work(std::vector<double> &data, TeamObservation *observe) {
    double sum = 0.0;
    const long n = static_cast<long>(data.size());
    if (observe != nullptr) observe->clear();
#pragma omp parallel
    {
        if (observe != nullptr) observe->record(omp_get_thread_num());
#pragma omp for reduction(+ : sum)
        for (long i = 0; i < n; ++i) {
            data[i] = data[i] * 0.999 + 0.001;
            sum += data[i];
        }
    }
    return sum;
}

}  // namespace

int main(int argc, char **argv) {
    mall::test::ProbeOptions options;
    if (!mall::test::parse_probe_options(argc, argv, "mall_omp_probe", &options)) return 2;
    std::setvbuf(stdout, nullptr, _IOLBF, 0);

    int open_rc = 0;
    mall_t *m = mall::test::open_probe_handle("mall_omp_probe", omp_get_max_threads(), &open_rc);
    mall::openmp::OpenMPAttachment *adapter = nullptr;
    if (m != nullptr) {
        int rc = mall::openmp::attach_openmp(m, &adapter);
        if (rc == MALL_SUCCESS) rc = mall_on_resize(m, &observe_at_ack, nullptr);
        if (rc != MALL_SUCCESS) std::fprintf(stderr, "mall_omp_probe: attach: %s\n", mall_strerror(rc));
    }
    std::printf("start threads %d malleable %s\n", omp_get_max_threads(),
                open_rc == MALL_SUCCESS ? "yes" : "no");

    std::vector<double> data(1 << 16, 1.0);
    static TeamObservation observed;  // 130 KiB: off the stack
    bool report_pending = false;
    std::string at_ack;
    timespec start{};
    clock_gettime(CLOCK_MONOTONIC, &start);
    long steps = 0;
    do {
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
                        omp_get_max_threads(), observed.team(), observed.ran_on().c_str(),
                        observed.affinity().c_str(), at_ack.c_str(),
                        adapter != nullptr ? adapter->last.pinned : -1);
        }
        ++steps;
    } while (!mall::test::probe_step_ends_run(options, start));
    std::printf("done steps %ld\n", steps);
    mall_close(m);
    return 0;
}
