// SPDX-License-Identifier: BSD-3-Clause
// Proves the SPANK plugin's release check: the same Slurm release (any micro) passes, another
// release or an unreadable one gives the admin a line naming both releases, that the plugin is off,
// and the cmake option to rebuild with (a second check behind Slurm's loader, which refuses another release itself).
#include <gtest/gtest.h>

#include "slurm_release.hpp"
#include "../support/watchdog.h"

using mall::slurm::release_mismatch;
using mall::slurm::release_of_version_number;

namespace {
MALL_TEST_WATCHDOG(60);  // a hang fails the test instead of stalling CI
constexpr unsigned kSlurm22_05_8 = 0x160508;
constexpr unsigned kSlurm24_11_5 = 0x180b05;
}  // namespace

TEST(SlurmRelease, ReleaseSpelledAsSlurmDoes) {
    EXPECT_EQ(release_of_version_number(kSlurm22_05_8), "22.05");
    EXPECT_EQ(release_of_version_number(kSlurm24_11_5), "24.11");
    EXPECT_EQ(release_of_version_number(0x1a0500), "26.05");
}

TEST(SlurmRelease, SameReleaseAnyMicroPasses) {
    EXPECT_FALSE(release_mismatch(kSlurm22_05_8, "22", "05", "22.05.8"));
    EXPECT_FALSE(release_mismatch(kSlurm22_05_8, "22", "5", "22.05.11"));  // Slurm may drop the zero
    EXPECT_FALSE(release_mismatch(kSlurm24_11_5, "24", "11", nullptr));
}

TEST(SlurmRelease, OtherReleaseSaysWhatToRebuild) {
    auto text = release_mismatch(kSlurm22_05_8, "24", "11", "24.11.5");
    ASSERT_TRUE(text);
    EXPECT_NE(text->find("built for Slurm 22.05 but runs in Slurm 24.11 (24.11.5)"), std::string::npos) << *text;
    EXPECT_NE(text->find("disabled"), std::string::npos) << *text;
    EXPECT_NE(text->find("-DMALL_SLURM_INCLUDE_DIR="), std::string::npos) << *text;
    EXPECT_NE(text->find("libslurm-dev (24.11)"), std::string::npos) << *text;
    // Same major, other minor is another release too.
    EXPECT_TRUE(release_mismatch(kSlurm24_11_5, "24", "05", "24.05.1"));
}

TEST(SlurmRelease, UnreadableRunningVersionIsAMismatch) {
    auto text = release_mismatch(kSlurm24_11_5, nullptr, "11", nullptr);
    ASSERT_TRUE(text);
    EXPECT_NE(text->find("runs in Slurm an unknown release"), std::string::npos) << *text;
    EXPECT_TRUE(release_mismatch(kSlurm24_11_5, "24", "x", nullptr));
    EXPECT_TRUE(release_mismatch(kSlurm24_11_5, "", "11", nullptr));
}
