// SPDX-License-Identifier: BSD-3-Clause
// train_digits.cpp — mall_train_digits, the Eigen training example a TensorFlow user recognises: a
// 64-H-10 MLP written with Eigen::Tensor contractions evaluated on an Eigen::ThreadPoolDevice (the
// engine under TensorFlow's CPU kernels), trained by mini-batch SGD with momentum on the 8x8
// handwritten digits that Debian's python3-sklearn ships (1797 images; a seeded 1437/360 split).
//
// Contract: with the defaults (300 steps of 512 images, 1024 hidden units; ~8 ms a step on one core
// here) the held-out test accuracy is >= 0.95 (measured 0.969-0.983 over seeds 1-5). The device
// always runs on Eigen's own ThreadPool. Under malld (mallrun, or MALL_SOCKET set) the pool has
// --max-threads workers and a mall::tf::PoolParking attached to libmall: every mall_step() that
// brings a new allocation parks or releases workers to its thread count and pins them before it
// acks; the device is rebuilt each step with parking.active_threads(), so Eigen splits its work
// that many ways (as TensorFlow's DirectSession re-reads its intra-op pool's size at each Run).
// With --pool eigen the pool has --threads workers and nothing of mall (the baseline of
// bench-oversubscription.sh).
// Eigen could block a contraction differently for different thread counts, so losses may differ in
// the last float bits between thread counts (at these sizes they are bit-identical for 1 and 2).
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#define EIGEN_USE_THREADS
#include <boost/program_options.hpp>
#include <unsupported/Eigen/CXX11/Tensor>

#include "mall/mall.h"
#include "mall/tf/pool_parking.hpp"

#include "digits_data.hpp"
#include "digits_mlp.hpp"
#include "example_options.hpp"
#include "example_support.hpp"
#include "malleable_pool.hpp"

namespace po = boost::program_options;

namespace {

using namespace mall::examples;

using Matrix = Eigen::Tensor<float, 2, Eigen::RowMajor>;
using Vector = Eigen::Tensor<float, 1, Eigen::RowMajor>;
using ContractDims = Eigen::array<Eigen::IndexPair<int>, 1>;
const ContractDims kMatMul = {Eigen::IndexPair<int>(1, 0)};  // A[i,k] B[k,j]
const ContractDims kATimesB = {Eigen::IndexPair<int>(0, 0)};  // A^T B
const ContractDims kATimesBT = {Eigen::IndexPair<int>(1, 1)};  // A B^T

struct Model {
    Matrix w1, w2;    // 64 x H, H x 10
    Vector b1, b2;    // H, 10
    Matrix vw1, vw2;  // momentum
    Vector vb1, vb2;
};

Model make_model(int hidden, uint64_t seed) {
    Model m;
    Rng rng(seed * 0x9E3779B97F4A7C15ull + 1);
    auto he = [&rng](Matrix &w, int rows, int cols) {
        w.resize(rows, cols);
        const double scale = std::sqrt(2.0 / rows);
        for (int i = 0; i < rows; ++i)
            for (int j = 0; j < cols; ++j) w(i, j) = static_cast<float>(rng.normal() * scale);
    };
    he(m.w1, kFeatures, hidden);
    he(m.w2, hidden, kClasses);
    m.b1.resize(hidden);
    m.b2.resize(kClasses);
    m.b1.setZero();
    m.b2.setZero();
    m.vw1.resize(kFeatures, hidden);
    m.vw2.resize(hidden, kClasses);
    m.vb1.resize(hidden);
    m.vb2.resize(kClasses);
    m.vw1.setZero();
    m.vw2.setZero();
    m.vb1.setZero();
    m.vb2.setZero();
    return m;
}

// Buffers of one forward/backward pass over `rows` images (reused every step).
struct Pass {
    Matrix x, z1, a1, logits, dlogits, da1, dz1, dw1, dw2;
    Vector db1, db2;
    Pass(int rows, int hidden)
        : x(rows, kFeatures), z1(rows, hidden), a1(rows, hidden), logits(rows, kClasses),
          dlogits(rows, kClasses), da1(rows, hidden), dz1(rows, hidden), dw1(kFeatures, hidden),
          dw2(hidden, kClasses), db1(hidden), db2(kClasses) {}
};

void load_rows(const Dataset &data, const int *indices, int rows, Matrix &x) {
    for (int r = 0; r < rows; ++r)
        std::copy_n(&data.pixels[static_cast<size_t>(indices[r]) * kFeatures], kFeatures, x.data() + r * kFeatures);
}

void forward(const Eigen::ThreadPoolDevice &device, const Model &m, Pass &p) {
    const Eigen::Index rows = p.x.dimension(0), hidden = m.w1.dimension(1);
    const Eigen::array<Eigen::Index, 2> row_shape{1, hidden}, class_shape{1, kClasses}, repeat{rows, 1};
    p.z1.device(device) = p.x.contract(m.w1, kMatMul) + m.b1.reshape(row_shape).broadcast(repeat);
    p.a1.device(device) = p.z1.cwiseMax(0.0f);
    p.logits.device(device) = p.a1.contract(m.w2, kMatMul) + m.b2.reshape(class_shape).broadcast(repeat);
}

// The mean loss of the pass; fills dlogits with d(mean loss)/d(logits).
double mean_softmax_loss(Pass &p, const Dataset &data, const int *indices, int *correct) {
    const int rows = static_cast<int>(p.logits.dimension(0));
    return softmax_loss(p.logits, data, indices, correct,
                        [&](int r, int c, double d) { p.dlogits(r, c) = static_cast<float>(d / rows); }) /
           rows;
}

void backward_and_update(const Eigen::ThreadPoolDevice &device, Model &m, Pass &p, float lr, float momentum) {
    const Eigen::array<Eigen::Index, 1> over_rows{0};
    p.dw2.device(device) = p.a1.contract(p.dlogits, kATimesB);
    p.db2.device(device) = p.dlogits.sum(over_rows);
    p.da1.device(device) = p.dlogits.contract(m.w2, kATimesBT);
    p.dz1.device(device) = (p.z1 > p.z1.constant(0.0f)).select(p.da1, p.da1.constant(0.0f));
    p.dw1.device(device) = p.x.contract(p.dz1, kATimesB);
    p.db1.device(device) = p.dz1.sum(over_rows);
    m.vw1.device(device) = m.vw1 * momentum - p.dw1 * lr;
    m.vw2.device(device) = m.vw2 * momentum - p.dw2 * lr;
    m.vb1.device(device) = m.vb1 * momentum - p.db1 * lr;
    m.vb2.device(device) = m.vb2 * momentum - p.db2 * lr;
    m.w1.device(device) += m.vw1;
    m.w2.device(device) += m.vw2;
    m.b1.device(device) += m.vb1;
    m.b2.device(device) += m.vb2;
}

// Accuracy over a fixed set of images, in one pass.
double accuracy(const Eigen::ThreadPoolDevice &device, const Model &m, const Dataset &data,
                const std::vector<int> &indices, int hidden) {
    Pass p(static_cast<int>(indices.size()), hidden);
    load_rows(data, indices.data(), static_cast<int>(indices.size()), p.x);
    forward(device, m, p);
    int correct = 0;
    (void)softmax_loss(p.logits, data, indices.data(), &correct, NoGradient{});
    return static_cast<double>(correct) / static_cast<double>(indices.size());
}

}  // namespace

int main(int argc, char **argv) {
    int steps = 300, batch = 512, hidden = 1024, print_every = 25, fixed_threads = 0, max_threads = 0;
    int input_wait_us = 0;
    uint64_t seed = 1;
    double lr = 0.05, momentum = 0.9;
    std::string data_path = kDefaultDigits, pool_kind = "parked";
    bool quiet = false, log_changes = false;

    po::options_description opts("Options");
    opts.add_options()("help,h", "show this text")(
        "steps", po::value<int>(&steps)->default_value(steps), "training steps (mini-batches)")(
        "batch", po::value<int>(&batch)->default_value(batch), "images per mini-batch (1..1437)")(
        "hidden", po::value<int>(&hidden)->default_value(hidden), "hidden units (1..4096)")(
        "lr", po::value<double>(&lr)->default_value(lr, "0.05"), "learning rate (SGD, momentum 0.9)")(
        "seed", po::value<uint64_t>(&seed)->default_value(seed), "seed of the split, the batches and the initial weights")(
        "data", po::value<std::string>(&data_path)->default_value(data_path), "digits file (sklearn's digits.csv.gz)")(
        "pool", po::value<std::string>(&pool_kind)->default_value(pool_kind),
        "Eigen's ThreadPool under the device: parked (--max-threads workers, parked to follow malld) or\n"
        "eigen (--threads workers, fixed, nothing of mall)")(
        "threads", po::value<int>(&fixed_threads),
        "threads when not under malld, and the fixed size of --pool eigen (default: the cpus this process may use)")(
        "max-threads", po::value<int>(&max_threads),
        "workers of the parked pool (its largest size; default: the online cpus)")(
        "input-wait-us", po::value<int>(&input_wait_us)->default_value(input_wait_us),
        "microseconds each step waits for its batch before computing (0..1000000), as a step "
        "waits for an input pipeline or spends time in Python: the pool's cores idle meanwhile")(
        "print-every", po::value<int>(&print_every)->default_value(print_every), "print the loss every K steps (0: never)")(
        "log-changes", po::bool_switch(&log_changes), "print a line for each allocation applied")(
        "quiet,q", po::bool_switch(&quiet), "print only the last two lines");
    po::variables_map vm;
    if (!mall::examples::parse_options("mall_train_digits", argc, argv, opts, vm)) return 2;
    if (vm.count("help")) {
        std::printf(
            "mall_train_digits - a malleable Eigen training loop: an MLP on Eigen::Tensor, evaluated on an\n"
            "Eigen::ThreadPoolDevice, trained on the handwritten digits python3-sklearn ships.\n"
            "\n"
            "Usage: mall_train_digits [options]\n"
            "       mallrun --malleable=1:4 -- mall_train_digits [options]\n"
            "\n"
            "Under mallrun (MALL_JOB_ID or MALL_SOCKET set) it attaches through libmall and its Eigen\n"
            "ThreadPool follows the allocation: mall_step() every step parks or releases the pool's\n"
            "workers to the allocated thread count and pins them to the allocated cpus before\n"
            "acknowledging; parked workers sleep, the others run Eigen's pool as it is.\n"
            "Otherwise, or when malld does not answer (one warning), it runs on --threads threads.\n"
            "With the defaults the held-out accuracy reaches >= 0.95.\n"
            "\n");
        std::printf("%s", mall::examples::options_text(opts).c_str());
        std::printf(
            "\nOutput: every K steps \"step <n> loss <x> threads <t> cpus <list>\"; with --log-changes\n"
            "\"resize step <n> gen <g> threads <a> -> <b> cpus <list>\" then \"parked step <n> tids <list|->\"\n"
            "(the workers parked now); at the end\n"
            "\"final loss <x> train_accuracy <a> test_accuracy <b>\" and\n"
            "\"done steps <n> seconds <s> images_per_s <r> resizes <k>\".\n"
            "\nExit status: 0 trained, 1 the data could not be read, 2 bad arguments.\n"
            "\nExample:\n  mallrun --malleable=1:2 -- mall_train_digits --log-changes\n");
        return 0;
    }
    const int online = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    if (!vm.count("max-threads")) max_threads = online;
    if (!common_mlp_options_valid(steps, hidden, print_every, lr, vm.count("threads") > 0, fixed_threads) ||
        batch < 1 || max_threads < 1 || max_threads > 1024 || (pool_kind != "parked" && pool_kind != "eigen") ||
        input_wait_us < 0 || input_wait_us > 1000000) {
        std::fprintf(stderr,
                     "mall_train_digits: need --steps >= 1, --batch >= 1, 1 <= --hidden <= 4096, --print-every >= 0,\n"
                     "--lr > 0, 1 <= --threads, --max-threads <= 1024, --pool parked|eigen, 0 <= --input-wait-us <= 1000000\n");
        return 2;
    }
    setvbuf(stdout, nullptr, _IOLBF, 0);

    std::string error;
    auto loaded = load_digits(data_path, &error);
    if (!loaded) {
        std::fprintf(stderr, "mall_train_digits: %s\n", error.c_str());
        return 1;
    }
    const Dataset &data = *loaded;
    const int train_size = data.size() - kTestSamples;
    if (batch > train_size) {
        std::fprintf(stderr, "mall_train_digits: --batch %d is larger than the %d training images\n", batch, train_size);
        return 2;
    }
    // A seeded split: the last kTestSamples of a shuffled order are held out.
    std::vector<int> order(data.size());
    for (int i = 0; i < data.size(); ++i) order[i] = i;
    Rng split_rng(seed);
    for (size_t j = order.size() - 1; j > 0; --j) std::swap(order[j], order[split_rng.below(j + 1)]);
    std::vector<int> train(order.begin(), order.begin() + train_size), test(order.begin() + train_size, order.end());

    const int start_threads = vm.count("threads") ? fixed_threads : mall::examples::affinity_count();

    // Eigen's own pool under the device: --max-threads workers parked to follow malld, or a fixed
    // --threads. The parking is declared after the pool: it releases its workers before the pool
    // is destroyed.
    const bool parked = pool_kind == "parked";
    Eigen::ThreadPool pool(parked ? max_threads : start_threads);
    std::optional<mall::tf::PoolParking> parking;
    if (parked) {
        parking.emplace(pool);
        parking->resize(std::min(start_threads, max_threads));
    }
    auto running_threads = [&] { return parking ? parking->active_threads() : pool.NumThreads(); };

    // Attach to malld when launched under it; on failure, one warning and a fixed-size run.
    mall_t *m = nullptr;
    if (parking) {
        m = mall::examples::attach_if_launched("mall_train_digits", *parking);
    } else if (mall::examples::launched_under_malld()) {
        std::fprintf(stderr, "mall_train_digits: --pool eigen cannot be resized; not attaching to malld\n");
    }

    Model model = make_model(hidden, seed);
    Pass pass(batch, hidden);
    std::vector<int> batch_indices(batch);
    Rng batch_rng(seed * 0xD1342543DE82EF95ull + 7);
    size_t cursor = train.size();  // forces a shuffle at the first step
    mall::examples::StepBoundary boundary(m, parking ? &*parking : nullptr, log_changes && !quiet);
    double loss = 0, first_loss = -1;
    const auto started = std::chrono::steady_clock::now();

    for (int step = 1; step <= steps; ++step) {
        // The step boundary: when malld changed the allocation, the glue has resized and re-pinned
        // the pool when this returns MALL_SUCCESS; otherwise it cost two atomic loads.
        boundary.cross(step);
        // Like DirectSession at each Run: the device takes the running worker count.
        const Eigen::ThreadPoolDevice device(&pool, running_threads());

        for (int i = 0; i < batch; ++i) {
            if (cursor == train.size()) {
                for (size_t j = train.size() - 1; j > 0; --j) std::swap(train[j], train[batch_rng.below(j + 1)]);
                cursor = 0;
            }
            batch_indices[i] = train[cursor++];
        }
        if (input_wait_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(input_wait_us));
        load_rows(data, batch_indices.data(), batch, pass.x);
        forward(device, model, pass);
        int correct = 0;
        loss = mean_softmax_loss(pass, data, batch_indices.data(), &correct);
        if (first_loss < 0) first_loss = loss;
        backward_and_update(device, model, pass, static_cast<float>(lr), static_cast<float>(momentum));
        if (m != nullptr) (void)mall_report_progress(m, static_cast<uint64_t>(batch));

        if (!quiet && print_every > 0 && (step % print_every == 0 || step == 1))
            std::printf("step %d loss %.6f threads %d cpus %s\n", step, loss, running_threads(),
                        affinity_list().c_str());
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

    const Eigen::ThreadPoolDevice device(&pool, running_threads());
    const double train_accuracy = accuracy(device, model, data, train, hidden);
    const double test_accuracy = accuracy(device, model, data, test, hidden);
    std::printf("final loss %.6f train_accuracy %.4f test_accuracy %.4f first_loss %.6f\n", loss, train_accuracy,
                test_accuracy, first_loss);
    std::printf("done steps %d seconds %.3f images_per_s %.1f resizes %d\n", steps, seconds,
                static_cast<double>(steps) * batch / seconds, boundary.resizes());
    if (m != nullptr) mall_close(m);
    return 0;
}
