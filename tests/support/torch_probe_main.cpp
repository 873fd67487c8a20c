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
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/full.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/tanh.h>

#include <mall/mall.h>
#include <mall/tf/libtorch_adapter.hpp>

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

// What the threads of one at::parallel_for saw: libtorch's thread number, cpu and mask.
struct TeamObservation {
    std::atomic<bool> seen[kMaxTeam];
    int cpu[kMaxTeam];
    cpu_set_t mask[kMaxTeam];

    void observe() {
        for (auto &s : seen) s.store(false);
        // One chunk per thread libtorch uses (grain 1 over a range much larger than any team).
        at::parallel_for(0, 4 * kMaxTeam, 1, [this](int64_t, int64_t) {
            const int id = at::get_thread_num();
            if (id < 0 || id >= kMaxTeam) return;
            cpu[id] = sched_getcpu();
            CPU_ZERO(&mask[id]);
            if (sched_getaffinity(0, sizeof mask[id], &mask[id]) != 0) CPU_ZERO(&mask[id]);
            seen[id].store(true);
        });
    }
    int team() const {
        int n = 0;
        for (const auto &s : seen) n += s.load();
        return n;
    }
    std::string ran_on() const {
        cpu_set_t set;
        CPU_ZERO(&set);
        for (int i = 0; i < kMaxTeam; ++i)
            if (seen[i].load() && cpu[i] >= 0 && cpu[i] < CPU_SETSIZE) CPU_SET(cpu[i], &set);
        return cpu_list(set);
    }
    std::string affinity() const {
        cpu_set_t all;
        CPU_ZERO(&all);
        const cpu_set_t *first = nullptr;
        bool equal = true;
        for (int i = 0; i < kMaxTeam; ++i) {
            if (!seen[i].load()) continue;
            if (first == nullptr) first = &mask[i];
            CPU_OR(&all, &all, &mask[i]);
            equal = equal && CPU_EQUAL(&mask[i], first);
        }
        if (first == nullptr) return "none";
        return equal ? cpu_list(all) : "mixed:" + cpu_list(all);
    }
};

TeamObservation g_at_ack;  // filled by the callback that runs after the adapter's

void observe_at_ack(const mall_alloc_t *, void *) {
    try {
        g_at_ack.observe();
    } catch (...) {
    }
}

void usage() {
    std::fprintf(stderr, "usage: mall_torch_probe [--step-ms N] [--seconds N] [--stop-file PATH]\n");
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
        std::fprintf(stderr, "mall_torch_probe: not malleable (%s: %s); running with %d threads\n",
                     mall_strerror(open_rc), err.text, at::get_num_threads());
    }
    mall::tf::LibtorchAttachment *adapter = nullptr;
    if (m != nullptr) {
        int rc = mall::tf::attach_libtorch(m, &adapter);
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
        batch = at::matmul(batch, weight);
        activations = at::tanh(activations);
        if (m != nullptr) mall_report_progress(m, 1);
        if (report_pending) {
            report_pending = false;
            observed.observe();
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
        if (!stop_file.empty() && access(stop_file.c_str(), F_OK) == 0) break;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - start.tv_sec >= seconds) break;
        timespec pause{step_ms / 1000, (step_ms % 1000) * 1000000L};
        nanosleep(&pause, nullptr);
    }
    std::printf("done steps %ld checksum %.6f\n", steps,
                batch.sum().item<double>() + activations.sum().item<double>());
    mall_close(m);
    return 0;
}
