// SPDX-License-Identifier: BSD-3-Clause
// digits_data.hpp — the 8x8 handwritten digits that Debian's python3-sklearn ships, for the Eigen
// and MPI examples: sizes, the default path and a loader (pixels scaled to 0..1). Needs zlib.
#pragma once

#include <zlib.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace mall::examples {

constexpr const char *kDefaultDigits = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";
constexpr int kFeatures = 64;     // 8x8 pixels, values 0..16
constexpr int kClasses = 10;
constexpr int kTestSamples = 360;  // held out by the examples' seeded split

struct Dataset {
    std::vector<float> pixels;  // n x 64, scaled to 0..1
    std::vector<int> labels;
    int size() const { return static_cast<int>(labels.size()); }
};

// Reads sklearn's digits.csv.gz: 65 comma-separated integers per line, the label last. nullopt
// with *error naming the file (and line) and the fix when it cannot be read.
inline std::optional<Dataset> load_digits(const std::string &path, std::string *error) {
    gzFile file = gzopen(path.c_str(), "rb");
    if (file == nullptr) {
        *error = "cannot open " + path + " (install python3-sklearn, which ships it, or pass --data FILE)";
        return std::nullopt;
    }
    Dataset data;
    char line[1024];
    int line_number = 0;
    while (gzgets(file, line, sizeof line) != nullptr) {
        ++line_number;
        const char *p = line;
        float values[kFeatures + 1];
        int count = 0;
        while (count <= kFeatures) {
            char *end = nullptr;
            const long v = std::strtol(p, &end, 10);
            if (end == p || v < 0 || v > 16) break;
            values[count++] = static_cast<float>(v);
            p = *end == ',' ? end + 1 : end;
        }
        if (count == 0 && (*p == '\n' || *p == '\0')) continue;  // blank line
        if (count != kFeatures + 1 || values[kFeatures] > 9) {
            gzclose(file);
            *error = path + ":" + std::to_string(line_number) + ": expected 64 pixel values 0..16 and a label 0..9";
            return std::nullopt;
        }
        for (int i = 0; i < kFeatures; ++i) data.pixels.push_back(values[i] / 16.0f);
        data.labels.push_back(static_cast<int>(values[kFeatures]));
    }
    gzclose(file);
    if (data.size() <= kTestSamples) {
        *error = path + ": only " + std::to_string(data.size()) + " samples; need more than " +
                 std::to_string(kTestSamples);
        return std::nullopt;
    }
    return data;
}

}  // namespace mall::examples
