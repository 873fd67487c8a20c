// train_tf.cpp — mall_train_tf: a real TensorFlow training driven from C++ that follows its mall
// allocation. The graph (a 64-H-10 MLP on the 8x8 handwritten digits that python3-sklearn ships,
// softmax cross-entropy, gradient descent) is built with TensorFlow's own C++ ops and gradients
// (tensorflow/cc: Scope, ops::*, AddSymbolicGradients) and run by a DirectSession. Every step runs
// the train op with Session::Run(..., pools.options()): the intra-op and inter-op pools are mall's
// resizable ones (mall/tf/tensorflow_session.hpp), so TensorFlow's kernels run on them, and
// mall_step() at the step boundary resizes and re-pins them when malld changed the allocation;
// the next Run uses the new size. Without malld (MALL_SOCKET/MALL_JOB_ID unset, or it does not
// answer: one warning) the pools keep their start size.
// Output: every K steps "step <n> loss <x> threads <t> cpus <list>"; with --log-changes
// "resize step <n> gen <g> threads <a> -> <b> cpus <list>"; at the end "final loss <x>
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
    int threads = 0;  // start size of the pools (0: the cpus this process may use)
    bool log_changes = false;
    // --pool: mall (resizable, malleable), tensorflow (TensorFlow's own pools), eigen (Eigen's
    // fixed pools passed through ThreadPoolOptions like mall's): the last two are baselines.
    enum class Pool { kMall, kTensorFlow, kEigen } pool = Pool::kMall;
    bool report_pool = false;
    std::string data = mall::examples::kDefaultDigits;
};

int usage(const char *why) {
    if (why) std::fprintf(stderr, "mall_train_tf: %s\n", why);
    std::fprintf(why ? stderr : stdout,
                 "mall_train_tf - a malleable TensorFlow training (C++ Session API on mall's pools)\n"
                 "\n"
                 "Usage: mall_train_tf [--steps N] [--batch B] [--hidden H] [--lr X] [--seed S]\n"
                 "                     [--threads T] [--print-every K] [--log-changes] [--data FILE]\n"
                 "                     [--pool mall|tensorflow|eigen] [--report-pool]\n"
                 "       mallrun --malleable=1:4 -- mall_train_tf [options]\n"
                 "\n"
                 "Trains a 64-H-10 MLP on the digits python3-sklearn ships with TensorFlow's own ops\n"
                 "and gradients, one Session::Run per step on mall's resizable intra-op and inter-op\n"
                 "pools (both of --threads, the shape TensorFlow gives its own). Under mallrun it\n"
                 "attaches through libmall and both pools follow the allocation at each step\n"
                 "boundary; otherwise they keep --threads (default: the usable cpus).\n"
                 "\n"
                 "  --steps N (400)  --batch B (128)  --hidden H (128)  --lr X (0.5)  --seed S (1)\n"
                 "  --print-every K (50, 0: never)  --log-changes (a line per applied allocation)\n"
                 "  --data FILE (%s)\n"
                 "  --pool mall        mall's resizable pools, malleable (default)\n"
                 "         tensorflow  TensorFlow's own intra-op and inter-op pools of --threads, as a\n"
                 "                     plain TensorFlow program has them; not malleable\n"
                 "         eigen       Eigen's fixed ThreadPool (TensorFlow's bundled Eigen) of --threads,\n"
                 "                     handed to Session::Run the way mall's pools are; not malleable.\n"
                 "                     The two baselines of launch_scripts/bench-tf.sh: tensorflow/eigen\n"
                 "                     is the cost of TensorFlow's caller-owned pool path, eigen/mall\n"
                 "                     that of mall's pool itself.\n"
                 "  --report-pool      at the end, one line per thread of the process: its role (main,\n"
                 "                     mall intra-op/inter-op worker, or TensorFlow's own), the tasks a\n"
                 "                     mall worker ran, and the cpu time it used (/proc/self/task)\n",
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
            ok = v == "mall" || v == "tensorflow" || v == "eigen";
            if (ok) o->pool = v == "mall" ? Options::Pool::kMall
                            : v == "tensorflow" ? Options::Pool::kTensorFlow : Options::Pool::kEigen;
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

// --pool eigen: Eigen's own fixed ThreadPool (the one TensorFlow bundles) behind the interface
// Session::Run takes, so it goes through exactly the path mall's pools go through.
class EigenSessionPool : public tensorflow::thread::ThreadPoolInterface {
 public:
    explicit EigenSessionPool(int threads) : pool_(threads) {}
    void Schedule(std::function<void()> fn) override { pool_.Schedule(std::move(fn)); }
    void ScheduleWithHint(std::function<void()> fn, int start, int end) override {
        pool_.ScheduleWithHint(std::move(fn), start, end);
    }
    void Cancel() override {}  // Eigen's Cancel() would stop the pool for good
    int NumThreads() const override { return pool_.NumThreads(); }
    int CurrentThreadId() const override { return pool_.CurrentThreadId(); }

 private:
    Eigen::ThreadPool pool_;
};

// --report-pool: every thread of this process with its role, the tasks a mall worker ran and the
// cpu time it used (/proc/self/task/TID/schedstat, nanoseconds on cpu), to show where
// TensorFlow's work ran.
void report_threads(mall::tf::MalleableSessionPools &pools, int steps) {
    struct Role {
        std::string name;
        uint64_t tasks;
    };
    std::map<pid_t, Role> roles;
    const struct {
        const char *name;
        mall::tf::TensorFlowResizableThreadPool *pool;
    } mall_pools[] = {{"mall-intra-op", &pools.intra_op()}, {"mall-inter-op", pools.inter_op()}};
    for (const auto &entry : mall_pools) {
        if (entry.pool == nullptr) continue;
        const std::vector<pid_t> tids = entry.pool->worker_tids();
        const std::vector<uint64_t> tasks = entry.pool->tasks_run_by_worker();
        for (size_t i = 0; i < tids.size(); ++i)
            roles[tids[i]] = {std::string(entry.name) + "[" + std::to_string(i) + "]", tasks[i]};
    }
    roles[getpid()] = {"main", 0};
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
        const bool ours = role != roles.end() && role->second.name != "main";
        char tasks[64] = "tasks - tasks_per_step -";
        if (ours)
            std::snprintf(tasks, sizeof tasks, "tasks %llu tasks_per_step %.1f",
                          static_cast<unsigned long long>(role->second.tasks),
                          static_cast<double>(role->second.tasks) / std::max(1, steps));
        std::printf("pool-thread tid %d comm %s role %s %s cpu_ms %.1f\n", tid, comm.c_str(),
                    role != roles.end() ? role->second.name.c_str() : "tensorflow-or-runtime", tasks,
                    static_cast<double>(on_cpu_ns) / 1e6);
    }
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

double accuracy(tensorflow::Session &session, const Dataset &data, const std::vector<int> &rows,
                const tensorflow::thread::ThreadPoolOptions &pools) {
    const int n = static_cast<int>(rows.size());
    tensorflow::Tensor x(tensorflow::DT_FLOAT, tensorflow::TensorShape({n, kFeatures}));
    tensorflow::Tensor y(tensorflow::DT_FLOAT, tensorflow::TensorShape({n, kClasses}));
    fill_batch(data, rows, &x, &y);
    std::vector<tensorflow::Tensor> out;
    tensorflow::RunMetadata metadata;
    if (!session.Run(tensorflow::RunOptions(), {{"x", x}}, {"logits"}, {}, &out, &metadata, pools).ok()) return 0;
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
    // TensorFlow's own pools stay as small as it allows: every Run passes mall's pools instead
    // (with --pool tensorflow they are the ones used, --threads intra-op threads).
    cpu_set_t usable;
    CPU_ZERO(&usable);
    const int online = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    const int start = o.threads > 0 ? o.threads
                                     : (sched_getaffinity(0, sizeof usable, &usable) == 0 ? CPU_COUNT(&usable) : online);
    // TensorFlow's own pools stay as small as it allows (one thread each, idle) unless they are the
    // ones measured (--pool tensorflow): intra-op and inter-op of --threads, as TensorFlow sizes
    // them by default (both the usable cpus).
    const bool own_pools = o.pool == Options::Pool::kTensorFlow;
    tensorflow::SessionOptions session_options;
    session_options.config.set_intra_op_parallelism_threads(own_pools ? start : 1);
    session_options.config.set_inter_op_parallelism_threads(own_pools ? start : 1);
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

    // mall's pools: intra-op and inter-op, each with as many workers as the machine has cpus,
    // started at the usable count (or --threads); attached, both follow the allocation's cpus.
    mall::tf::MalleableSessionPools pools(std::max(online, start), std::max(online, start));
    pools.intra_op().resize(start);
    pools.inter_op()->resize(start);
    tensorflow::thread::ThreadPoolOptions run_pools = pools.options();
    std::unique_ptr<EigenSessionPool> eigen_intra_op, eigen_inter_op;
    if (own_pools) {
        run_pools = {};  // Run without pool options: TensorFlow's own
    } else if (o.pool == Options::Pool::kEigen) {
        eigen_intra_op = std::make_unique<EigenSessionPool>(start);
        eigen_inter_op = std::make_unique<EigenSessionPool>(start);
        run_pools.intra_op_threadpool = eigen_intra_op.get();
        run_pools.inter_op_threadpool = eigen_inter_op.get();
    }

    mall_t *m = nullptr;
    if (o.pool != Options::Pool::kMall && (std::getenv("MALL_JOB_ID") || std::getenv("MALL_SOCKET"))) {
        std::fprintf(stderr, "mall_train_tf: --pool %s cannot be resized; not attaching to malld\n",
                     own_pools ? "tensorflow" : "eigen");
    } else if (std::getenv("MALL_JOB_ID") || std::getenv("MALL_SOCKET")) {
        mall_error_t err;
        if (mall_open(nullptr, &m, &err) != MALL_SUCCESS) {
            std::fprintf(stderr, "mall_train_tf: warning: not malleable (%s); training on %d threads\n", err.text, start);
            m = nullptr;
        } else if (pools.attach(m) != MALL_SUCCESS) {
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
    int resizes = 0, threads_before = pools.intra_op().NumThreads();
    uint64_t last_generation = 0;
    std::vector<tensorflow::Tensor> out;
    tensorflow::RunMetadata metadata;
    const auto started = std::chrono::steady_clock::now();
    for (int step = 1; step <= o.steps; ++step) {
        // The step boundary: one load when nothing changed; a new allocation resizes and re-pins
        // both pools here, and the Run below uses their new size.
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
                            pools.intra_op().NumThreads(), allocation.cpus);
            threads_before = pools.intra_op().NumThreads();
        }
        for (int i = 0; i < o.batch; ++i) {
            if (cursor == train.size()) {
                std::shuffle(train.begin(), train.end(), batch_rng);
                cursor = 0;
            }
            rows[i] = train[cursor++];
        }
        fill_batch(data, rows, &x, &y);
        status = session->Run(tensorflow::RunOptions(), {{"x", x}, {"y", y}}, {"loss"}, {"train"}, &out,
                              &metadata, run_pools);
        if (!status.ok()) {
            std::fprintf(stderr, "mall_train_tf: step %d: %s\n", step, status.ToString().c_str());
            if (m != nullptr) mall_close(m);
            return 1;
        }
        loss = out[0].scalar<float>()();
        if (first_loss < 0) first_loss = loss;
        if (m != nullptr) (void)mall_report_progress(m, static_cast<uint64_t>(o.batch));
        if (o.print_every > 0 && (step % o.print_every == 0 || step == 1))
            std::printf("step %d loss %.6f threads %d cpus %s\n", step, loss, o.pool != Options::Pool::kMall ? start : pools.intra_op().NumThreads(),
                        affinity_list().c_str());
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    const double train_accuracy = accuracy(*session, data, train, run_pools);
    const double test_accuracy = accuracy(*session, data, test, run_pools);
    std::printf("final loss %.6f train_accuracy %.4f test_accuracy %.4f first_loss %.6f\n", loss, train_accuracy,
                test_accuracy, first_loss);
    std::printf("done steps %d seconds %.3f images_per_s %.1f resizes %d\n", o.steps, seconds,
                static_cast<double>(o.steps) * o.batch / seconds, resizes);
    if (o.report_pool) report_threads(pools, o.steps);
    if (m != nullptr) mall_close(m);
    (void)session->Close();
    return 0;
}
