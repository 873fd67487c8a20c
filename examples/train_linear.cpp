// SPDX-License-Identifier: BSD-3-Clause
// train_linear.cpp — mall_train_linear, a memory-bound training job: logistic regression trained by
// mini-batch gradient descent (momentum 0.9) streaming over a dense float dataset far larger than
// the caches (default 1M rows x 256 features = 1 GiB, seeded synthetic data labelled by a planted
// teacher with 5% label noise). Each row is read once per pass for ~2 flops per 4-byte feature
// (a dot product and an axpy), so a step is bound by memory bandwidth, not by cores: a second core
// adds little once one core nearly saturates the bus. It is the "scales poorly" job of
// launch_scripts/bench-cosched.sh, next to the compute-bound mall_train_digits.
//
// Contract: every mini-batch is cut into a FIXED number of blocks (kBlocks) whose gradients are
// summed in block order, so a seed gives bit-identical weights (same checksum) for any thread count
// and any sequence of resizes. With the defaults the held-out accuracy is >= 0.90 (the noise caps
// it at ~0.95). The blocks run on Eigen's own ThreadPool of --max-threads workers; under malld
// (mallrun, or MALL_SOCKET set) a mall::tf::PoolParking parks or releases its workers to follow
// the allocation (and pins them, inside mall_step(), before the ack); it reports rows as progress.
// Otherwise it runs on --threads threads.
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#define EIGEN_USE_THREADS
#include <Eigen/Core>
#include <boost/program_options.hpp>
#include <unsupported/Eigen/CXX11/ThreadPool>

#include "mall/mall.h"
#include "mall/tf/pool_parking.hpp"

#include "example_options.hpp"
#include "example_support.hpp"
#include "malleable_pool.hpp"

namespace po = boost::program_options;
using mall::examples::affinity_count;
using mall::examples::affinity_list;
using mall::examples::fnv1a;
using mall::examples::Rng;

namespace {

// Blocks per mini-batch (and per generated slab): fixed, so sums never depend on the thread count.
constexpr int kBlocks = 64;
constexpr double kLabelNoise = 0.05;

using ConstRow = Eigen::Map<const Eigen::VectorXf>;
using Row = Eigen::Map<Eigen::VectorXf>;

// Runs task(0..blocks-1) on the pool and returns when all are done (the caller only waits).
void run_blocks(Eigen::ThreadPoolInterface &pool, int blocks, const std::function<void(int)> &task) {
    Eigen::Barrier barrier(static_cast<unsigned>(blocks));
    for (int b = 0; b < blocks; ++b)
        pool.Schedule([&task, &barrier, b] {
            task(b);
            barrier.Notify();
        });
    barrier.Wait();
}

// Row range [first, last) of block b when `rows` rows are cut into kBlocks.
std::pair<int64_t, int64_t> block_range(int64_t rows, int b) {
    return {rows * b / kBlocks, rows * (b + 1) / kBlocks};
}

struct Dataset {
    int64_t rows = 0;
    int features = 0;
    std::vector<float> x;    // rows x features, row-major
    std::vector<float> y;    // 0 or 1
};

// x uniform in [-1, 1); y = [teacher . x > 0], flipped with probability kLabelNoise. Generated in
// kBlocks slabs, each from its own seeded generator, on the pool: the same data for any thread count.
Dataset make_dataset(Eigen::ThreadPoolInterface &pool, int64_t rows, int features, uint64_t seed) {
    Dataset ds;
    ds.rows = rows;
    ds.features = features;
    ds.x.resize(static_cast<size_t>(rows) * features);
    ds.y.resize(static_cast<size_t>(rows));
    Eigen::VectorXf teacher(features);
    Rng teacher_rng(seed * 0x9E3779B97F4A7C15ull + 11);
    for (int k = 0; k < features; ++k) teacher[k] = static_cast<float>(teacher_rng.normal());
    run_blocks(pool, kBlocks, [&](int b) {
        Rng rng((seed + 1) * 0xD1342543DE82EF95ull + static_cast<uint64_t>(b));
        const auto [first, last] = block_range(rows, b);
        for (int64_t i = first; i < last; ++i) {
            float *xi = &ds.x[static_cast<size_t>(i) * features];
            for (int k = 0; k < features; ++k) xi[k] = static_cast<float>(2.0 * rng.uniform() - 1.0);
            const bool positive = ConstRow(xi, features).dot(teacher) > 0.0f;
            ds.y[static_cast<size_t>(i)] = (positive != (rng.uniform() < kLabelNoise)) ? 1.0f : 0.0f;
        }
    });
    return ds;
}

// Mean logistic loss over rows [first, first + count) when want_loss; adds the summed gradient
// of each block to its row of block_grads. The row is read once: dot, then axpy while it is in L1.
double gradient(Eigen::ThreadPoolInterface &pool, const Dataset &ds, int64_t first, int64_t count,
                const Eigen::VectorXf &w, Eigen::MatrixXf &block_grads, std::vector<double> &block_loss,
                bool want_loss) {
    const int d = ds.features;
    run_blocks(pool, kBlocks, [&](int b) {
        Row g(block_grads.col(b).data(), d);
        g.setZero();
        double loss = 0;
        const auto [lo, hi] = block_range(count, b);
        for (int64_t i = first + lo; i < first + hi; ++i) {
            const ConstRow xi(&ds.x[static_cast<size_t>(i) * d], d);
            const float z = xi.dot(w), label = ds.y[static_cast<size_t>(i)];
            const float p = 1.0f / (1.0f + std::exp(-z));
            g.noalias() += (p - label) * xi;
            if (want_loss)  // log(1 + e^-|z|) + max(z, 0) - label z, stable for any z
                loss += std::log1p(std::exp(-std::fabs(static_cast<double>(z)))) + std::max<double>(z, 0.0) -
                        label * static_cast<double>(z);
        }
        block_loss[static_cast<size_t>(b)] = loss;
    });
    double loss = 0;
    for (double l : block_loss) loss += l;
    return loss / static_cast<double>(count);
}

double accuracy(const Dataset &ds, int64_t first, int64_t last, const Eigen::VectorXf &w) {
    int64_t correct = 0;
    for (int64_t i = first; i < last; ++i) {
        const float z = ConstRow(&ds.x[static_cast<size_t>(i) * ds.features], ds.features).dot(w);
        correct += ((z > 0.0f) == (ds.y[static_cast<size_t>(i)] > 0.5f)) ? 1 : 0;
    }
    return last > first ? static_cast<double>(correct) / static_cast<double>(last - first) : 0.0;
}

}  // namespace

int main(int argc, char **argv) {
    int steps = 400, features = 256, print_every = 50, fixed_threads = 0, max_threads = 0;
    int64_t rows = 1 << 20, batch = 1 << 16;
    uint64_t seed = 1;
    double lr = 0.5, momentum = 0.9;
    bool quiet = false, log_changes = false;

    po::options_description opts("Options");
    opts.add_options()("help,h", "show this text")(
        "steps", po::value<int>(&steps)->default_value(steps), "training steps (mini-batches)")(
        "rows", po::value<int64_t>(&rows)->default_value(rows), "rows of the dataset (the last 1/16 held out)")(
        "features", po::value<int>(&features)->default_value(features), "features per row (float)")(
        "batch", po::value<int64_t>(&batch)->default_value(batch), "rows per mini-batch (read in order, wrapping)")(
        "lr", po::value<double>(&lr)->default_value(lr, "0.5"), "learning rate (momentum 0.9)")(
        "seed", po::value<uint64_t>(&seed)->default_value(seed), "seed of the data and the teacher")(
        "threads", po::value<int>(&fixed_threads),
        "threads when not under malld (default: the cpus this process may use)")(
        "max-threads", po::value<int>(&max_threads), "workers of Eigen's pool, parked down to the threads in use (default: the online cpus)")(
        "print-every", po::value<int>(&print_every)->default_value(print_every), "print the loss every K steps (0: never)")(
        "log-changes", po::bool_switch(&log_changes), "print a line for each allocation applied")(
        "quiet,q", po::bool_switch(&quiet), "print only the last two lines");
    po::variables_map vm;
    if (!mall::examples::parse_options("mall_train_linear", argc, argv, opts, vm)) return 2;
    if (vm.count("help")) {
        std::printf(
            "mall_train_linear - a malleable, memory-bound training loop: logistic regression streaming over\n"
            "a dataset far larger than the caches, so it gains little from a second core once one core\n"
            "nearly saturates memory bandwidth (the poorly scaling job of bench-cosched.sh).\n"
            "\n"
            "Usage: mall_train_linear [options]\n"
            "       mallrun --malleable=1:4 -- mall_train_linear [options]\n"
            "\n"
            "Its blocks run on Eigen's own ThreadPool. Under mallrun (MALL_JOB_ID or MALL_SOCKET set) the\n"
            "pool follows the allocation: mall_step() parks or releases workers and re-pins them before\n"
            "the ack, and each step reports its rows as progress. Otherwise, or when malld does not\n"
            "answer (one warning), it runs on --threads threads. The same seed gives the same weights\n"
            "(checksum) for any thread count. The dataset takes rows x features x 4 bytes of memory\n"
            "(default 1 GiB).\n"
            "\n");
        std::printf("%s", mall::examples::options_text(opts).c_str());
        std::printf(
            "\nOutput: every K steps \"step <n> loss <x> threads <t> cpus <list>\"; with --log-changes\n"
            "\"resize step <n> gen <g> threads <a> -> <b> cpus <list>\" then \"parked step <n> tids <list|->\"\n"
            "(the workers parked now); at the end \"final loss <x> test_accuracy <a> checksum <hex>\" and\n"
            "\"done steps <n> seconds <s> rows_per_s <r> resizes <k>\".\n"
            "\nExit status: 0 trained, 1 out of memory, 2 bad arguments.\n"
            "\nExample:\n  mallrun --malleable=1:2 -- mall_train_linear --steps 200 --log-changes\n");
        return 0;
    }
    const int online = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    if (!vm.count("max-threads")) max_threads = online;
    if (steps < 1 || rows < 2 * kBlocks || rows > (int64_t{1} << 32) || features < 1 || features > 65536 ||
        batch < kBlocks || batch > rows - rows / 16 || print_every < 0 || !(lr > 0) ||
        (vm.count("threads") && (fixed_threads < 1 || fixed_threads > 1024)) || max_threads < 1 ||
        max_threads > 1024) {
        std::fprintf(stderr,
                     "mall_train_linear: need --steps >= 1, %d*2 <= --rows <= 2^32, 1 <= --features <= 65536,\n"
                     "%d <= --batch <= the training rows (15/16 of --rows), --print-every >= 0, --lr > 0,\n"
                     "1 <= --threads, --max-threads <= 1024\n",
                     kBlocks, kBlocks);
        return 2;
    }
    setvbuf(stdout, nullptr, _IOLBF, 0);

    const int start_threads = vm.count("threads") ? fixed_threads : affinity_count();
    // Eigen's own pool; the parking (declared after it) releases its workers before it goes.
    Eigen::ThreadPool pool(max_threads);
    mall::tf::PoolParking parking(pool);
    parking.resize(std::clamp(start_threads, 1, max_threads));
    mall_t *m = mall::examples::attach_if_launched("mall_train_linear", parking);

    Dataset data;
    try {
        data = make_dataset(pool, rows, features, seed);
    } catch (const std::bad_alloc &) {
        std::fprintf(stderr, "mall_train_linear: %" PRId64 " x %d floats do not fit in memory; lower --rows\n", rows,
                     features);
        if (m != nullptr) mall_close(m);
        return 1;
    }
    const int64_t train_rows = rows - rows / 16;

    Eigen::VectorXf w = Eigen::VectorXf::Zero(features), velocity = Eigen::VectorXf::Zero(features);
    Eigen::MatrixXf block_grads(features, kBlocks);
    Eigen::VectorXf grad(features);
    std::vector<double> block_loss(kBlocks, 0.0);
    int64_t cursor = 0;
    mall::examples::StepBoundary boundary(m, &parking, log_changes && !quiet);
    double loss = 0;
    const auto started = std::chrono::steady_clock::now();

    for (int step = 1; step <= steps; ++step) {
        // The step boundary: a changed allocation resized and re-pinned the pool when this returns
        // MALL_SUCCESS; otherwise it cost two atomic loads.
        boundary.cross(step);
        if (cursor + batch > train_rows) cursor = 0;
        const bool want_loss = step == steps || (!quiet && print_every > 0 && (step % print_every == 0 || step == 1));
        const double step_loss = gradient(pool, data, cursor, batch, w, block_grads, block_loss, want_loss);
        if (want_loss) loss = step_loss;
        cursor += batch;
        // Block gradients summed in block order: the same bits for any thread count.
        grad.setZero();
        for (int b = 0; b < kBlocks; ++b) grad += block_grads.col(b);
        velocity = static_cast<float>(momentum) * velocity - static_cast<float>(lr / static_cast<double>(batch)) * grad;
        w += velocity;
        if (m != nullptr) (void)mall_report_progress(m, static_cast<uint64_t>(batch));

        if (!quiet && print_every > 0 && (step % print_every == 0 || step == 1))
            std::printf("step %d loss %.6f threads %d cpus %s\n", step, loss, parking.active_threads(),
                        affinity_list().c_str());
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

    std::printf("final loss %.6f test_accuracy %.4f checksum %016" PRIx64 "\n", loss,
                accuracy(data, train_rows, rows, w), fnv1a(w.data(), sizeof(float) * static_cast<size_t>(features)));
    std::printf("done steps %d seconds %.3f rows_per_s %.1f resizes %d\n", steps, seconds,
                static_cast<double>(steps) * static_cast<double>(batch) / seconds, boundary.resizes());
    if (m != nullptr) mall_close(m);
    return 0;
}
