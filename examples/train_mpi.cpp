// SPDX-License-Identifier: BSD-3-Clause
// train_mpi.cpp — mall_train_mpi, a data-parallel training job over MPI that follows mall: every
// rank trains the same 64-H-10 MLP (Eigen::Tensor on Eigen's own ThreadPool, parked by mall) on its slice of
// each global mini-batch of the digits python3-sklearn ships, the gradients are summed with one
// MPI_Allreduce per step, and every rank applies the same update, so the weights (and the loss
// printed) are identical on every rank. mall_mpi_step() runs at every step boundary: the pool's workers
// are parked or released and pinned in its callback, on all ranks at the same step (balanced mode: every rank runs
// the count the most constrained rank can run).
//
// Contract: exit 0 after --steps steps (or earlier, at one step on every rank, once rank 0 sees
// --stop-file or --max-seconds have passed); identical "checksum" on every rank. Without malld (no
// MALL_SOCKET/MALL_JOB_ID, or malld down) a rank warns once and runs --threads threads. Output
// lines are described in --help.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#define EIGEN_USE_THREADS
#include <mpi.h>

#include <boost/program_options.hpp>
#include <unsupported/Eigen/CXX11/Tensor>

#include "mall/mall.h"
#include "mall/mall_mpi.h"
#include "mall/adapter/allocation_cpus.hpp"
#include "mall/tf/mall_pool_glue.hpp"
#include "mall/tf/pool_parking.hpp"

#include "digits_data.hpp"
#include "digits_mlp.hpp"
#include "example_options.hpp"
#include "example_support.hpp"

namespace po = boost::program_options;

namespace {

using namespace mall::examples;

using Matrix = Eigen::Tensor<float, 2, Eigen::RowMajor>;
using MatrixMap = Eigen::TensorMap<Matrix>;
using VectorMap = Eigen::TensorMap<Eigen::Tensor<float, 1, Eigen::RowMajor>>;
using Dims = Eigen::array<Eigen::IndexPair<int>, 1>;
const Dims kMatMul = {Eigen::IndexPair<int>(1, 0)};    // A B
const Dims kATimesB = {Eigen::IndexPair<int>(0, 0)};   // A^T B
const Dims kATimesBT = {Eigen::IndexPair<int>(1, 1)};  // A B^T
using Clock = std::chrono::steady_clock;

// Parameters, momentum and gradients live in flat buffers (w1 | b1 | w2 | b2), so one
// MPI_Allreduce sums every gradient; three extra floats carry the loss sum, the correct count and
// the stop flag of the step.
struct Layout {
    int hidden;
    size_t w1() const { return 0; }
    size_t b1() const { return w1() + size_t{kFeatures} * hidden; }
    size_t w2() const { return b1() + hidden; }
    size_t b2() const { return w2() + size_t(hidden) * kClasses; }
    size_t params() const { return b2() + kClasses; }
    size_t loss() const { return params(); }
    size_t correct() const { return params() + 1; }
    size_t stop() const { return params() + 2; }
    size_t buffer() const { return params() + 3; }
};

struct Net {
    Layout at;
    std::vector<float> param, velocity, grad;
    MatrixMap w1() { return MatrixMap(&param[at.w1()], kFeatures, at.hidden); }
    VectorMap b1() { return VectorMap(&param[at.b1()], at.hidden); }
    MatrixMap w2() { return MatrixMap(&param[at.w2()], at.hidden, kClasses); }
    VectorMap b2() { return VectorMap(&param[at.b2()], kClasses); }
    MatrixMap dw1() { return MatrixMap(&grad[at.w1()], kFeatures, at.hidden); }
    VectorMap db1() { return VectorMap(&grad[at.b1()], at.hidden); }
    MatrixMap dw2() { return MatrixMap(&grad[at.w2()], at.hidden, kClasses); }
    VectorMap db2() { return VectorMap(&grad[at.b2()], kClasses); }
};

Net make_net(int hidden, uint64_t seed) {
    Net n{Layout{hidden}, {}, {}, {}};
    n.param.assign(n.at.params(), 0.0f);
    n.velocity.assign(n.at.params(), 0.0f);
    n.grad.assign(n.at.buffer(), 0.0f);
    Rng rng(seed * 0x9E3779B97F4A7C15ull + 1);
    const double s1 = std::sqrt(2.0 / kFeatures), s2 = std::sqrt(2.0 / hidden);
    for (size_t i = n.at.w1(); i < n.at.b1(); ++i) n.param[i] = static_cast<float>(rng.normal() * s1);
    for (size_t i = n.at.w2(); i < n.at.b2(); ++i) n.param[i] = static_cast<float>(rng.normal() * s2);
    return n;
}

struct Pass {  // one forward/backward over `rows` images
    Matrix x, z1, a1, logits, dlogits, da1, dz1;
    Pass(int rows, int hidden)
        : x(rows, kFeatures), z1(rows, hidden), a1(rows, hidden), logits(rows, kClasses),
          dlogits(rows, kClasses), da1(rows, hidden), dz1(rows, hidden) {}
};

void forward(const Eigen::ThreadPoolDevice &d, Net &n, Pass &p) {
    const Eigen::Index rows = p.x.dimension(0);
    const Eigen::array<Eigen::Index, 2> hid{1, n.at.hidden}, cls{1, kClasses}, rep{rows, 1};
    p.z1.device(d) = p.x.contract(n.w1(), kMatMul) + n.b1().reshape(hid).broadcast(rep);
    p.a1.device(d) = p.z1.cwiseMax(0.0f);
    p.logits.device(d) = p.a1.contract(n.w2(), kMatMul) + n.b2().reshape(cls).broadcast(rep);
}

// The summed loss of this rank's rows; dlogits = d(mean loss over the global batch)/d(logits) with
// scale = 1 / global batch.
double batch_softmax_loss(Pass &p, const Dataset &data, const int *idx, float scale, int *correct) {
    return softmax_loss(p.logits, data, idx, correct,
                        [&](int r, int c, double d) { p.dlogits(r, c) = static_cast<float>(d * scale); });
}

void backward(const Eigen::ThreadPoolDevice &d, Net &n, Pass &p) {
    const Eigen::array<Eigen::Index, 1> over_rows{0};
    n.dw2().device(d) = p.a1.contract(p.dlogits, kATimesB);
    n.db2().device(d) = p.dlogits.sum(over_rows);
    p.da1.device(d) = p.dlogits.contract(n.w2(), kATimesBT);
    p.dz1.device(d) = (p.z1 > p.z1.constant(0.0f)).select(p.da1, p.da1.constant(0.0f));
    n.dw1().device(d) = p.x.contract(p.dz1, kATimesB);
    n.db1().device(d) = p.dz1.sum(over_rows);
}

void load_rows(const Dataset &data, const int *idx, int rows, Matrix &x) {
    for (int r = 0; r < rows; ++r)
        std::copy_n(&data.pixels[size_t(idx[r]) * kFeatures], kFeatures, x.data() + size_t(r) * kFeatures);
}

uint64_t checksum(const std::vector<float> &values) {  // FNV-1a over the bytes
    uint64_t h = 1469598103934665603ull;
    const auto *bytes = reinterpret_cast<const unsigned char *>(values.data());
    for (size_t i = 0; i < values.size() * sizeof(float); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
    return h;
}

// What the mall_mpi callback drives: the pool, this thread's pinning, and the log.
struct Follower {
    mall::tf::PoolParking *pool;
    int rank;
    int step = 0;
    bool log_changes = false;
    mall_mpi_t *mm = nullptr;
};

void follow(int threads, const mall_alloc_t *cpus, void *arg) {
    auto *f = static_cast<Follower *>(arg);
    const int before = f->pool->active_threads();
    const cpu_set_t set = mall::adapter::cpu_set_from_allocation(*cpus);
    if (CPU_COUNT(&set) > 0) {
        (void)f->pool->set_affinity(set);
        (void)sched_setaffinity(0, sizeof set, &set);  // the stepping thread works too
    }
    f->pool->resize(threads);
    if (f->log_changes) {
        mall_mpi_state_t s{};
        mall_mpi_get_state(f->mm, &s);
        std::printf("rank %d change step %d threads %d -> %d share %d cap %d sharers %d cpus %s\n", f->rank, f->step,
                    before, f->pool->active_threads(), s.share, s.usage_cap, s.sharers, cpus->cpus[0] ? cpus->cpus : "-");
    }
}

double mean_us(double seconds, long count) { return count > 0 ? seconds * 1e6 / static_cast<double>(count) : 0; }

double median(std::vector<float> samples) {
    if (samples.empty()) return 0;
    auto middle = samples.begin() + static_cast<std::ptrdiff_t>(samples.size() / 2);
    std::nth_element(samples.begin(), middle, samples.end());
    return *middle;
}

}  // namespace

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    setvbuf(stdout, nullptr, _IOLBF, 0);

    int steps = 300, batch = 256, hidden = 256, print_every = 25, threads = 0, bench = 0;
    uint64_t seed = 1;
    double lr = 0.05, max_seconds = 0;
    std::string data_path = kDefaultDigits, stop_file;
    bool unbalanced = false, log_changes = false, sync_timing = false;
    po::options_description opts("Options");
    opts.add_options()("help,h", "show this text")("steps", po::value<int>(&steps)->default_value(steps), "training steps")(
        "batch", po::value<int>(&batch)->default_value(batch), "images per global mini-batch, split over the ranks")(
        "hidden", po::value<int>(&hidden)->default_value(hidden), "hidden units (1..4096)")(
        "lr", po::value<double>(&lr)->default_value(lr, "0.05"), "learning rate (SGD, momentum 0.9)")(
        "seed", po::value<uint64_t>(&seed)->default_value(seed), "seed of the split, batches and weights")(
        "data", po::value<std::string>(&data_path)->default_value(data_path), "sklearn's digits.csv.gz")(
        "threads", po::value<int>(&threads), "threads of a rank that is not malleable (default: its cpus)")(
        "unbalanced", po::bool_switch(&unbalanced), "each rank runs its own allocation (default: balanced)")(
        "print-every", po::value<int>(&print_every)->default_value(print_every), "loss line every K steps (0: never)")(
        "log-changes", po::bool_switch(&log_changes), "a line per rank at each step where mall_mpi applied a change")(
        "stop-file", po::value<std::string>(&stop_file), "stop early, on every rank at one step, once this file exists")(
        "max-seconds", po::value<double>(&max_seconds)->default_value(0), "stop early (all ranks at one step) after this long (0: never)")(
        "sync-timing", po::bool_switch(&sync_timing),
        "an MPI_Barrier (not timed) before the timed mall_mpi_step() and allreduce of each step, so their times exclude the ranks' arrival skew")(
        "bench-collectives", po::value<int>(&bench)->default_value(0),
        "after training, time N back-to-back mall_mpi_step() and N gradient allreduces");
    po::variables_map vm;
    if (!mall::examples::parse_options("mall_train_mpi", argc, argv, opts, vm, rank == 0)) {
        MPI_Finalize();
        return 2;
    }
    if (vm.count("help")) {
        if (rank == 0) {
            std::printf(
                "mall_train_mpi - data-parallel MLP training over MPI that follows mall's allocations\n\n"
                "Usage: mpirun --bind-to none -np N mall_train_mpi [options]\n"
                "       (each rank under mallrun, or srun --mpi=pmix in a --malleable allocation)\n\n%s\n"
                "Output (every rank): \"rank R step S loss X threads T\" every K steps; with --log-changes\n"
                "\"rank R change step S threads A -> B share N cap C sharers K cpus LIST\"; at the end\n"
                "\"rank R final loss X first_loss Y test_accuracy A checksum H\",\n"
                "\"rank R done steps S seconds T steps_per_s X images_per_s Y changes K\" and\n"
                "\"rank R timing nochange_steps N mall_mpi_step_us X allreduce_us Y ratio Z median_step_us A\n"
                "median_allreduce_us B median_ratio C\" (means, then medians, over the steps where nothing changed);\n"
                "with --bench-collectives N, rank 0 also prints \"bench ranks R mall_mpi_step_us X\n"
                "allreduce_us Y ratio Z floats F\" (slowest rank's means).\n"
                "Exit status: 0 trained, 1 the data could not be read, 2 bad arguments.\n",
                options_text(opts).c_str());
        }
        MPI_Finalize();
        return 0;
    }
    if (!common_mlp_options_valid(steps, hidden, print_every, lr, vm.count("threads") > 0, threads) ||
        batch < size || bench < 0 || !(max_seconds >= 0)) {
        if (rank == 0)
            std::fprintf(stderr, "mall_train_mpi: need --steps >= 1, --batch >= ranks, 1 <= --hidden <= 4096, "
                                 "--print-every >= 0, --lr > 0, 1 <= --threads <= 1024, --bench-collectives >= 0, --max-seconds >= 0\n");
        MPI_Finalize();
        return 2;
    }
    std::string error;
    auto loaded = load_digits(data_path, &error);
    if (!loaded || batch > loaded->size() - kTestSamples) {
        std::fprintf(stderr, "mall_train_mpi: rank %d: %s\n", rank, loaded ? "--batch is larger than the training set" : error.c_str());
        MPI_Abort(MPI_COMM_WORLD, 1);
        return 1;
    }
    const Dataset &data = *loaded;
    std::vector<int> order(data.size());
    for (int i = 0; i < data.size(); ++i) order[i] = i;
    Rng split_rng(seed);
    for (size_t j = order.size() - 1; j > 0; --j) std::swap(order[j], order[split_rng.below(j + 1)]);
    std::vector<int> train(order.begin(), order.end() - kTestSamples), test(order.end() - kTestSamples, order.end());

    // mall: this rank's handle (when launched under malld), then the collective step over all ranks.
    mall_t *m = nullptr;
    if (launched_under_malld()) {
        mall_error_t err{};
        if (mall_open(nullptr, &m, &err) != MALL_SUCCESS) {
            std::fprintf(stderr, "mall_train_mpi: rank %d not malleable (%s)\n", rank, err.text);
            mall_close(m);
            m = nullptr;
        }
    }
    mall_mpi_t *mm = nullptr;
    mall_error_t err{};
    if (mall_mpi_open(m, MPI_COMM_WORLD, unbalanced ? MALL_MPI_UNBALANCED : MALL_MPI_BALANCED,
                      vm.count("threads") ? threads : 0, &mm, &err) != MALL_SUCCESS) {
        std::fprintf(stderr, "mall_train_mpi: rank %d: %s\n", rank, err.text);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    const int online = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    // Eigen's own pool of every cpu's worth, parked to the rank's thread count; the parking
    // (declared after the pool) releases its workers before the pool goes.
    Eigen::ThreadPool pool(std::max(online, mall_mpi_threads(mm)));
    mall::tf::PoolParking parking(pool);
    parking.resize(mall_mpi_threads(mm));
    Follower follower{&parking, rank, 0, log_changes, mm};
    mall_mpi_on_resize(mm, follow, &follower);

    // This rank's rows of every global batch.
    const int first_row = static_cast<int>(int64_t(batch) * rank / size);
    const int rows = static_cast<int>(int64_t(batch) * (rank + 1) / size) - first_row;
    Net net = make_net(hidden, seed);
    const Layout at = net.at;
    Pass pass(rows, hidden);
    std::vector<int> batch_indices(batch);
    Rng batch_rng(seed * 0xD1342543DE82EF95ull + 7);
    size_t cursor = train.size();
    double step_seconds = 0, allreduce_seconds = 0, first_loss = -1, loss = 0;
    long nochange_steps = 0;
    // Per-step samples for the medians (the first 100000 steps; reserved now, never reallocated).
    std::vector<float> step_samples, reduce_samples;
    step_samples.reserve(static_cast<size_t>(std::min(steps, 100000)));
    reduce_samples.reserve(step_samples.capacity());
    int done = 0, changes = 0;
    const float momentum = 0.9f;
    const auto started = Clock::now();

    for (int step = 1; step <= steps; ++step) {
        follower.step = step;
        if (sync_timing) MPI_Barrier(MPI_COMM_WORLD);
        const auto t0 = Clock::now();
        const int rc = mall_mpi_step(mm);  // collective: every rank, every step
        const auto t1 = Clock::now();
        if (rc == MALL_SUCCESS) ++changes;
        const bool timed = rc == MALL_NOUPDT;
        if (timed) {
            step_seconds += std::chrono::duration<double>(t1 - t0).count();
            if (step_samples.size() < step_samples.capacity())
                step_samples.push_back(std::chrono::duration<float, std::micro>(t1 - t0).count());
        }
        const Eigen::ThreadPoolDevice device(&pool, parking.active_threads());

        for (int i = 0; i < batch; ++i) {  // the same global batch on every rank
            if (cursor == train.size()) {
                for (size_t j = train.size() - 1; j > 0; --j) std::swap(train[j], train[batch_rng.below(j + 1)]);
                cursor = 0;
            }
            batch_indices[i] = train[cursor++];
        }
        const int *mine = batch_indices.data() + first_row;
        load_rows(data, mine, rows, pass.x);
        forward(device, net, pass);
        int correct = 0;
        const double loss_sum = batch_softmax_loss(pass, data, mine, 1.0f / static_cast<float>(batch), &correct);
        backward(device, net, pass);
        net.grad[at.loss()] = static_cast<float>(loss_sum);
        net.grad[at.correct()] = static_cast<float>(correct);
        // Rank 0 decides to stop; the flag rides in the gradient sum, so every rank stops after this step.
        net.grad[at.stop()] = rank == 0 && step % 10 == 0 &&
                              ((!stop_file.empty() && access(stop_file.c_str(), F_OK) == 0) ||
                               (max_seconds > 0 && std::chrono::duration<double>(Clock::now() - started).count() > max_seconds));

        if (sync_timing) MPI_Barrier(MPI_COMM_WORLD);
        const auto t2 = Clock::now();
        MPI_Allreduce(MPI_IN_PLACE, net.grad.data(), static_cast<int>(at.buffer()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        if (timed) {
            const auto t3 = Clock::now();
            allreduce_seconds += std::chrono::duration<double>(t3 - t2).count();
            if (reduce_samples.size() < reduce_samples.capacity())
                reduce_samples.push_back(std::chrono::duration<float, std::micro>(t3 - t2).count());
            ++nochange_steps;
        }
        // The same update on every rank: identical weights everywhere (elementwise, so the thread
        // count does not change a bit of it).
        for (size_t i = 0; i < at.params(); ++i) {
            net.velocity[i] = net.velocity[i] * momentum - net.grad[i] * static_cast<float>(lr);
            net.param[i] += net.velocity[i];
        }
        loss = net.grad[at.loss()] / batch;
        if (first_loss < 0) first_loss = loss;
        if (m != nullptr) (void)mall_report_progress(m, static_cast<uint64_t>(rows));
        done = step;
        if (print_every > 0 && (step % print_every == 0 || step == 1))
            std::printf("rank %d step %d loss %.6f threads %d\n", rank, step, loss, parking.active_threads());
        if (net.grad[at.stop()] > 0) break;
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - started).count();

    // Held-out accuracy with the final weights (the same on every rank).
    Pass eval(static_cast<int>(test.size()), hidden);
    load_rows(data, test.data(), static_cast<int>(test.size()), eval.x);
    const Eigen::ThreadPoolDevice device(&pool, parking.active_threads());
    forward(device, net, eval);
    int correct = 0;
    (void)softmax_loss(eval.logits, data, test.data(), &correct, NoGradient{});
    std::printf("rank %d final loss %.6f first_loss %.6f test_accuracy %.4f checksum %016llx\n", rank, loss, first_loss,
                static_cast<double>(correct) / static_cast<double>(test.size()),
                static_cast<unsigned long long>(checksum(net.param)));
    std::printf("rank %d done steps %d seconds %.3f steps_per_s %.2f images_per_s %.1f changes %d\n", rank, done,
                seconds, done / seconds, static_cast<double>(done) * batch / seconds, changes);
    const double step_us = mean_us(step_seconds, nochange_steps), reduce_us = mean_us(allreduce_seconds, nochange_steps);
    const double step_median = median(step_samples), reduce_median = median(reduce_samples);
    std::printf("rank %d timing nochange_steps %ld mall_mpi_step_us %.3f allreduce_us %.3f ratio %.4f "
                "median_step_us %.3f median_allreduce_us %.3f median_ratio %.4f\n",
                rank, nochange_steps, step_us, reduce_us, reduce_us > 0 ? step_us / reduce_us : 0.0, step_median,
                reduce_median, reduce_median > 0 ? step_median / reduce_median : 0.0);

    if (bench > 0) {  // back to back, after a barrier: the collectives alone, without compute skew
        double times[2] = {0, 0}, slowest[2] = {0, 0};
        MPI_Barrier(MPI_COMM_WORLD);
        auto t = Clock::now();
        for (int i = 0; i < bench; ++i) (void)mall_mpi_step(mm);
        times[0] = std::chrono::duration<double>(Clock::now() - t).count();
        MPI_Barrier(MPI_COMM_WORLD);
        t = Clock::now();
        for (int i = 0; i < bench; ++i)
            MPI_Allreduce(MPI_IN_PLACE, net.grad.data(), static_cast<int>(at.buffer()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        times[1] = std::chrono::duration<double>(Clock::now() - t).count();
        MPI_Reduce(times, slowest, 2, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0)
            std::printf("bench ranks %d mall_mpi_step_us %.3f allreduce_us %.3f ratio %.4f floats %zu\n", size,
                        mean_us(slowest[0], bench), mean_us(slowest[1], bench),
                        slowest[1] > 0 ? slowest[0] / slowest[1] : 0.0, at.buffer());
    }
    mall_mpi_close(mm);
    mall_close(m);
    MPI_Finalize();
    return 0;
}
