// SPDX-License-Identifier: BSD-3-Clause
// test_client_main.cpp — mall_test_client, the small training-process stand-in that integration
// tests and benchmarks start under malld. Uses the public C API only. Prints "open rc=<rc> job=<id>",
// then "change step=<n> gen=<g> threads=<t> ncpus=<c> cpus=<list>" for each applied allocation
// (line-buffered; threads: mall_alloc_threads()).
// Exits 0 on SIGTERM/SIGINT or when --duration-s has passed. With --usage N, SIGUSR1 makes it call
// mall_set_usage(N) and SIGUSR2 mall_set_usage(0) at its next step (printing "usage <n> rc=<rc>").
// With --steps N it exits 0 after its N-th step (or --duration-s, or a stop signal, whichever comes
// first), printing last "done steps=<n> changes=<c>
// checksum=<hex>": FNV-1a 64 over the step numbers 1..n as little-endian 64-bit words, so a run
// that lost or repeated a step, or ended early, shows another checksum (the soak test checks it).
#include <signal.h>
#include <sys/prctl.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <boost/program_options.hpp>

#include "mall/mall.h"

namespace po = boost::program_options;

namespace {

std::atomic<bool> g_stop{false};

void on_stop_signal(int) { g_stop.store(true, std::memory_order_relaxed); }

// Sleeps for `us` microseconds; returns early when a stop signal interrupts the sleep.
void sleep_us(long us) {
    timespec ts{us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, nullptr);
}

void worker(mall_t *m, bool spin) {
    int rc = mall_bind_thread(m);
    if (rc != MALL_SUCCESS && rc != MALL_ERR_DETACHED)
        std::fprintf(stderr, "mall_test_client: mall_bind_thread: %s\n", mall_strerror(rc));
    volatile uint64_t sink = 0;
    while (!g_stop.load(std::memory_order_relaxed)) {
        if (spin) {
            for (int i = 0; i < 10000; ++i) sink = sink + static_cast<uint64_t>(i);
        } else {
            sleep_us(10000);
        }
    }
    mall_unbind_thread(m);
}

// Paces the step loop on absolute deadlines so "--step-us 100" means a step every 100 µs, not
// 100 µs of sleep plus the step plus the timer slack; a late step does not shift later ones.
class StepPacer {
public:
    explicit StepPacer(long period_us) : period_ns_(period_us * 1000) {
        clock_gettime(CLOCK_MONOTONIC, &next_);
    }
    void wait() {
        next_.tv_nsec += period_ns_;
        while (next_.tv_nsec >= 1000000000L) {
            next_.tv_nsec -= 1000000000L;
            ++next_.tv_sec;
        }
        timespec now{};
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec > next_.tv_sec || (now.tv_sec == next_.tv_sec && now.tv_nsec > next_.tv_nsec)) {
            next_ = now;  // fell behind (descheduled): restart the grid from now
            return;
        }
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next_, nullptr);
    }

private:
    long period_ns_;
    timespec next_{};
};

// Set by SIGUSR1 (1) and SIGUSR2 (0); the stepping loop consumes it (-1: nothing asked).
std::atomic<int> g_usage_request{-1};
void on_usage_signal(int sig) { g_usage_request.store(sig == SIGUSR1 ? 1 : 0); }

// FNV-1a 64 of one step number, as 8 little-endian bytes, folded into `hash`.
uint64_t fold_step(uint64_t hash, uint64_t step) {
    for (int i = 0; i < 8; ++i) {
        hash ^= (step >> (8 * i)) & 0xffu;
        hash *= 0x100000001b3ULL;
    }
    return hash;
}

}  // namespace

int main(int argc, char **argv) {
    int threads = 2;
    long step_us = 1000;
    double duration_s = 60;
    bool no_step = false, spin = false;
    int usage = 0;
    long long steps_wanted = 0;
    std::string socket;

    po::options_description opts("mall_test_client options");
    opts.add_options()("help,h", "show this text")(
        "threads", po::value<int>(&threads)->default_value(2), "worker threads, each calls mall_bind_thread")(
        "step-us", po::value<long>(&step_us)->default_value(1000), "microseconds between mall_step() calls")(
        "no-step", po::bool_switch(&no_step), "never call mall_step() (a process that never acks)")(
        "duration-s", po::value<double>(&duration_s)->default_value(60), "exit 0 after this many seconds")(
        "spin", po::bool_switch(&spin), "workers busy-loop instead of sleeping")(
        "socket", po::value<std::string>(&socket), "malld's socket (default: $MALL_SOCKET, then the default)")(
        "usage", po::value<int>(&usage), "on SIGUSR1 call mall_set_usage(N); on SIGUSR2 mall_set_usage(0)")(
        "steps", po::value<long long>(&steps_wanted)->default_value(0),
        "exit 0 after this many steps (0: no limit; --duration-s still applies), printing "
        "\"done steps=N changes=C checksum=H\"");
    po::variables_map vm;
    try {
        po::store(po::parse_command_line(argc, argv, opts), vm);
        po::notify(vm);
    } catch (const po::error &e) {
        std::cerr << "mall_test_client: " << e.what() << "\n" << opts;
        return 2;
    }
    if (vm.count("help")) {
        std::cout << "mall_test_client: attaches to malld through libmall, starts worker threads and\n"
                     "calls mall_step() periodically, printing each applied allocation.\n\n"
                  << opts;
        return 0;
    }
    if (threads < 0 || threads > 1024 || step_us < 1 || !(duration_s > 0) || steps_wanted < 0 ||
        (steps_wanted > 0 && no_step)) {
        std::cerr << "mall_test_client: need 0 <= --threads <= 1024, --step-us >= 1, --duration-s > 0, "
                     "--steps >= 0, and not both --steps and --no-step\n";
        return 2;
    }

    setvbuf(stdout, nullptr, _IOLBF, 0);
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);
    sa.sa_handler = on_usage_signal;
    sigaction(SIGUSR1, &sa, nullptr);
    sigaction(SIGUSR2, &sa, nullptr);

    mall_t *m = nullptr;
    mall_error_t err{};
    int rc = mall_open(socket.empty() ? nullptr : socket.c_str(), &m, &err);
    std::printf("open rc=%d job=%s\n", rc, m ? mall_job_id(m) : "");
    if (rc != MALL_SUCCESS) std::fprintf(stderr, "mall_test_client: mall_open: %s: %s\n", mall_strerror(rc), err.text);
    if (!m) return 1;

    std::vector<std::thread> workers;
    for (int i = 0; i < threads; ++i) workers.emplace_back(worker, m, spin);

    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(duration_s));
    static mall_alloc_t alloc;  // large (4 KiB of text): keep it off the stack
    uint64_t step = 0, changes = 0, checksum = 0xcbf29ce484222325ULL;
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);  // wake at the deadline, not up to 50 µs after it
    StepPacer pacer(step_us);
    while (!g_stop.load(std::memory_order_relaxed) && std::chrono::steady_clock::now() < deadline) {
        if (no_step) {
            sleep_us(10000);
            continue;
        }
        ++step;
        checksum = fold_step(checksum, step);
        mall_report_progress(m, 1);
        if (int wanted = g_usage_request.exchange(-1); wanted >= 0) {
            const int value = wanted == 1 ? usage : 0;
            std::printf("usage %d rc=%d\n", value, mall_set_usage(m, value));
        }
        if (mall_step(m) == MALL_SUCCESS && mall_get_allocation(m, &alloc) == MALL_SUCCESS) {
            ++changes;
            std::printf("change step=%llu gen=%llu threads=%d ncpus=%d cpus=%s\n", static_cast<unsigned long long>(step),
                        static_cast<unsigned long long>(alloc.generation), mall_alloc_threads(&alloc), alloc.ncpus,
                        alloc.cpus);
        }
        if (steps_wanted > 0 && step >= static_cast<uint64_t>(steps_wanted)) break;
        pacer.wait();
    }
    g_stop.store(true);
    for (auto &t : workers) t.join();
    mall_close(m);
    if (steps_wanted > 0)
        std::printf("done steps=%llu changes=%llu checksum=%016llx\n", static_cast<unsigned long long>(step),
                    static_cast<unsigned long long>(changes), static_cast<unsigned long long>(checksum));
    return 0;
}
