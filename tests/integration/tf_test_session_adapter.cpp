// tf_test_session_adapter.cpp — the TensorFlow Session adapter against real TensorFlow (the pinned
// PyPI wheel): a graph built with TensorFlow's own C++ ops runs through Session::Run with
// MalleableSessionPools' options, and what a user would check holds. TensorFlow's kernels run on
// mall's pool (its workers' CPU time grows; TensorFlow's own intra-op threads stay idle); a resize
// of the pool takes effect at the next Run (at size 1 the second worker gets no work); results equal
// those of a run on TensorFlow's own pools. CPU time comes from /proc/self/task/TID/schedstat
// (nanoseconds on cpu). Built only when CMake finds TensorFlow (MALL_WITH_TENSORFLOW).
#include <sys/syscall.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "mall/tf/tensorflow_session.hpp"
#include "tensorflow/cc/framework/scope.h"
#include "tensorflow/cc/ops/standard_ops.h"
#include "tensorflow/core/framework/graph.pb.h"
#include "tensorflow/core/public/session.h"

namespace {

// Nanoseconds thread `tid` of this process has run on a cpu.
uint64_t thread_cpu_ns(pid_t tid) {
    std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/schedstat");
    uint64_t ns = 0;
    in >> ns;
    return ns;
}

std::map<pid_t, uint64_t> all_threads_cpu_ns() {
    std::map<pid_t, uint64_t> out;
    for (const auto &entry : std::filesystem::directory_iterator("/proc/self/task")) {
        const pid_t tid = static_cast<pid_t>(std::stol(entry.path().filename().string()));
        out[tid] = thread_cpu_ns(tid);
    }
    return out;
}

// y = sum(relu(relu(x W1) W2) W1) on a 256x512 input: three parallel matmuls per Run, constant
// weights (so every Run gives the same value).
struct Model {
    tensorflow::GraphDef graph;
    tensorflow::Tensor input{tensorflow::DT_FLOAT, tensorflow::TensorShape({256, 512})};
};

Model build_model() {
    using namespace tensorflow;
    Scope root = Scope::NewRootScope();
    auto x = ops::Placeholder(root.WithOpName("x"), DT_FLOAT, ops::Placeholder::Shape({256, 512}));
    auto weights = [](int seed) {
        Tensor w(DT_FLOAT, TensorShape({512, 512}));
        auto flat = w.flat<float>();
        for (int i = 0; i < flat.size(); ++i) flat(i) = static_cast<float>((i * seed) % 97) / 970.0f - 0.04f;
        return w;
    };
    auto w1 = ops::Const(root.WithOpName("w1"), weights(31));
    auto w2 = ops::Const(root.WithOpName("w2"), weights(57));
    auto h1 = ops::Relu(root, ops::MatMul(root, x, w1));
    auto h2 = ops::Relu(root, ops::MatMul(root, h1, w2));
    auto y = ops::Sum(root.WithOpName("y"), ops::MatMul(root, h2, w1), ops::Const(root, {0, 1}));
    Model model;
    TF_CHECK_OK(root.ToGraphDef(&model.graph));
    auto flat = model.input.flat<float>();
    for (int i = 0; i < flat.size(); ++i) flat(i) = static_cast<float>((i * 7919) % 1000) / 1000.0f;
    return model;
}

std::unique_ptr<tensorflow::Session> make_session(const Model &model) {
    tensorflow::SessionOptions options;
    options.config.set_intra_op_parallelism_threads(2);
    options.config.set_inter_op_parallelism_threads(1);
    std::unique_ptr<tensorflow::Session> session(tensorflow::NewSession(options));
    if (!session) return nullptr;
    TF_CHECK_OK(session->Create(model.graph));
    return session;
}

float run_once(tensorflow::Session &session, const Model &model,
               const tensorflow::thread::ThreadPoolOptions *pools) {
    std::vector<tensorflow::Tensor> out;
    tensorflow::RunOptions run_options;
    tensorflow::RunMetadata metadata;
    absl::Status status =
        pools ? session.Run(run_options, {{"x", model.input}}, {"y"}, {}, &out, &metadata, *pools)
              : session.Run(run_options, {{"x", model.input}}, {"y"}, {}, &out, &metadata);
    EXPECT_TRUE(status.ok()) << status.ToString();
    return out.empty() ? 0.0f : out[0].scalar<float>()();
}

TEST(TensorFlowSession, KernelsRunOnMallsPoolAndAResizeTakesEffectAtTheNextRun) {
    const Model model = build_model();
    auto session = make_session(model);
    ASSERT_TRUE(session) << "NewSession returned null: is libtensorflow_cc linked (--no-as-needed)?";
    const float reference = run_once(*session, model, nullptr);  // TensorFlow's own pools

    // Both pools of ours: intra-op (2) and inter-op (1), so TensorFlow's own threads get nothing.
    mall::tf::MalleableSessionPools pools(/*intra_op_max=*/2, /*inter_op_max=*/1);
    const auto options = pools.options();
    const std::vector<pid_t> workers = pools.intra_op().worker_tids();
    ASSERT_EQ(workers.size(), 2u);
    ASSERT_NE(pools.inter_op(), nullptr);
    std::set<pid_t> ours(workers.begin(), workers.end());
    for (pid_t tid : pools.inter_op()->worker_tids()) ours.insert(tid);
    const pid_t main_tid = static_cast<pid_t>(::syscall(SYS_gettid));

    // At size 2: both workers run kernels; TensorFlow's other threads stay (nearly) idle.
    auto before = all_threads_cpu_ns();
    float value = 0;
    for (int i = 0; i < 20; ++i) value = run_once(*session, model, &options);
    auto after = all_threads_cpu_ns();
    EXPECT_FLOAT_EQ(value, reference) << "mall's pool changed the result";
    uint64_t ours_ns = 0, theirs_ns = 0;
    for (const auto &[tid, ns] : after) {
        const uint64_t delta = ns - (before.count(tid) ? before[tid] : 0);
        if (ours.count(tid)) ours_ns += delta;
        else if (tid != main_tid) theirs_ns += delta;
    }
    for (pid_t w : workers)
        EXPECT_GT(after[w] - before[w], 1'000'000u) << "worker " << w << " ran no kernels at size 2";
    EXPECT_LT(theirs_ns * 20, ours_ns) << "TensorFlow's own threads did real work: ours " << ours_ns
                                       << " ns, theirs " << theirs_ns << " ns";

    // Resized to 1 between Runs: the next Runs leave the second worker idle.
    ASSERT_EQ(pools.intra_op().resize(1), 1);
    before = all_threads_cpu_ns();
    for (int i = 0; i < 20; ++i) value = run_once(*session, model, &options);
    after = all_threads_cpu_ns();
    EXPECT_FLOAT_EQ(value, reference);
    EXPECT_LT(after[workers[1]] - before[workers[1]], 1'000'000u) << "the parked worker still ran kernels";

    // And back to 2.
    ASSERT_EQ(pools.intra_op().resize(2), 2);
    before = all_threads_cpu_ns();
    for (int i = 0; i < 20; ++i) value = run_once(*session, model, &options);
    after = all_threads_cpu_ns();
    EXPECT_GT(after[workers[1]] - before[workers[1]], 1'000'000u) << "the regrown worker got no kernels";
    EXPECT_FLOAT_EQ(value, reference);
}

}  // namespace
