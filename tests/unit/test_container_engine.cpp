// SPDX-License-Identifier: BSD-3-Clause
// test_container_engine: proves what `mallrun --container` builds for each cgroup driver (the run's
// options, the engine query, the check of malld's answer) and how a job's systemd slice is named
// and found again (daemon/systemd_slice.hpp: escaping, the cgroup path, the way back to the job);
// the socket's folder goes into a container read-only, and root's mallrun never takes the engine
// from $PATH (issue 37).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "daemon/systemd_slice.hpp"
#include "support/malld_fixture.hpp"
#include "support/watchdog.h"
#include "tools/container_engine.hpp"

namespace {

MALL_TEST_WATCHDOG(60);

using mall::tools::CgroupDriver;
using Words = std::vector<std::string>;

TEST(ContainerEngine, ParsesWhatTheEnginesPrint) {
    EXPECT_EQ(mall::tools::parse_cgroup_driver("systemd\n"), CgroupDriver::Systemd);
    EXPECT_EQ(mall::tools::parse_cgroup_driver(" cgroupfs "), CgroupDriver::Cgroupfs);
    EXPECT_FALSE(mall::tools::parse_cgroup_driver(""));
    EXPECT_FALSE(mall::tools::parse_cgroup_driver("none"));
    EXPECT_FALSE(mall::tools::parse_cgroup_driver("systemd cgroupfs"));
}

TEST(ContainerEngine, InfoCommandKeepsTheGlobalOptions) {
    EXPECT_EQ(mall::tools::engine_info_command({"podman", "--root", "/r", "run", "--rm", "img"}, "podman"),
              (Words{"podman", "--root", "/r", "info", "--format={{.Host.CgroupManager}}"}));
    EXPECT_EQ(mall::tools::engine_info_command({"/usr/bin/podman", "container", "run", "img"}, "podman"),
              (Words{"/usr/bin/podman", "info", "--format={{.Host.CgroupManager}}"}));
    EXPECT_EQ(mall::tools::engine_info_command({"docker", "-H", "unix:///s", "run", "img"}, "docker"),
              (Words{"docker", "-H", "unix:///s", "info", "--format={{.CgroupDriver}}"}));
}

TEST(ContainerEngine, FindsAnExplicitCgroupManagerBeforeRunOnly) {
    EXPECT_EQ(mall::tools::explicit_cgroup_manager({"podman", "--cgroup-manager=systemd", "run", "i"}), "systemd");
    EXPECT_EQ(mall::tools::explicit_cgroup_manager({"podman", "--cgroup-manager", "cgroupfs", "run", "i"}), "cgroupfs");
    EXPECT_FALSE(mall::tools::explicit_cgroup_manager({"podman", "run", "i", "--cgroup-manager=systemd"}));
}

TEST(ContainerEngine, PodmanWithCgroupfsGetsAFolderAndTheCgroupfsManager) {
    const Words cmd{"podman", "--root", "/r", "run", "--rm", "img", "sleep", "1"};
    EXPECT_EQ(mall::tools::container_command(cmd, "podman", CgroupDriver::Cgroupfs, "/mall/job_a",
                                             "/run/mall/malld.sock", "a", 2),
              (Words{"podman", "--root", "/r", "--cgroup-manager=cgroupfs", "run", "--cgroup-parent=/mall/job_a",
                     "--volume=/run/mall:/run/mall:ro", "--env=MALL_SOCKET=/run/mall/malld.sock",
                     "--env=MALL_JOB_ID=a", "--env=MALL_MAX=2", "--rm", "img", "sleep", "1"}));
}

TEST(ContainerEngine, PodmanWithSystemdGetsASliceAndTheSystemdManager) {
    const Words cmd{"podman", "run", "-d", "img"};
    const Words out = mall::tools::container_command(cmd, "podman", CgroupDriver::Systemd, "mall-a.slice",
                                                     "/run/mall/malld.sock", "a", 2);
    EXPECT_EQ(out[1], "--cgroup-manager=systemd");
    EXPECT_EQ(out[2], "run");
    EXPECT_EQ(out[3], "--cgroup-parent=mall-a.slice");
    // A manager CMD names is not repeated.
    const Words named = mall::tools::container_command({"podman", "--cgroup-manager=systemd", "run", "img"}, "podman",
                                                       CgroupDriver::Systemd, "mall-a.slice", "/s/m.sock", "a", 1);
    EXPECT_EQ(named[1], "--cgroup-manager=systemd");
    EXPECT_EQ(named[2], "run");
}

TEST(ContainerEngine, DockerGetsNoManagerOption) {
    const Words out = mall::tools::container_command({"docker", "run", "img"}, "docker", CgroupDriver::Systemd,
                                                     "mall-a.slice", "/run/mall/malld.sock", "a", 1);
    EXPECT_EQ(out[1], "run");
    EXPECT_EQ(out[2], "--cgroup-parent=mall-a.slice");
}

// Issue 37.1: a container must not write in malld's folder (plant a symlink, replace the socket):
// every engine and driver gets it read-only, the only mount of it.
TEST(Issue37ContainerSocketFolder, IsMountedReadOnlyForEveryEngineAndDriver) {
    for (const std::string engine : {"podman", "docker"}) {
        for (const auto driver : {CgroupDriver::Cgroupfs, CgroupDriver::Systemd}) {
            const Words out = mall::tools::container_command({engine, "run", "img"}, engine, driver, "/mall/job_a",
                                                             "/run/mall/malld.sock", "a", 1);
            int volumes = 0;
            for (const auto &word : out) {
                if (word.rfind("--volume=", 0) != 0 && word != "-v" && word != "--volume") continue;
                ++volumes;
                EXPECT_EQ(word, "--volume=/run/mall:/run/mall:ro") << engine;
            }
            EXPECT_EQ(volumes, 1) << engine;
        }
    }
}

// Issue 37.11: root's `mallrun --container -- ENGINE run` takes ENGINE from the system folders,
// never from a folder $PATH names (before, a fake engine there ran as root: mallrun, finding no
// malld, ran CMD through execvp). The engine's name is found in no system folder, so mallrun
// refuses with words and runs nothing.
TEST(Issue37ContainerEngineAsRoot, MallrunDoesNotRunAnEngineFoundThroughPath) {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root: only root's lookup leaves $PATH out";
    const char *tmp = std::getenv("TMPDIR");
    std::string folder = std::string(tmp && *tmp ? tmp : "/tmp") + "/mall-engine-path.XXXXXX";
    ASSERT_NE(::mkdtemp(folder.data()), nullptr);
    const std::string engine = folder + "/mall-fake-engine", marker = folder + "/ran";
    std::ofstream(engine) << "#!/bin/sh\necho ran >" << marker << "\n";
    ::chmod(engine.c_str(), 0755);
    auto r = mall::test::run_command({"/usr/bin/env", "PATH=" + folder, std::string(MALL_BIN_DIR) + "/mallrun",
                                      "--socket", folder + "/none.sock", "--malleable=1", "--container=podman", "--",
                                      "mall-fake-engine", "run", "img"});
    struct stat st{};
    const bool ran = ::stat(marker.c_str(), &st) == 0;
    ::unlink(marker.c_str());
    ::unlink(engine.c_str());
    ::rmdir(folder.c_str());
    EXPECT_FALSE(ran) << "root's mallrun ran the engine it found through PATH";
    EXPECT_EQ(r.exit_code, 127) << r.err;
    EXPECT_NE(r.err.find("runs mall-fake-engine only from the system folders"), std::string::npos) << r.err;
}

TEST(ContainerEngine, ChecksThatMalldsAnswerFitsTheDriver) {
    EXPECT_EQ(mall::tools::cgroup_parent_problem("mall-a.slice", CgroupDriver::Systemd), "");
    EXPECT_EQ(mall::tools::cgroup_parent_problem("/mall/job_a", CgroupDriver::Cgroupfs), "");
    EXPECT_NE(mall::tools::cgroup_parent_problem("/mall/job_a", CgroupDriver::Systemd).find("update malld"),
              std::string::npos);
    EXPECT_NE(mall::tools::cgroup_parent_problem("/mall.slice/mall-a.slice", CgroupDriver::Systemd), "");
    EXPECT_NE(mall::tools::cgroup_parent_problem("mall-a.slice", CgroupDriver::Cgroupfs), "");
}

TEST(ContainerEngine, RefusesAnOwnCgroupParent) {
    EXPECT_NE(mall::tools::container_command_problem({"podman", "run", "--cgroup-parent=x.slice", "img"}, "podman"),
              "");
    EXPECT_EQ(mall::tools::container_command_problem({"podman", "run", "img", "--cgroup-parent=x"}, "podman"), "");
    EXPECT_NE(mall::tools::container_command_problem({"crun", "run", "img"}, "crun"), "");
}

TEST(SystemdSlice, NamesAJobsSliceSoThatDashesAndColonsDoNotNest) {
    namespace s = mall::systemd_slice;
    EXPECT_EQ(s::job_slice_name("train"), "mall-train.slice");
    EXPECT_EQ(s::job_slice_name("tf-a"), "mall-tf\\x2da.slice");
    EXPECT_EQ(s::job_slice_name("a:b.c_d"), "mall-a\\x3ab.c_d.slice");
    EXPECT_EQ(s::job_slice_name(".x"), "mall-\\x2ex.slice");
    EXPECT_EQ(s::cgroup_path_of("mall-tf\\x2da.slice"), "/mall.slice/mall-tf\\x2da.slice");
    // 64 characters that all need escaping are longer than a unit name may be.
    EXPECT_FALSE(s::job_slice_name(std::string(64, '-')));
    EXPECT_TRUE(s::job_slice_name(std::string(60, '-')));
    EXPECT_TRUE(s::job_slice_name(std::string(64, 'a')));
}

TEST(SystemdSlice, FindsTheJobOfASliceAgain) {
    namespace s = mall::systemd_slice;
    for (const std::string job : {"train", "tf-a", "a:b", ".hidden", "x.y-z_1", "-"}) {
        auto name = s::job_slice_name(job);
        ASSERT_TRUE(name) << job;
        EXPECT_EQ(s::job_of_slice(*name), job) << *name;
    }
    EXPECT_FALSE(s::job_of_slice("machine.slice"));
    EXPECT_FALSE(s::job_of_slice("mall.slice"));
    EXPECT_FALSE(s::job_of_slice("mall-.slice"));
    EXPECT_FALSE(s::job_of_slice("mall-a-b.slice"));       // a nested slice, not one of malld's
    EXPECT_FALSE(s::job_of_slice("mall-a\\x2D.slice"));    // upper-case hex is not how malld writes it
    EXPECT_FALSE(s::job_of_slice("mall-a\\x2.slice"));     // cut short
    EXPECT_FALSE(s::job_of_slice("libpod-abc.scope"));
}

}  // namespace
