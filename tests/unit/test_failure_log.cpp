// SPDX-License-Identifier: BSD-3-Clause
// Proves malld's FailureLog (daemon/log.hpp) as an admin reads the log of a file malld keeps
// failing to write: each distinct failure once, not once per try; the first success after failures
// says so once; a failure after that success is logged again. The lines are read from stderr,
// where malld's log goes.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/log.hpp"
#include "support/watchdog.h"

MALL_TEST_WATCHDOG(30);

namespace {

// Runs `body` with stderr going to a temporary file; returns the log lines' texts (after "level: ").
std::vector<std::string> logged_by(const std::function<void()> &body) {
    std::fflush(stderr);
    char path[] = "/tmp/mall_test_failure_log.XXXXXX";
    const int file = ::mkstemp(path);
    EXPECT_GE(file, 0);
    const int saved = ::dup(2);
    ::dup2(file, 2);
    body();
    ::dup2(saved, 2);
    ::close(saved);
    std::string text;
    char buffer[4096];
    ::lseek(file, 0, SEEK_SET);
    for (ssize_t n; (n = ::read(file, buffer, sizeof buffer)) > 0;) text.append(buffer, static_cast<size_t>(n));
    ::close(file);
    ::unlink(path);
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
        const auto level_end = line.find(": ");
        lines.push_back(level_end == std::string::npos ? line : line.substr(line.find(' ', line.find(']')) + 1));
    }
    return lines;
}

TEST(FailureLog, EachDistinctFailureOnceAndTheRecoveryOnce) {
    mall::set_log_level(mall::LogLevel::Info);
    mall::FailureLog failures;
    const auto lines = logged_by([&] {
        failures.succeeded("back");                                 // nothing failed yet: silent
        failures.failed("ENOSPC", mall::LogLevel::Error, "disk full (1)");
        failures.failed("ENOSPC", mall::LogLevel::Error, "disk full (2)");  // the same: silent
        failures.failed("EACCES", mall::LogLevel::Warn, "denied");  // another failure
        failures.succeeded("written again");
        failures.succeeded("written again");                        // still fine: silent
        failures.failed("ENOSPC", mall::LogLevel::Error, "disk full (3)");  // after a success: again
        failures.failed("", mall::LogLevel::Error, "no words");     // a failure without words still counts
        failures.failed("", mall::LogLevel::Error, "no words (2)"); // the same: silent
        failures.succeeded("");                                     // nothing to say
        failures.succeeded("written again");                        // the last outcome was a success
    });
    EXPECT_EQ(lines, (std::vector<std::string>{"error: disk full (1)", "warn: denied", "info: written again",
                                               "error: disk full (3)", "error: no words"}));
}

}  // namespace
