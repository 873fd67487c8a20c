// SPDX-License-Identifier: BSD-3-Clause
// torch_probe_main.cpp — mall_torch_probe, a training-like libtorch program for the adapter tests.
// Opens mall (mall_open(NULL): $MALL_SOCKET, set by mallrun), attaches the libtorch adapter, runs
// a small at::matmul plus an element-wise op large enough for libtorch's intra-op parallelism every
// --step-ms and, after the first step that follows each applied allocation, prints:
//   resize gen G cpus LIST threads N omp M team T ran_on LIST affinity LIST at_ack LIST matched B
// threads: at::get_num_threads(); omp: omp_get_max_threads(); team: the threads an
// at::parallel_for used in that step; ran_on: the cpus they ran on; affinity: the mask all of them
// have ("mixed:UNION" when they differ); at_ack: the same, seen by a resize callback registered
// after the adapter's (before mall_step() acks); matched: the adapter's own check (yes|no).
// Prints "start threads N malleable yes|no" first and "done steps S checksum X" last; exits 0
// after --seconds or as soon as --stop-file exists.
#include <omp.h>
#include <time.h>

#include <cstdio>
#include <string>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/full.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/tanh.h>

#include <mall/mall.h>
#include <mall/libtorch/adapter.hpp>

#include "support/probe_support.hpp"

namespace {

using mall::test::kMaxTeam;
using mall::test::TeamObservation;

// The threads of one at::parallel_for record themselves: one chunk per thread libtorch uses
// (grain 1 over a range much larger than any team).
void record_team(TeamObservation &observation) {
    observation.clear();
    at::parallel_for(0, 4 * kMaxTeam, 1,
                     [&observation](int64_t, int64_t) { observation.record(at::get_thread_num()); });
}

TeamObservation g_at_ack;  // filled by the callback that runs after the adapter's

void observe_at_ack(const mall_alloc_t *, void *) {
    try {
        record_team(g_at_ack);
    } catch (...) {
    }
}

}  // namespace

int main(int argc, char **argv) {
    mall::test::ProbeOptions options;
    if (!mall::test::parse_probe_options(argc, argv, "mall_torch_probe", &options)) return 2;
    std::setvbuf(stdout, nullptr, _IOLBF, 0);

    int open_rc = 0;
    mall_t *m = mall::test::open_probe_handle("mall_torch_probe", at::get_num_threads(), &open_rc);
    mall::libtorch::LibtorchAttachment *adapter = nullptr;
    if (m != nullptr) {
        int rc = mall::libtorch::attach_libtorch(m, &adapter);
        if (rc == MALL_SUCCESS) rc = mall_on_resize(m, &observe_at_ack, nullptr);
        if (rc != MALL_SUCCESS) std::fprintf(stderr, "mall_torch_probe: attach: %s\n", mall_strerror(rc));
    }
    std::printf("start threads %d malleable %s\n", at::get_num_threads(),
                open_rc == MALL_SUCCESS ? "yes" : "no");

    // The "model": a weight matrix applied to a batch, and an activation over a large tensor
    // (above libtorch's grain size, so it runs on the intra-op threads).
    const at::Tensor weight = at::full({64, 64}, 1.0 / 64);
    at::Tensor batch = at::full({64, 64}, 0.5);
    at::Tensor activations = at::full({1 << 18}, 0.25);
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
        batch = at::matmul(batch, weight);
        activations = at::tanh(activations);
        if (m != nullptr) mall_report_progress(m, 1);
        if (report_pending) {
            report_pending = false;
            record_team(observed);
            mall_alloc_t alloc;
            mall_get_allocation(m, &alloc);
            std::printf("resize gen %llu cpus %s threads %d omp %d team %d ran_on %s affinity %s "
                        "at_ack %s matched %s\n",
                        static_cast<unsigned long long>(alloc.generation), alloc.cpus,
                        at::get_num_threads(), omp_get_max_threads(), observed.team(),
                        observed.ran_on().c_str(), observed.affinity().c_str(), at_ack.c_str(),
                        adapter != nullptr && adapter->last.matched ? "yes" : "no");
        }
        ++steps;
    } while (!mall::test::probe_step_ends_run(options, start));
    std::printf("done steps %ld checksum %.6f\n", steps,
                batch.sum().item<double>() + activations.sum().item<double>());
    mall_close(m);
    return 0;
}
