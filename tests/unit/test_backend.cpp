// SPDX-License-Identifier: BSD-3-Clause
// Proves the cpuset backends on the real kernel: job cgroups are created, narrowed and widened with
// every thread's allowed cpus following (even a thread pinned by someone else), and removed without
// leaks; the affinity backend reaches every thread of a process tree; the /proc helpers are right.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/backend.hpp"
#include "support/watchdog.h"

using mall::BackendKind;
using mall::CpuSet;

namespace {

MALL_TEST_WATCHDOG(60);

CpuSet cpus(const std::string &text) {
    auto set = CpuSet::parse(text);
    EXPECT_TRUE(set.has_value()) << text;
    return set.value_or(CpuSet());
}

std::string read_file(const std::string &path) {
    std::ifstream in(path);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    return text;
}

bool exists(const std::string &path) {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
}

// Cpus_allowed_list of every thread of pid, by thread id.
std::map<pid_t, std::string> allowed_by_thread(pid_t pid) {
    std::map<pid_t, std::string> out;
    for (pid_t tid : mall::threads_of(pid)) {
        std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/status");
        std::string line;
        while (std::getline(in, line))
            if (line.rfind("Cpus_allowed_list:", 0) == 0) {
                std::string value = line.substr(line.find(':') + 1);
                value.erase(0, value.find_first_not_of(" \t"));
                out[tid] = value;
            }
    }
    return out;
}

// Every thread of pid allows exactly `expected` (canonical list text).
void expect_all_threads(pid_t pid, const std::string &expected, int min_threads) {
    auto threads = allowed_by_thread(pid);
    EXPECT_GE(static_cast<int>(threads.size()), min_threads) << "pid " << pid;
    for (const auto &[tid, allowed] : threads)
        EXPECT_EQ(cpus(allowed).to_string(), expected) << "thread " << tid << " of pid " << pid;
}

void *sleep_forever(void *) {
    for (;;) ::pause();
    return nullptr;
}

// Forks a child with `threads` extra threads that sleep; returns once they all exist. The child
// dies with the test (PR_SET_PDEATHSIG). With `grandchild`, the child also forks one sleeper.
pid_t spawn_sleeper(int threads, bool grandchild = false) {
    int ready[2];
    if (::pipe(ready) != 0) return -1;
    pid_t pid = ::fork();
    if (pid == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        ::close(ready[0]);
        if (grandchild) {
            pid_t g = ::fork();
            if (g == 0) {
                ::prctl(PR_SET_PDEATHSIG, SIGKILL);
                for (;;) ::pause();
            }
        }
        for (int i = 0; i < threads; ++i) {
            pthread_t t;
            ::pthread_create(&t, nullptr, sleep_forever, nullptr);
        }
        char c = 1;
        if (::write(ready[1], &c, 1) != 1) ::_exit(1);
        for (;;) ::pause();
    }
    ::close(ready[1]);
    char c;
    ssize_t n = ::read(ready[0], &c, 1);
    ::close(ready[0]);
    if (n != 1) return -1;
    if (grandchild) {  // wait until the grandchild shows up in /proc
        for (int i = 0; i < 2000 && mall::descendants_of(pid).empty(); ++i) ::usleep(1000);
    }
    return pid;
}

void kill_and_reap(pid_t pid) {
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
}

// Tests that start processes or make cgroups clean them up here, even when an assertion failed.
class BackendTest : public ::testing::Test {
protected:
    void TearDown() override {
        for (pid_t pid : children_) kill_and_reap(pid);
        for (pid_t pid : grandchildren_) ::kill(pid, SIGKILL);
        if (!parent_dir_.empty() && exists(parent_dir_)) {
            if (DIR *d = ::opendir(parent_dir_.c_str())) {
                std::vector<std::string> jobs;
                while (dirent *e = ::readdir(d))
                    if (std::strncmp(e->d_name, "job_", 4) == 0) jobs.push_back(parent_dir_ + "/" + e->d_name);
                ::closedir(d);
                for (const auto &j : jobs) remove_cgroup(j);
            }
            remove_cgroup(parent_dir_);
        }
        EXPECT_TRUE(parent_dir_.empty() || !exists(parent_dir_)) << "leaked cgroup " << parent_dir_;
    }

    void remove_cgroup(const std::string &dir) {
        std::ifstream procs(dir + "/cgroup.procs");
        pid_t pid;
        while (procs >> pid) {
            std::ofstream root(mount_ + "/cgroup.procs");
            root << pid;
        }
        for (int i = 0; i < 100 && ::rmdir(dir.c_str()) != 0 && errno == EBUSY; ++i) ::usleep(10000);
    }

    pid_t spawn(int threads, bool grandchild = false) {
        pid_t pid = spawn_sleeper(threads, grandchild);
        if (pid > 0) {
            children_.push_back(pid);
            for (pid_t g : mall::descendants_of(pid)) grandchildren_.push_back(g);
        }
        return pid;
    }

    // Online cpus of this machine as the root cpuset sees them.
    CpuSet machine_cpus() const {
        auto set = CpuSet::parse(read_file(mount_ + "/cpuset.effective_cpus"));
        return set.value_or(CpuSet());
    }

    std::string mount_;
    std::string parent_dir_;
    std::vector<pid_t> children_;
    std::vector<pid_t> grandchildren_;
};

// Shrinks and grows a job cgroup and checks cpuset.cpus and every thread's allowed cpus.
void exercise_cgroup_job(mall::CpusetBackend &backend, pid_t child, const std::string &job_dir,
                         const CpuSet &all, int threads) {
    const int first = all.first();
    const CpuSet one = CpuSet::from_list({first});
    std::string error;

    // First apply creates the folder and moves the process (all its threads) in.
    ASSERT_TRUE(backend.apply("t1", {child}, all, true, &error)) << error;
    ASSERT_TRUE(exists(job_dir));
    EXPECT_EQ(cpus(read_file(job_dir + "/cpuset.cpus")).to_string(), all.to_string());
    EXPECT_NE(read_file(job_dir + "/cgroup.procs").find(std::to_string(child)), std::string::npos);
    expect_all_threads(child, all.to_string(), threads + 1);
    auto current = backend.current("t1", {child});
    ASSERT_TRUE(current.has_value());
    EXPECT_EQ(current->to_string(), all.to_string());

    // Shrink: the cpuset write alone narrows every thread.
    ASSERT_TRUE(backend.apply("t1", {child}, one, false, &error)) << error;
    EXPECT_EQ(read_file(job_dir + "/cpuset.cpus"), one.to_string());
    expect_all_threads(child, one.to_string(), threads + 1);

    // A launcher pins one thread to the first cpu (its own requested mask). Growing must widen it
    // too: the kernel would otherwise keep it on its requested cpu.
    auto tids = mall::threads_of(child);
    ASSERT_GE(tids.size(), 2u);
    ASSERT_TRUE(mall::set_thread_affinity(tids.back(), one));
    ASSERT_TRUE(backend.apply("t1", {child}, all, true, &error)) << error;
    EXPECT_EQ(cpus(read_file(job_dir + "/cpuset.cpus")).to_string(), all.to_string());
    expect_all_threads(child, all.to_string(), threads + 1);

    // No cpus at all cannot be enforced on a group with processes: a clear error, nothing changed.
    EXPECT_FALSE(backend.apply("t1", {child}, CpuSet(), false, &error));
    EXPECT_NE(error.find(job_dir), std::string::npos) << error;
    EXPECT_EQ(cpus(read_file(job_dir + "/cpuset.cpus")).to_string(), all.to_string());
}

void check_cgroup_backend(BackendKind kind, const std::string &parent,
                          std::string &parent_dir_out, pid_t child, int threads) {
    std::string why, error;
    auto backend = mall::make_backend(kind, parent, &why, &error);
    ASSERT_NE(backend, nullptr) << error;
    EXPECT_EQ(backend->kind(), kind);
    EXPECT_FALSE(why.empty());
    const std::string job_dir = backend->cgroup_path("t1");
    parent_dir_out = job_dir.substr(0, job_dir.rfind('/'));
    EXPECT_NE(backend->describe().find(parent_dir_out), std::string::npos) << backend->describe();

    auto all = CpuSet::parse(read_file("/sys/devices/system/cpu/online"));
    ASSERT_TRUE(all.has_value());
    ASSERT_TRUE(backend->start(*all, &error)) << error;
    ASSERT_TRUE(exists(parent_dir_out));
    EXPECT_EQ(cpus(read_file(parent_dir_out + "/cpuset.cpus")).to_string(), all->to_string());
    // No folder before the first apply with cpus; an empty apply creates none.
    EXPECT_FALSE(exists(job_dir));
    EXPECT_TRUE(backend->apply("t1", {child}, CpuSet(), false, &error)) << error;
    EXPECT_FALSE(exists(job_dir));

    if (all->count() < 2) {
        GTEST_SKIP() << "this machine has one cpu: shrink/grow needs two";
    }
    exercise_cgroup_job(*backend, child, job_dir, *all, threads);
    if (::testing::Test::HasFatalFailure()) return;

    // stop() keeps a parent that still holds a job (a restarted malld re-adopts it).
    backend->stop();
    EXPECT_TRUE(exists(job_dir));

    // remove() moves the leftover process out and deletes the folder; stop() then the parent.
    backend->remove("t1");
    EXPECT_FALSE(exists(job_dir));
    EXPECT_TRUE(mall::process_alive(child)) << "remove() must not harm the job's processes";
    backend->stop();
    EXPECT_FALSE(exists(parent_dir_out));
}

TEST_F(BackendTest, CgroupV1CreatesShrinksGrowsAndRemoves) {
    mount_ = mall::cgroup_v1_cpuset_mount();
    if (mount_.empty()) GTEST_SKIP() << "no cgroup v1 cpuset hierarchy in /proc/self/mountinfo";
    if (::geteuid() != 0) GTEST_SKIP() << "creating cpuset cgroups needs root";
    const std::string parent = "mall_unit_" + std::to_string(::getpid());
    parent_dir_ = mount_ + "/" + parent;
    const int threads = 3;
    pid_t child = spawn(threads);
    ASSERT_GT(child, 0);
    std::string dir;
    check_cgroup_backend(BackendKind::CgroupV1, parent, dir, child, threads);
    if (HasFatalFailure() || IsSkipped()) return;
    EXPECT_EQ(dir, parent_dir_);
    // The process went back to the hierarchy's root cgroup.
    std::istringstream lines(read_file("/proc/" + std::to_string(child) + "/cgroup"));
    std::string line, cpuset_line;
    while (std::getline(lines, line))
        if (line.find(":cpuset:") != std::string::npos) cpuset_line = line;
    EXPECT_EQ(cpuset_line.substr(cpuset_line.find(":cpuset:")), ":cpuset:/") << cpuset_line;
}

TEST_F(BackendTest, CgroupV2WhereUsableElseAClearReason) {
    const std::string parent = "mall_unit_v2_" + std::to_string(::getpid());
    std::string why, error;
    auto backend = mall::make_backend(BackendKind::CgroupV2, parent, &why, &error);
    if (!backend) {
        EXPECT_NE(error.find("cgroup-v2 is not usable"), std::string::npos) << error;
        EXPECT_NE(error.find("--backend"), std::string::npos) << error;
        GTEST_SKIP() << "no usable cgroup v2 cpuset controller here: " << error;
    }
    // TearDown needs the folders before anything can fail.
    const std::string job_dir = backend->cgroup_path("t1");
    parent_dir_ = job_dir.substr(0, job_dir.rfind('/'));
    mount_ = parent_dir_.substr(0, parent_dir_.rfind('/'));
    backend.reset();
    const int threads = 2;
    pid_t child = spawn(threads);
    ASSERT_GT(child, 0);
    std::string dir;
    check_cgroup_backend(BackendKind::CgroupV2, parent, dir, child, threads);
}

TEST_F(BackendTest, AutoPicksTheBestUsableAndSaysWhy) {
    const std::string parent = "mall_unit_auto_" + std::to_string(::getpid());
    std::string why, error;
    auto backend = mall::make_backend(BackendKind::Auto, parent, &why, &error);
    ASSERT_NE(backend, nullptr) << error;
    EXPECT_NE(why.find("auto"), std::string::npos) << why;
    if (!mall::cgroup_v1_cpuset_mount().empty() && ::geteuid() == 0) {
        EXPECT_EQ(backend->kind(), BackendKind::CgroupV1) << why;
    }
    if (backend->kind() == BackendKind::Affinity) {
        EXPECT_NE(why.find("cgroup-v1 not usable"), std::string::npos) << why;
    }
    // Probing must not leave the parent folder behind.
    std::string mount = mall::cgroup_v1_cpuset_mount();
    if (!mount.empty()) {
        EXPECT_FALSE(exists(mount + "/" + parent));
    }

    EXPECT_EQ(mall::make_backend(BackendKind::Auto, "a/b", &why, &error), nullptr);
    EXPECT_NE(error.find("a/b"), std::string::npos) << error;
}

TEST_F(BackendTest, NamesRoundTrip) {
    for (auto kind : {BackendKind::Auto, BackendKind::CgroupV1, BackendKind::CgroupV2, BackendKind::Affinity}) {
        auto parsed = mall::parse_backend(mall::backend_name(kind));
        ASSERT_TRUE(parsed.has_value());
        EXPECT_EQ(*parsed, kind);
    }
    EXPECT_FALSE(mall::parse_backend("cgroup").has_value());
}

TEST_F(BackendTest, AffinityReachesEveryThreadOfTheProcessTree) {
    auto all = CpuSet::parse(read_file("/sys/devices/system/cpu/online"));
    ASSERT_TRUE(all.has_value());
    if (all->count() < 2) GTEST_SKIP() << "this machine has one cpu: nothing to narrow";
    std::string why, error;
    auto backend = mall::make_backend(BackendKind::Affinity, "unused", &why, &error);
    ASSERT_NE(backend, nullptr) << error;
    EXPECT_EQ(backend->cgroup_path("j"), "");
    ASSERT_TRUE(backend->start(*all, &error)) << error;

    const int threads = 3;
    pid_t child = spawn(threads, /*grandchild=*/true);
    ASSERT_GT(child, 0);
    auto grandchildren = mall::descendants_of(child);
    ASSERT_EQ(grandchildren.size(), 1u);
    const CpuSet one = CpuSet::from_list({all->first()});

    ASSERT_TRUE(backend->apply("j", {child}, one, false, &error)) << error;
    expect_all_threads(child, one.to_string(), threads + 1);
    expect_all_threads(grandchildren[0], one.to_string(), 1);
    auto current = backend->current("j", {child});
    ASSERT_TRUE(current.has_value());
    EXPECT_EQ(current->to_string(), one.to_string());

    ASSERT_TRUE(backend->apply("j", {child}, *all, true, &error)) << error;
    expect_all_threads(child, all->to_string(), threads + 1);
    expect_all_threads(grandchildren[0], all->to_string(), 1);

    EXPECT_FALSE(backend->apply("j", {child}, CpuSet(), false, &error));
    EXPECT_FALSE(error.empty());
    backend->remove("j");
    backend->stop();
}

TEST_F(BackendTest, ProcessHelpers) {
    // Our own start time agrees with /proc/self/stat read independently.
    auto own = mall::process_start_time(::getpid());
    ASSERT_TRUE(own.has_value());
    EXPECT_GT(*own, 0u);
    EXPECT_TRUE(mall::process_alive(::getpid()));
    EXPECT_FALSE(mall::process_start_time(0x7FFFFFF0).has_value());
    EXPECT_FALSE(mall::process_alive(0x7FFFFFF0));
    EXPECT_FALSE(mall::process_alive(0));

    // A command name with spaces and parentheses does not shift the fields.
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    pid_t odd = ::fork();
    if (odd == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        ::prctl(PR_SET_NAME, "x) 1 2 (y");
        char c = 1;
        if (::write(ready[1], &c, 1) != 1) ::_exit(1);
        for (;;) ::pause();
    }
    children_.push_back(odd);
    char c;
    ASSERT_EQ(::read(ready[0], &c, 1), 1);
    ::close(ready[0]);
    ::close(ready[1]);
    auto odd_start = mall::process_start_time(odd);
    ASSERT_TRUE(odd_start.has_value());
    EXPECT_GE(*odd_start, *own);  // started after us, in clock ticks since boot
    EXPECT_TRUE(mall::process_alive(odd));
    EXPECT_TRUE(mall::descendants_of(odd).empty());

    // descendants_of finds children and grandchildren, not the process itself.
    pid_t tree = spawn(1, /*grandchild=*/true);
    ASSERT_GT(tree, 0);
    auto below_us = mall::descendants_of(::getpid());
    EXPECT_NE(std::find(below_us.begin(), below_us.end(), tree), below_us.end());
    auto below_tree = mall::descendants_of(tree);
    ASSERT_EQ(below_tree.size(), 1u);
    EXPECT_NE(std::find(below_us.begin(), below_us.end(), below_tree[0]), below_us.end());
    EXPECT_EQ(std::find(below_tree.begin(), below_tree.end(), tree), below_tree.end());

    // threads_of lists the main thread and the extra ones.
    auto tids = mall::threads_of(tree);
    EXPECT_EQ(tids.size(), 2u);
    EXPECT_NE(std::find(tids.begin(), tids.end(), tree), tids.end());

    // A zombie (exited, not yet reaped) is not alive, though its /proc entry still exists.
    ::kill(odd, SIGKILL);
    for (int i = 0; i < 5000 && mall::process_alive(odd); ++i) ::usleep(1000);
    EXPECT_FALSE(mall::process_alive(odd));
    EXPECT_TRUE(exists("/proc/" + std::to_string(odd)));
    ::waitpid(odd, nullptr, 0);
    children_.erase(std::find(children_.begin(), children_.end(), odd));
    EXPECT_FALSE(mall::process_start_time(odd).has_value());
}

}  // namespace
