// SPDX-License-Identifier: BSD-3-Clause
// train_tf.cpp — mall_train_tf: a real TensorFlow training driven from C++ that follows its mall
// allocation. The graph (a 64-H-10 MLP on the 8x8 handwritten digits that python3-sklearn ships,
// softmax cross-entropy, gradient descent) is built with TensorFlow's own C++ ops and gradients
// (tensorflow/cc: Scope, ops::*, AddSymbolicGradients) and run by a DirectSession. Every step runs
// the train op with a plain Session::Run on TensorFlow's OWN intra-op and inter-op pools, made with
// --max-threads workers each; mall::tf::SessionPoolParking (mall/tf/tensorflow_session.hpp) parks
// the workers beyond --threads, and under malld mall_step() at the step boundary parks or releases
// them (and pins them) to follow the allocation, before the ack: the change a TensorFlow C++
// program needs is those few lines. Without malld (MALL_SOCKET/MALL_JOB_ID unset, or it does not
// answer: one warning) the pools keep --threads running workers.
// Output: every K steps "step <n> loss <x> threads <t> cpus <list>"; with --log-changes
// "resize step <n> gen <g> threads <a> -> <b> cpus <list>" then "parked step <n> tids <list|->";
// at the end "final loss <x>
// train_accuracy <a> test_accuracy <b> first_loss <y>" and "done steps <n> seconds <s>
// images_per_s <r> resizes <k>". Exit 0 trained, 1 data or TensorFlow failure, 2 usage.
#include <dirent.h>
#include <malloc.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "digits_data.hpp"
#include "example_support.hpp"
#include "mall/mall.h"
#include "mall/tf/tensorflow_session.hpp"
#include "tensorflow/cc/framework/gradients.h"
#include "tensorflow/cc/framework/scope.h"
#include "tensorflow/cc/ops/standard_ops.h"
#include "tensorflow/core/framework/graph.pb.h"
#include "tensorflow/core/public/session.h"

namespace {

using mall::examples::Dataset;
using mall::examples::kClasses;
using mall::examples::kFeatures;
using mall::examples::kTestSamples;

struct Options {
    int steps = 400;
    int batch = 128;
    int hidden = 128;
    float lr = 0.5f;
    unsigned seed = 1;
    int print_every = 50;
    int threads = 0;      // running workers of each pool at the start (0: the cpus this process may use)
    int max_threads = 0;  // workers TensorFlow's pools are made with (0: the online cpus)
    bool log_changes = false;
    // --pool: mall (TensorFlow's pools of --max-threads, parked to follow malld) or tensorflow
    // (TensorFlow's pools of --threads, nothing of mall: the baseline).
    enum class Pool { kMall, kTensorFlow } pool = Pool::kMall;
    bool report_pool = false;
    std::string data = mall::examples::kDefaultDigits;
};

int usage(const char *why) {
    if (why) std::fprintf(stderr, "mall_train_tf: %s\n", why);
    std::fprintf(why ? stderr : stdout,
                 "mall_train_tf - a malleable TensorFlow training (C++ Session API, TensorFlow's own pools)\n"
                 "\n"
                 "Usage: mall_train_tf [--steps N] [--batch B] [--hidden H] [--lr X] [--seed S]\n"
                 "                     [--threads T] [--max-threads M] [--print-every K] [--log-changes]\n"
                 "                     [--data FILE] [--pool mall|tensorflow] [--report-pool]\n"
                 "       mallrun --malleable=1:4 -- mall_train_tf [options]\n"
                 "\n"
                 "Trains a 64-H-10 MLP on the digits python3-sklearn ships with TensorFlow's own ops\n"
                 "and gradients, one plain Session::Run per step on TensorFlow's own intra-op and\n"
                 "inter-op pools. mall parks the pools' workers beyond the running count (they sleep;\n"
                 "the others steal their work). Under mallrun it attaches through libmall and both\n"
                 "pools follow the allocation at each step boundary; otherwise they keep --threads\n"
                 "running workers (default: the usable cpus).\n"
                 "\n"
                 "  --steps N (400)  --batch B (128)  --hidden H (128)  --lr X (0.5)  --seed S (1)\n"
                 "  --print-every K (50, 0: never)  --log-changes (a line per applied allocation)\n"
                 "  --data FILE (%s)\n"
                 "  --max-threads M    workers each of TensorFlow's pools is made with, the most the\n"
                 "                     job can grow to (default: the online cpus)\n"
                 "  --pool mall        TensorFlow's pools of --max-threads, parked to --threads and\n"
                 "                     following malld (default)\n"
                 "         tensorflow  TensorFlow's pools of --threads, nothing of mall, not malleable:\n"
                 "                     the baseline of launch_scripts/bench-tf.sh\n"
                 "  --report-pool      at the end, one line per thread of the process: its role (main,\n"
                 "                     a worker of TensorFlow's intra-op or inter-op pool, or another\n"
                 "                     TensorFlow or runtime thread), whether mall has it parked now,\n"
                 "                     and the cpu time it used (/proc/self/task)\n",
                 mall::examples::kDefaultDigits);
    return why ? 2 : 0;
}

bool parse(int argc, char **argv, Options *o, int *rc) {
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&]() -> const char * { return i + 1 < argc ? argv[++i] : nullptr; };
        auto integer = [&](int *out, int lo, int hi) {
            const char *v = value();
            char *end = nullptr;
            const long n = v ? std::strtol(v, &end, 10) : 0;
            if (!v || *end != '\0' || n < lo || n > hi) return false;
            *out = static_cast<int>(n);
            return true;
        };
        bool ok = true;
        if (a == "-h" || a == "--help") {
            *rc = usage(nullptr);
            return false;
        } else if (a == "--steps") ok = integer(&o->steps, 1, 100000000);
        else if (a == "--batch") ok = integer(&o->batch, 1, 1437);
        else if (a == "--hidden") ok = integer(&o->hidden, 1, 4096);
        else if (a == "--print-every") ok = integer(&o->print_every, 0, 100000000);
        else if (a == "--threads") ok = integer(&o->threads, 1, 1024);
        else if (a == "--max-threads") ok = integer(&o->max_threads, 1, 1024);
        else if (a == "--seed") {
            int s = 0;
            ok = integer(&s, 0, 1 << 30);
            o->seed = static_cast<unsigned>(s);
        } else if (a == "--lr") {
            const char *v = value();
            char *end = nullptr;
            o->lr = v ? std::strtof(v, &end) : 0;
            ok = v && *end == '\0' && o->lr > 0;
        } else if (a == "--data") {
            const char *v = value();
            ok = v != nullptr;
            if (ok) o->data = v;
        } else if (a == "--log-changes") o->log_changes = true;
        else if (a == "--report-pool") o->report_pool = true;
        else if (a == "--pool") {
            const char *given = value();
            const std::string v = given ? given : "";
            ok = v == "mall" || v == "tensorflow";
            if (ok) o->pool = v == "mall" ? Options::Pool::kMall : Options::Pool::kTensorFlow;
        }
        else {
            *rc = usage(("unknown option " + a).c_str());
            return false;
        }
        if (!ok) {
            *rc = usage(("bad or missing value for " + a).c_str());
            return false;
        }
    }
    return true;
}

// --report-pool: every thread of this process with its role, whether mall has it parked now, and
// the cpu time it used (/proc/self/task/TID/schedstat, nanoseconds on cpu), to show where
// TensorFlow's work ran and that parked workers ran none of it.
void report_threads(mall::tf::SessionPoolParking *parking) {
    std::map<pid_t, std::string> roles;
    std::vector<pid_t> parked;
    if (parking != nullptr) {
        const struct {
            const char *name;
            mall::tf::PoolParking *pool;
        } pools[] = {{"tf-intra-op", &parking->intra_op_parking()}, {"tf-inter-op", parking->inter_op_parking()}};
        for (const auto &entry : pools) {
            if (entry.pool == nullptr) continue;
            const std::vector<pid_t> tids = entry.pool->worker_tids();
            for (size_t i = 0; i < tids.size(); ++i) roles[tids[i]] = std::string(entry.name) + "[" + std::to_string(i) + "]";
            for (pid_t tid : entry.pool->parked_tids()) parked.push_back(tid);
        }
    }
    roles[getpid()] = "main";
    if (parking != nullptr)
        std::printf("parking intra-op parks %llu loans %llu inter-op parks %llu loans %llu\n",
                    static_cast<unsigned long long>(parking->intra_op_parking().parks()),
                    static_cast<unsigned long long>(parking->intra_op_parking().loans()),
                    static_cast<unsigned long long>(parking->inter_op_parking() ? parking->inter_op_parking()->parks() : 0),
                    static_cast<unsigned long long>(parking->inter_op_parking() ? parking->inter_op_parking()->loans() : 0));
    DIR *dir = opendir("/proc/self/task");
    if (dir == nullptr) return;
    std::vector<pid_t> tids;
    while (const dirent *e = readdir(dir))
        if (e->d_name[0] != '.') tids.push_back(static_cast<pid_t>(std::atoi(e->d_name)));
    closedir(dir);
    std::sort(tids.begin(), tids.end());
    for (pid_t tid : tids) {
        const std::string task = "/proc/self/task/" + std::to_string(tid);
        std::ifstream stat_file(task + "/schedstat"), comm_file(task + "/comm");
        unsigned long long on_cpu_ns = 0;
        std::string comm;
        stat_file >> on_cpu_ns;
        std::getline(comm_file, comm);
        const auto role = roles.find(tid);
        const bool is_parked = std::find(parked.begin(), parked.end(), tid) != parked.end();
        std::printf("pool-thread tid %d comm %s role %s parked %s cpu_ms %.1f\n", tid, comm.c_str(),
                    role != roles.end() ? role->second.c_str() : "other", is_parked ? "yes" : "no",
                    static_cast<double>(on_cpu_ns) / 1e6);
    }
}

// The Linux thread ids of the workers parked now in both pools, "t1,t2" ("-" for none).
std::string parked_tid_list(mall::tf::SessionPoolParking &parking) {
    std::vector<pid_t> tids = parking.intra_op_parking().parked_tids();
    if (parking.inter_op_parking() != nullptr)
        for (pid_t tid : parking.inter_op_parking()->parked_tids()) tids.push_back(tid);
    return mall::examples::tid_list(tids);
}

std::string affinity_list() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) return "?";
    return mall::examples::cpu_list(set);
}

tensorflow::Tensor initial_weights(int rows, int cols, float scale, std::mt19937 &rng) {
    tensorflow::Tensor t(tensorflow::DT_FLOAT, tensorflow::TensorShape({rows, cols}));
    std::normal_distribution<float> normal(0.0f, scale);
    auto flat = t.flat<float>();
    for (int i = 0; i < flat.size(); ++i) flat(i) = normal(rng);
    return t;
}

tensorflow::Tensor zeros(int n) {
    tensorflow::Tensor t(tensorflow::DT_FLOAT, tensorflow::TensorShape({n}));
    t.flat<float>().setZero();
    return t;
}

// The graph: placeholders x [n,64] and y [n,10]; variables w1 b1 w2 b2 with "init" assigning
// their seeded start values; "logits", "loss" and the target "train" (one gradient-descent step).
bool build_graph(const Options &o, tensorflow::GraphDef *graph, std::string *error) {
    using namespace tensorflow;
    Scope root = Scope::NewRootScope();
    std::mt19937 rng(o.seed);
    auto x = ops::Placeholder(root.WithOpName("x"), DT_FLOAT);
    auto y = ops::Placeholder(root.WithOpName("y"), DT_FLOAT);
    auto w1 = ops::Variable(root.WithOpName("w1"), {kFeatures, o.hidden}, DT_FLOAT);
    auto b1 = ops::Variable(root.WithOpName("b1"), {o.hidden}, DT_FLOAT);
    auto w2 = ops::Variable(root.WithOpName("w2"), {o.hidden, kClasses}, DT_FLOAT);
    auto b2 = ops::Variable(root.WithOpName("b2"), {kClasses}, DT_FLOAT);
    auto i1 = ops::Assign(root, w1, ops::Const(root, initial_weights(kFeatures, o.hidden, 0.18f, rng)));
    auto i2 = ops::Assign(root, b1, ops::Const(root, zeros(o.hidden)));
    auto i3 = ops::Assign(root, w2, ops::Const(root, initial_weights(o.hidden, kClasses, 0.12f, rng)));
    auto i4 = ops::Assign(root, b2, ops::Const(root, zeros(kClasses)));
    ops::NoOp(root.WithOpName("init").WithControlDependencies(
        std::vector<Operation>{i1.operation, i2.operation, i3.operation, i4.operation}));

    auto hidden = ops::Relu(root, ops::BiasAdd(root, ops::MatMul(root, x, w1), b1));
    auto logits = ops::BiasAdd(root.WithOpName("logits"), ops::MatMul(root, hidden, w2), b2);
    auto xent = ops::SoftmaxCrossEntropyWithLogits(root, logits, y);
    auto loss = ops::Mean(root.WithOpName("loss"), xent.loss, ops::Const(root, {0}));

    std::vector<Output> grads;
    absl::Status status = AddSymbolicGradients(root, {loss}, {w1, b1, w2, b2}, &grads);
    if (!status.ok()) {
        *error = "gradients: " + status.ToString();
        return false;
    }
    auto lr = ops::Const(root, o.lr);
    // The updates wait for every gradient and the loss: ref variables give no order of their own,
    // and an update that ran before another gradient's read of the same weights (which TensorFlow's
    // executor is free to do) would train on a mix of old and new weights, and diverge.
    std::vector<Operation> computed{loss.operation};
    for (const Output &g : grads) computed.push_back(g.op());
    const Scope after = root.WithControlDependencies(computed);
    std::vector<Operation> updates;
    const Output vars[] = {w1, b1, w2, b2};
    for (int i = 0; i < 4; ++i) updates.push_back(ops::ApplyGradientDescent(after, vars[i], lr, grads[i]).operation);
    ops::NoOp(root.WithOpName("train").WithControlDependencies(updates));
    status = root.ToGraphDef(graph);
    if (!status.ok()) {
        *error = "graph: " + status.ToString();
        return false;
    }
    return true;
}

void fill_batch(const Dataset &data, const std::vector<int> &rows, tensorflow::Tensor *x, tensorflow::Tensor *y) {
    auto xm = x->matrix<float>();
    auto ym = y->matrix<float>();
    ym.setZero();
    for (size_t r = 0; r < rows.size(); ++r) {
        for (int f = 0; f < kFeatures; ++f) xm(r, f) = data.pixels[static_cast<size_t>(rows[r]) * kFeatures + f];
        ym(r, data.labels[rows[r]]) = 1.0f;
    }
}

double accuracy(tensorflow::Session &session, const Dataset &data, const std::vector<int> &rows) {
    const int n = static_cast<int>(rows.size());
    tensorflow::Tensor x(tensorflow::DT_FLOAT, tensorflow::TensorShape({n, kFeatures}));
    tensorflow::Tensor y(tensorflow::DT_FLOAT, tensorflow::TensorShape({n, kClasses}));
    fill_batch(data, rows, &x, &y);
    std::vector<tensorflow::Tensor> out;
    if (!session.Run({{"x", x}}, {"logits"}, {}, &out).ok()) return 0;
    auto logits = out[0].matrix<float>();
    int correct = 0;
    for (int r = 0; r < n; ++r) {
        int best = 0;
        for (int c = 1; c < kClasses; ++c)
            if (logits(r, c) > logits(r, best)) best = c;
        correct += best == data.labels[rows[r]];
    }
    return static_cast<double>(correct) / n;
}

}  // namespace

int main(int argc, char **argv) {
    Options o;
    int rc = 0;
    if (!parse(argc, argv, &o, &rc)) return rc;
    setvbuf(stdout, nullptr, _IOLBF, 0);
    // TensorFlow allocates and frees the step's large tensors (2 MB at batch 512, 1024 hidden) at
    // every step. With glibc's dynamic thresholds, whether they go back to the kernel (munmap, or
    // a trim of a thread's arena) depends on which thread frees them, and in some runs every step
    // faults them in again: ~1500 page faults a step, +60% step time (measured with one thread per
    // job, two jobs on two cpus, any pool). Fixed thresholds keep freed memory for reuse, for every
    // --pool alike (GLIBC_TUNABLES=glibc.malloc.mmap_threshold=...:glibc.malloc.trim_threshold=...
    // does the same for any program; tcmalloc and jemalloc avoid it too).
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);

    std::string error;
    auto loaded = mall::examples::load_digits(o.data, &error);
    if (!loaded) {
        std::fprintf(stderr, "mall_train_tf: %s\n", error.c_str());
        return 1;
    }
    const Dataset &data = *loaded;
    std::vector<int> order(data.size());
    for (int i = 0; i < data.size(); ++i) order[i] = i;
    std::mt19937 split_rng(o.seed);
    std::shuffle(order.begin(), order.end(), split_rng);
    const int train_size = data.size() - kTestSamples;
    if (o.batch > train_size) return usage("--batch is larger than the training set");
    std::vector<int> train(order.begin(), order.begin() + train_size), test(order.begin() + train_size, order.end());

    tensorflow::GraphDef graph;
    if (!build_graph(o, &graph, &error)) {
        std::fprintf(stderr, "mall_train_tf: building the TensorFlow graph failed: %s\n", error.c_str());
        return 1;
    }
    cpu_set_t usable;
    CPU_ZERO(&usable);
    const int online = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    const int start = o.threads > 0 ? o.threads
                                     : (sched_getaffinity(0, sizeof usable, &usable) == 0 ? CPU_COUNT(&usable) : online);
    // TensorFlow's own intra-op and inter-op pools, as a plain TensorFlow program has them: made
    // with --max-threads workers each when mall parks them to follow the allocation, with --threads
    // for the baseline (--pool tensorflow).
    const bool parked = o.pool == Options::Pool::kMall;
    const int pool_size = parked ? std::max(start, o.max_threads > 0 ? o.max_threads : online) : start;
    tensorflow::SessionOptions session_options;
    session_options.config.set_intra_op_parallelism_threads(pool_size);
    session_options.config.set_inter_op_parallelism_threads(pool_size);
    std::unique_ptr<tensorflow::Session> session(tensorflow::NewSession(session_options));
    if (!session) {
        std::fprintf(stderr, "mall_train_tf: TensorFlow created no session (libtensorflow_cc not loaded?)\n");
        return 1;
    }
    absl::Status status = session->Create(graph);
    if (status.ok()) status = session->Run({}, {}, {"init"}, nullptr);
    if (!status.ok()) {
        std::fprintf(stderr, "mall_train_tf: TensorFlow: %s\n", status.ToString().c_str());
        return 1;
    }

    // The few lines a TensorFlow C++ program adds: find the session's pools, park them to the
    // running count, and (under malld) let every mall_step() park or release them.
    std::unique_ptr<mall::tf::SessionPoolParking> parking;
    if (parked) {
        status = mall::tf::SessionPoolParking::find(*session, pool_size, &parking);
        if (!status.ok()) {
            std::fprintf(stderr, "mall_train_tf: cannot reach TensorFlow's pools: %s\n", status.ToString().c_str());
            return 1;
        }
        parking->intra_op().resize(start);
        if (parking->inter_op() != nullptr) parking->inter_op()->resize(start);
    }
    auto running_threads = [&] { return parking ? parking->intra_op().active_threads() : start; };

    mall_t *m = nullptr;
    if (!parked && mall::examples::launched_under_malld()) {
        std::fprintf(stderr, "mall_train_tf: --pool tensorflow is not malleable; not attaching to malld\n");
    } else if (mall::examples::launched_under_malld()) {
        mall_error_t err;
        if (mall_open(nullptr, &m, &err) != MALL_SUCCESS) {
            std::fprintf(stderr, "mall_train_tf: warning: not malleable (%s); training on %d threads\n", err.text, start);
            m = nullptr;
        } else if (parking->attach(m) != MALL_SUCCESS || mall_bind_thread(m) != MALL_SUCCESS) {
            std::fprintf(stderr, "mall_train_tf: warning: cannot attach the pools to malld; not malleable\n");
            mall_close(m);
            m = nullptr;
        }
    }

    tensorflow::Tensor x(tensorflow::DT_FLOAT, tensorflow::TensorShape({o.batch, kFeatures}));
    tensorflow::Tensor y(tensorflow::DT_FLOAT, tensorflow::TensorShape({o.batch, kClasses}));
    std::vector<int> rows(o.batch);
    std::mt19937 batch_rng(o.seed * 7919u + 7u);
    size_t cursor = train.size();
    double loss = 0, first_loss = -1;
    int resizes = 0, threads_before = running_threads();
    uint64_t last_generation = 0;
    std::vector<tensorflow::Tensor> out;
    const auto started = std::chrono::steady_clock::now();
    for (int step = 1; step <= o.steps; ++step) {
        // The step boundary: two atomic loads when nothing changed; a new allocation parks or
        // releases and re-pins both pools' workers here, before the ack, and the Run below runs on
        // the rest.
        if (m != nullptr && mall_step(m) == MALL_SUCCESS) {
            mall_alloc_t allocation{};
            if (mall_get_allocation(m, &allocation) != MALL_SUCCESS) {
                allocation.generation = last_generation + 1;
                std::snprintf(allocation.cpus, sizeof allocation.cpus, "?");
            }
            if (last_generation != 0) ++resizes;
            last_generation = allocation.generation;
            if (o.log_changes)
                std::printf("resize step %d gen %llu threads %d -> %d cpus %s\n", step,
                            static_cast<unsigned long long>(last_generation), threads_before,
                            running_threads(), allocation.cpus);
            if (o.log_changes)
                std::printf("parked step %d tids %s\n", step, parked_tid_list(*parking).c_str());
            threads_before = running_threads();
        }
        for (int i = 0; i < o.batch; ++i) {
            if (cursor == train.size()) {
                std::shuffle(train.begin(), train.end(), batch_rng);
                cursor = 0;
            }
            rows[i] = train[cursor++];
        }
        fill_batch(data, rows, &x, &y);
        status = session->Run({{"x", x}, {"y", y}}, {"loss"}, {"train"}, &out);
        if (!status.ok()) {
            std::fprintf(stderr, "mall_train_tf: step %d: %s\n", step, status.ToString().c_str());
            if (m != nullptr) mall_close(m);
            parking.reset();  // releases parked workers before the session goes
            return 1;
        }
        loss = out[0].scalar<float>()();
        if (first_loss < 0) first_loss = loss;
        if (m != nullptr) (void)mall_report_progress(m, static_cast<uint64_t>(o.batch));
        if (o.print_every > 0 && (step % o.print_every == 0 || step == 1))
            std::printf("step %d loss %.6f threads %d cpus %s\n", step, loss, running_threads(),
                        affinity_list().c_str());
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    const double train_accuracy = accuracy(*session, data, train);
    const double test_accuracy = accuracy(*session, data, test);
    std::printf("final loss %.6f train_accuracy %.4f test_accuracy %.4f first_loss %.6f\n", loss, train_accuracy,
                test_accuracy, first_loss);
    std::printf("done steps %d seconds %.3f images_per_s %.1f resizes %d\n", o.steps, seconds,
                static_cast<double>(o.steps) * o.batch / seconds, resizes);
    if (o.report_pool) report_threads(parking.get());
    if (m != nullptr) mall_close(m);
    parking.reset();  // releases parked workers before the session goes
    (void)session->Close();
    return 0;
}
