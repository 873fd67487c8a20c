// SPDX-License-Identifier: BSD-3-Clause
// test_oci_hook_input: proves that mall-oci-hook treats a container's annotations as requests
// within the admin's limits (issue 37.11): whoever creates a container writes them, so a Slurm
// job's name (slurm-N, which a Slurm epilog's Release ends) or a self-registered job's (self-N)
// never becomes the container's job, names go under the admin's --job-prefix (never a reserved
// one), a weight above --max-weight is refused, MAX is cut to --max-cores and MIN above it
// refused; and that its --log is never written through a symlink or
// into anything but a regular file. The hook runs as built, with a crafted OCI state on stdin and
// a socket nobody listens on (it stops before registering), and the annotation parser is driven
// directly too. Every temporary file is removed; the watchdog fails a hang.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "support/malld_fixture.hpp"
#include "support/watchdog.h"
#include "tools/mall_oci_hook_container.hpp"

namespace {

MALL_TEST_WATCHDOG(90);

namespace hook = mall::tools::oci_hook;
using mall::test::CommandResult;

// A container's bundle (config.json: root, no user namespace) and its OCI state, in a fresh folder
// removed at the end; run() starts the hook as the runtime does.
class HookRun {
public:
    HookRun() {
        const char *tmp = std::getenv("TMPDIR");
        std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/mall-oci-input.XXXXXX";
        if (::mkdtemp(pattern.data()) != nullptr) folder_ = pattern;
        std::ofstream(folder_ + "/config.json") << R"({"ociVersion":"1.0.2","process":{"user":{"uid":0,"gid":0}}})";
    }
    ~HookRun() {
        std::error_code ignored;
        if (!folder_.empty()) std::filesystem::remove_all(folder_, ignored);
    }
    const std::string &folder() const { return folder_; }

    // createRuntime for a container with these annotations ("KEY": "VALUE" pairs), with the
    // hook's extra options.
    CommandResult run(const std::vector<std::pair<std::string, std::string>> &annotations,
                      const std::vector<std::string> &options = {}) const {
        std::ostringstream state;
        state << R"({"ociVersion":"1.0.2","id":"0123456789abcdef","status":"creating","pid":)" << ::getpid()
              << R"(,"bundle":")" << folder_ << R"(","annotations":{)";
        for (size_t i = 0; i < annotations.size(); ++i)
            state << (i ? "," : "") << '"' << annotations[i].first << "\":\"" << annotations[i].second << '"';
        state << "}}";
        std::ofstream(folder_ + "/state.json") << state.str();
        std::vector<std::string> argv{"/bin/sh", "-c", "f=$1; shift; exec \"$@\" <\"$f\"", "sh",
                                      folder_ + "/state.json", std::string(MALL_BIN_DIR) + "/mall-oci-hook",
                                      "--socket", folder_ + "/nobody-listens.sock", "--timeout", "5"};
        argv.insert(argv.end(), options.begin(), options.end());
        argv.push_back("createRuntime");
        return mall::test::run_command(argv);
    }

private:
    std::string folder_;
};

bool contains(const std::string &text, const std::string &part) { return text.find(part) != std::string::npos; }

std::string file_text(const std::string &path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
}

hook::State state_with(const std::vector<std::pair<std::string, std::string>> &annotations) {
    hook::State s;
    s.id = "0123456789abcdef";
    s.annotations = annotations;
    return s;
}

TEST(Issue37OciHookAnnotations, ASlurmJobsNameBecomesAContainerJobUnderThePrefix) {
    std::string error;
    auto request = hook::parse_request(state_with({{"io.mall.malleable", "1:2"}, {"io.mall.job", "slurm-5"}}),
                                       hook::Limits{}, &error);
    ASSERT_TRUE(request) << error;
    EXPECT_EQ(request->job, "ctr-slurm-5");
    // The built hook says so too (it names the job it could not register: nobody listens).
    HookRun run;
    auto r = run.run({{"io.mall.malleable", "1:2"}, {"io.mall.job", "slurm-5"}});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(contains(r.err, "cannot register job ctr-slurm-5:")) << r.err;
    // Without an annotation: the prefix and the id, as before.
    request = hook::parse_request(state_with({{"io.mall.malleable", "1"}}), hook::Limits{}, &error);
    ASSERT_TRUE(request) << error;
    EXPECT_EQ(request->job, "ctr-0123456789ab");
}

TEST(Issue37OciHookAnnotations, ASlurmJobsNameIsRefusedEvenWithoutAPrefix) {
    HookRun run;
    auto r = run.run({{"io.mall.malleable", "1:2"}, {"io.mall.job", "slurm-5"}}, {"--job-prefix", ""});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, "bad annotation io.mall.job='slurm-5': the job's name 'slurm-5' is reserved, which a "
                                "container may not take (job names starting with 'slurm-' are kept for Slurm jobs"))
        << r.err;
    // A prefix that ends where "slurm-" begins: the whole name counts.
    r = run.run({{"io.mall.malleable", "1:2"}, {"io.mall.job", "-5"}}, {"--job-prefix", "slurm"});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, "job names starting with 'slurm-' are kept for Slurm jobs")) << r.err;
    // The admin cannot pick a Slurm prefix either.
    r = run.run({{"io.mall.malleable", "1:2"}}, {"--job-prefix", "slurm-9"});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, "--job-prefix 'slurm-9' would make every container's job name reserved: job names "
                                "starting with 'slurm-' are kept for Slurm jobs"))
        << r.err;
}

// "self-<pid>" is malld's name for a self-registered job (re-adopted in place by that name after a
// restart): the admin's --job-prefix may not start with it (before, only "slurm-" was refused), nor
// may a container's name under an empty prefix.
TEST(Issue37OciHookAnnotations, TheSelfRegisteredJobsPrefixIsRefusedAsJobPrefixAndAsAName) {
    HookRun run;
    auto r = run.run({{"io.mall.malleable", "1:2"}}, {"--job-prefix", "self-"});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, "--job-prefix 'self-' would make every container's job name reserved: job names "
                                "starting with 'self-' are kept for self-registered jobs"))
        << r.err;
    r = run.run({{"io.mall.malleable", "1:2"}, {"io.mall.job", "self-42"}}, {"--job-prefix", ""});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, "bad annotation io.mall.job='self-42': the job's name 'self-42' is reserved")) << r.err;
    EXPECT_NE(hook::job_prefix_problem("self-"), "");
    EXPECT_NE(hook::job_prefix_problem("self-team."), "");
    EXPECT_EQ(hook::job_prefix_problem("selfish-"), "");
}

TEST(Issue37OciHookAnnotations, NamesWithSlashesOrControlCharactersAreRefused) {
    std::string error;
    for (const std::string &bad : std::vector<std::string>{"a/b", "../x", "a\nb", "a\x01"}) {
        EXPECT_FALSE(hook::parse_request(state_with({{"io.mall.malleable", "1"}, {"io.mall.job", bad}}),
                                         hook::Limits{}, &error))
            << bad;
        EXPECT_TRUE(contains(error, "bad annotation io.mall.job=")) << error;
        EXPECT_TRUE(contains(error, "is not a job name")) << error;
    }
    EXPECT_NE(hook::job_prefix_problem("a/"), "");
    EXPECT_NE(hook::job_prefix_problem(std::string(33, 'a')), "");
    EXPECT_EQ(hook::job_prefix_problem("team-a."), "");
}

TEST(Issue37OciHookAnnotations, AWeightAboveTheAdminsCapIsRefused) {
    HookRun run;
    for (const std::string weight : {"1000", "1e9", "100.5"}) {
        auto r = run.run({{"io.mall.malleable", "1"}, {"io.mall.weight", weight}});
        EXPECT_EQ(r.exit_code, 2) << weight << ": " << r.err;
        EXPECT_TRUE(contains(r.err, "bad annotation io.mall.weight='" + weight + "'")) << r.err;
    }
    auto r = run.run({{"io.mall.malleable", "1"}, {"io.mall.weight", "1000"}});
    EXPECT_TRUE(contains(r.err, "may ask for a weight of at most 100 (mall-oci-hook --max-weight")) << r.err;
    // Within the cap, and within a cap the admin raised: accepted (then malld cannot be reached).
    r = run.run({{"io.mall.malleable", "1"}, {"io.mall.weight", "100"}});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    r = run.run({{"io.mall.malleable", "1"}, {"io.mall.weight", "1000"}}, {"--max-weight", "2000"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    r = run.run({{"io.mall.malleable", "1"}}, {"--max-weight", "0"});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, "--max-weight takes")) << r.err;
}

TEST(Issue37OciHookAnnotations, MaxIsCutToTheAdminsCapAndMinAboveItRefused) {
    std::string error;
    hook::Limits limits;
    limits.max_cores = 2;
    auto request = hook::parse_request(state_with({{"io.mall.malleable", "1:64"}}), limits, &error);
    ASSERT_TRUE(request) << error;
    EXPECT_EQ(request->max, 2);
    EXPECT_EQ(request->asked_max, 64);
    HookRun run;
    auto r = run.run({{"io.mall.malleable", "1:64"}}, {"--max-cores", "2"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(contains(r.err, "asks for up to 64 cores; this node's containers may have at most 2")) << r.err;
    r = run.run({{"io.mall.malleable", "3"}, {"io.mall.require", "true"}}, {"--max-cores", "2"});
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_TRUE(contains(r.err, "asks for at least 3 cores, but this node's containers may have at most 2")) << r.err;
    // The default cap is the node's cpus.
    const long cpus = ::sysconf(_SC_NPROCESSORS_CONF);
    r = run.run({{"io.mall.malleable", "1:" + std::to_string(cpus + 1)}});
    EXPECT_TRUE(contains(r.err, "may have at most " + std::to_string(cpus))) << r.err;
}

TEST(Issue37OciHookLog, ASymlinkIsNotFollowed) {
    HookRun run;
    const std::string target = run.folder() + "/precious", link = run.folder() + "/hook.log";
    std::ofstream(target) << "keep\n";
    ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
    auto r = run.run({{"io.mall.malleable", "1"}}, {"--log", link});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(file_text(target), "keep\n");
    EXPECT_TRUE(contains(r.err, "not logging to --log " + link + ": it is a symlink")) << r.err;
}

TEST(Issue37OciHookLog, OnlyARegularFileIsWritten) {
    HookRun run;
    const std::string fifo = run.folder() + "/fifo";
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    auto r = run.run({{"io.mall.malleable", "1"}}, {"--log", fifo});  // would block on open before
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_FALSE(r.timed_out);
    EXPECT_TRUE(contains(r.err, "not logging to --log " + fifo)) << r.err;
    // A regular file gets the lines, and a missing one is made 0640.
    const std::string log = run.folder() + "/hook.log";
    r = run.run({{"io.mall.malleable", "1"}}, {"--log", log});
    EXPECT_TRUE(contains(file_text(log), "createRuntime container 0123456789ab: warning: cannot register job "
                                         "ctr-0123456789ab"))
        << file_text(log);
    struct stat st{};
    ASSERT_EQ(::stat(log.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0640u);
}

}  // namespace
