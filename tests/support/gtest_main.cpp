// SPDX-License-Identifier: BSD-3-Clause
// gtest_main.cpp — the main() of every GoogleTest program of mall (library mall_gtest_main), so that
// a skipped test can never pass for a run one. Contract: runs all tests; exits 1 when any failed;
// otherwise, when any was skipped, prints one "SKIPPED <program> <Suite.Test>: <reason>" line per
// skipped test (also appended to the file $MALL_TEST_SKIP_LOG names, when set) and exits 77, which
// ctest reports as "Skipped" (SKIP_RETURN_CODE 77 on every test) instead of "Passed";
// launch_scripts/run-tests.sh lists those lines and, under CI, fails on a skip this machine kind
// must not have (tests/expected-skips). Exits 0 only when every test ran and passed.
#include <cstdio>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

namespace {

// The words a test gave GTEST_SKIP(), on one line.
std::string skip_reason(const ::testing::TestResult &result) {
    std::string reason;
    for (int i = 0; i < result.total_part_count(); ++i) {
        const auto &part = result.GetTestPartResult(i);
        if (part.skipped() && part.message() && *part.message()) reason += part.message();
    }
    for (char &c : reason)
        if (c == '\n' || c == '\r') c = ' ';
    return reason.empty() ? "(no reason given)" : reason;
}

std::string program_name(const char *argv0) {
    std::string name = argv0 ? argv0 : "?";
    size_t slash = name.find_last_of('/');
    return slash == std::string::npos ? name : name.substr(slash + 1);
}

}  // namespace

int main(int argc, char **argv) {
    ::testing::InitGoogleTest(&argc, argv);
    const int rc = RUN_ALL_TESTS();
    const ::testing::UnitTest &unit = *::testing::UnitTest::GetInstance();
    if (rc != 0 || unit.skipped_test_count() == 0) return rc;

    const std::string program = program_name(argc > 0 ? argv[0] : nullptr);
    const char *log_path = std::getenv("MALL_TEST_SKIP_LOG");
    std::FILE *log = log_path && *log_path ? std::fopen(log_path, "a") : nullptr;
    for (int s = 0; s < unit.total_test_suite_count(); ++s) {
        const ::testing::TestSuite &suite = *unit.GetTestSuite(s);
        for (int t = 0; t < suite.total_test_count(); ++t) {
            const ::testing::TestInfo &test = *suite.GetTestInfo(t);
            if (!test.should_run() || !test.result()->Skipped()) continue;
            std::string line = "SKIPPED " + program + " " + suite.name() + "." + test.name() + ": " +
                               skip_reason(*test.result()) + "\n";
            std::fputs(line.c_str(), stdout);
            if (log) std::fputs(line.c_str(), log);
        }
    }
    if (log) std::fclose(log);
    std::printf("%s: %d test(s) skipped: this program did not fully run (exit 77, ctest: Skipped)\n",
                program.c_str(), unit.skipped_test_count());
    std::fflush(stdout);
    return 77;
}
