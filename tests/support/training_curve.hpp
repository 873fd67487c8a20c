// training_curve.hpp — what the example trainers' tests read from their output (header-only): the
// digits data file they train on, and the loss curve printed as "step N loss X threads T cpus L"
// lines plus the "final loss X train_accuracy A test_accuracy B ..." line (mall_train_digits and
// mall_train_tf print the same format).
#pragma once

#include <map>
#include <regex>
#include <string>
#include <vector>

namespace mall::test {

inline constexpr const char *kDigits = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";

struct Curve {
    std::map<int, double> loss_at_step;  // from "step N loss X threads T cpus L"
    double final_loss = -1, test_accuracy = -1;
};

inline Curve parse_curve(const std::vector<std::string> &lines) {
    Curve curve;
    const std::regex step_re(R"(^step ([0-9]+) loss ([0-9.eE+-]+) threads)");
    const std::regex final_re(R"(^final loss ([0-9.eE+-]+) train_accuracy [0-9.]+ test_accuracy ([0-9.]+))");
    std::smatch m;
    for (const auto &line : lines) {
        if (std::regex_search(line, m, step_re))
            curve.loss_at_step[std::stoi(m[1])] = std::stod(m[2]);
        else if (std::regex_search(line, m, final_re)) {
            curve.final_loss = std::stod(m[1]);
            curve.test_accuracy = std::stod(m[2]);
        }
    }
    return curve;
}

}  // namespace mall::test
