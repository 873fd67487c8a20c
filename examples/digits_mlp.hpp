// SPDX-License-Identifier: BSD-3-Clause
// digits_mlp.hpp — what the two 64-H-10 digits MLP trainers (train_digits.cpp on one process,
// train_mpi.cpp over MPI ranks) share: the ranges of their common options, and the softmax
// cross-entropy of the logits, which returns the summed loss of the rows and hands each logit's
// gradient to the caller to scale (by 1/rows, or by 1/global batch), so each keeps its own bits.
// Header-only; include it after defining EIGEN_USE_THREADS, as the trainers do.
#pragma once

#include <cmath>
#include <type_traits>

#include <unsupported/Eigen/CXX11/Tensor>

#include "digits_data.hpp"

namespace mall::examples {

// The options both trainers take, in range: --steps >= 1, 1 <= --hidden <= 4096,
// --print-every >= 0, --lr > 0 and, when given, 1 <= --threads <= 1024. Each trainer adds its own
// checks and says the rule in its own words.
inline bool common_mlp_options_valid(int steps, int hidden, int print_every, double lr, bool threads_given,
                                     int threads) {
    return steps >= 1 && hidden >= 1 && hidden <= 4096 && print_every >= 0 && lr > 0 &&
           (!threads_given || (threads >= 1 && threads <= 1024));
}

// Pass as the gradient of softmax_loss() to compute the loss and the count only.
struct NoGradient {
    void operator()(int, int, double) const {}
};

// Softmax cross-entropy of rows x kClasses logits (small next to the contractions: on the calling
// thread). Row r's label is data.labels[indices[r]]. Returns the loss summed over the rows, sets
// *correct to the rows whose largest logit is the label, and calls gradient(r, c, softmax - onehot)
// for every logit: the derivative of row r's loss by logit c, for the caller to scale.
template <class Gradient>
double softmax_loss(const Eigen::Tensor<float, 2, Eigen::RowMajor> &logits, const Dataset &data, const int *indices,
                    int *correct, Gradient gradient) {
    const int rows = static_cast<int>(logits.dimension(0));
    double loss = 0;
    *correct = 0;
    for (int r = 0; r < rows; ++r) {
        const int label = data.labels[indices[r]];
        float top = logits(r, 0);
        int best = 0;
        for (int c = 1; c < kClasses; ++c)
            if (logits(r, c) > top) top = logits(r, c), best = c;
        double sum = 0;
        for (int c = 0; c < kClasses; ++c) sum += std::exp(static_cast<double>(logits(r, c) - top));
        loss += std::log(sum) - (logits(r, label) - top);
        *correct += best == label;
        if constexpr (!std::is_same_v<Gradient, NoGradient>)
            for (int c = 0; c < kClasses; ++c)
                gradient(r, c, std::exp(static_cast<double>(logits(r, c) - top)) / sum - (c == label));
    }
    return loss;
}

}  // namespace mall::examples
