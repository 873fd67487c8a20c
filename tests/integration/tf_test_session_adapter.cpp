// SPDX-License-Identifier: BSD-3-Clause
// tf_test_session_adapter.cpp — parking TensorFlow's OWN pools from C++ (SessionPoolParking)
// against real TensorFlow (the pinned PyPI wheel): a graph built with TensorFlow's own C++ ops runs
// through a plain Session::Run, and what a user would check holds. find() reaches the intra-op pool
// (both workers run kernels) and the inter-op pool; parked to 1, the parked intra-op and inter-op
// workers run nothing while Runs go on (their cpu time does not grow), TensorFlow's per-thread
// split follows the running count, and results do not change; released, the worker runs kernels
// again; the parking is released before the session goes. CPU
// time comes from /proc/self/task/TID/schedstat (nanoseconds on cpu). Built only when CMake finds
// TensorFlow (MALL_WITH_TENSORFLOW).
#include <sys/syscall.h>
#include <unistd.h>

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
#include "tensorflow/core/util/work_sharder.h"

namespace {

// Nanoseconds thread `tid` of this process has run on a cpu.
uint64_t thread_cpu_ns(pid_t tid) {
    std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/schedstat");
    uint64_t ns = 0;
    in >> ns;
    return ns;
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
    options.config.set_inter_op_parallelism_threads(2);
    std::unique_ptr<tensorflow::Session> session(tensorflow::NewSession(options));
    if (!session) return nullptr;
    TF_CHECK_OK(session->Create(model.graph));
    return session;
}

float run_once(tensorflow::Session &session, const Model &model) {
    std::vector<tensorflow::Tensor> out;
    absl::Status status = session.Run({{"x", model.input}}, {"y"}, {}, &out);
    EXPECT_TRUE(status.ok()) << status.ToString();
    return out.empty() ? 0.0f : out[0].scalar<float>()();
}

// cpu ns each of tids gained over `runs` Runs.
std::map<pid_t, uint64_t> cpu_over_runs(tensorflow::Session &session, const Model &model, int runs,
                                        const std::vector<pid_t> &tids, float *value) {
    std::map<pid_t, uint64_t> before, gained;
    for (pid_t tid : tids) before[tid] = thread_cpu_ns(tid);
    for (int i = 0; i < runs; ++i) *value = run_once(session, model);
    for (pid_t tid : tids) gained[tid] = thread_cpu_ns(tid) - before[tid];
    return gained;
}

TEST(TensorFlowSession, ParkedWorkersOfTensorFlowsOwnPoolsRunNothingAndResultsDoNotChange) {
    const Model model = build_model();
    auto session = make_session(model);
    ASSERT_TRUE(session) << "NewSession returned null: is libtensorflow_cc linked (--no-as-needed)?";
    const float reference = run_once(*session, model);  // before mall touches anything

    std::unique_ptr<mall::tf::SessionPoolParking> parking;
    const absl::Status found = mall::tf::SessionPoolParking::find(*session, /*inter_op_threads=*/2, &parking);
    ASSERT_TRUE(found.ok()) << found.ToString();
    const std::vector<pid_t> intra = parking->intra_op_parking().worker_tids();
    ASSERT_EQ(intra.size(), 2u) << "the census must find both intra-op workers";
    ASSERT_NE(parking->inter_op(), nullptr);
    const std::vector<pid_t> inter = parking->inter_op_parking()->worker_tids();
    ASSERT_EQ(inter.size(), 2u) << "the census must find both inter-op workers";
    for (pid_t tid : inter) {
        std::ifstream comm("/proc/self/task/" + std::to_string(tid) + "/comm");
        std::string name;
        std::getline(comm, name);
        EXPECT_EQ(name, "tf_Compute") << "the runner reached another pool than TensorFlow's inter-op pool";
    }
    std::vector<pid_t> all = intra;
    all.insert(all.end(), inter.begin(), inter.end());

    // Unparked: both intra-op workers run kernels (TensorFlow's pool, as it is).
    float value = 0;
    auto gained = cpu_over_runs(*session, model, 20, all, &value);
    EXPECT_FLOAT_EQ(value, reference) << "parking changed the result";
    for (pid_t w : intra) EXPECT_GT(gained[w], 1'000'000u) << "intra-op worker " << w << " ran no kernels";

    // Parked to 1: the parked workers (one of each pool) run nothing; the rest do the work.
    ASSERT_EQ(parking->intra_op().resize(1), 1);
    ASSERT_EQ(parking->inter_op()->resize(1), 1);
    const std::vector<pid_t> parked_intra = parking->intra_op_parking().parked_tids();
    const std::vector<pid_t> parked_inter = parking->inter_op_parking()->parked_tids();
    ASSERT_EQ(parked_intra.size(), 1u);
    ASSERT_EQ(parked_inter.size(), 1u);
    gained = cpu_over_runs(*session, model, 20, all, &value);
    EXPECT_FLOAT_EQ(value, reference);
    EXPECT_LT(gained[parked_intra[0]], 500'000u) << "the parked intra-op worker ran kernels";
    EXPECT_LT(gained[parked_inter[0]], 500'000u) << "the parked inter-op worker ran ops";
    // TensorFlow's split follows: at one running worker a kernel is not cut (it runs inline, as in
    // a session made with one intra-op thread), on this stepping thread and on the workers.
    EXPECT_EQ(tensorflow::GetPerThreadMaxParallelism(), 1);
    EXPECT_EQ(parking->intra_op_parking().loans(), 0u) << "the stall guard lent a worker to a pool that was not stuck";

    // Released: the worker runs kernels again.
    ASSERT_EQ(parking->intra_op().resize(2), 2);
    ASSERT_EQ(parking->inter_op()->resize(2), 2);
    EXPECT_EQ(parking->intra_op_parking().parked_now(), 0);
    EXPECT_EQ(tensorflow::GetPerThreadMaxParallelism(), 2);
    gained = cpu_over_runs(*session, model, 20, all, &value);
    EXPECT_GT(gained[parked_intra[0]], 1'000'000u) << "the released worker got no kernels";
    EXPECT_FLOAT_EQ(value, reference);

    // Parked again, then released by the parking's end, before the session closes.
    parking->intra_op().resize(1);
    parking->inter_op()->resize(1);
    parking.reset();
    EXPECT_FLOAT_EQ(run_once(*session, model), reference);
    EXPECT_TRUE(session->Close().ok());
}

// A second find() in the same process (a program with two sessions) reaches the same pools once
// the first is gone, and is refused while it lives.
TEST(TensorFlowSession, FindTwiceReachesTheSamePools) {
    const Model model = build_model();
    auto session = make_session(model);
    ASSERT_TRUE(session);
    std::unique_ptr<mall::tf::SessionPoolParking> first, second;
    ASSERT_TRUE(mall::tf::SessionPoolParking::find(*session, 2, &first).ok());
    const auto intra = first->intra_op_parking().worker_tids();
    // While the first lives, a second is refused: the pools are process-wide.
    const absl::Status refused = mall::tf::SessionPoolParking::find(*session, 2, &second);
    EXPECT_TRUE(absl::IsAlreadyExists(refused)) << refused.ToString();
    EXPECT_EQ(second, nullptr);
    first.reset();
    ASSERT_TRUE(mall::tf::SessionPoolParking::find(*session, 2, &second).ok());
    const auto again = second->intra_op_parking().worker_tids();
    EXPECT_EQ(std::set<pid_t>(intra.begin(), intra.end()), std::set<pid_t>(again.begin(), again.end()));
}

}  // namespace
