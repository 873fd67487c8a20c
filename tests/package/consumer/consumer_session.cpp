// SPDX-License-Identifier: BSD-3-Clause
// A user's C++ program on the installed mall::tf_tensorflow: runs a two-node TensorFlow graph
// (Const 1.5, Square) through a plain Session::Run with TensorFlow's own pools parked by mall
// (SessionPoolParking), unparked and parked to one worker, and checks the result (2.25). Exit 0 when right; it proves the package's include order, ABI flags and link
// line (libtensorflow_cc kept so that NewSession finds DirectSession).
#include <cstdio>
#include <memory>
#include <vector>

#include <mall/tf/tensorflow_session.hpp>

#include "tensorflow/core/framework/graph.pb.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/public/session.h"

int main() {
    tensorflow::GraphDef graph;
    tensorflow::NodeDef *constant = graph.add_node();
    constant->set_name("c");
    constant->set_op("Const");
    (*constant->mutable_attr())["dtype"].set_type(tensorflow::DT_FLOAT);
    tensorflow::Tensor value(1.5f);
    value.AsProtoTensorContent((*constant->mutable_attr())["value"].mutable_tensor());
    tensorflow::NodeDef *square = graph.add_node();
    square->set_name("square");
    square->set_op("Square");
    square->add_input("c");
    (*square->mutable_attr())["T"].set_type(tensorflow::DT_FLOAT);

    tensorflow::SessionOptions options;
    options.config.set_intra_op_parallelism_threads(2);
    options.config.set_inter_op_parallelism_threads(2);
    std::unique_ptr<tensorflow::Session> session(tensorflow::NewSession(options));
    if (!session || !session->Create(graph).ok()) {
        std::fputs("consumer_session: no TensorFlow session\n", stderr);
        return 1;
    }
    std::unique_ptr<mall::tf::SessionPoolParking> parking;
    const absl::Status found = mall::tf::SessionPoolParking::find(*session, 2, &parking);
    if (!found.ok()) {
        std::fprintf(stderr, "consumer_session: TensorFlow's pools not found: %s\n", found.ToString().c_str());
        return 1;
    }
    for (int size : {2, 1}) {
        parking->intra_op().resize(size);
        parking->inter_op()->resize(size);
        std::vector<tensorflow::Tensor> out;
        const absl::Status status = session->Run({}, {"square"}, {}, &out);
        if (!status.ok() || out.size() != 1 || out[0].scalar<float>()() != 2.25f) {
            std::fprintf(stderr, "consumer_session: Run on %d threads: %s\n", size, status.ToString().c_str());
            return 1;
        }
    }
    parking.reset();  // released before the session goes
    std::puts("consumer_session: ok");
    return 0;
}
