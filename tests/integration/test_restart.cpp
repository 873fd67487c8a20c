// SPDX-License-Identifier: BSD-3-Clause
// Proves that malld killed with SIGKILL and restarted on its state dir re-adopts the running jobs
// without changing any cpuset, that their processes reconnect by themselves, and that later
// changes still reach them.
#include <signal.h>

#include <map>
#include <memory>
#include <set>

#include <gtest/gtest.h>

#include "support/malld_fixture.hpp"

MALL_TEST_WATCHDOG(240);

namespace mall::test {
namespace {

using nlohmann::json;

// What a user can observe of a job, from status and from the kernel.
struct Observed {
    std::string cpus, cpuset, cgroup, cgroup_cpus;
    uint64_t generation = 0;
    std::vector<pid_t> pids;
    std::map<pid_t, std::map<pid_t, std::string>> threads;  // pid -> tid -> Cpus_allowed_list
};

std::map<std::string, Observed> observe(const json &status) {
    std::map<std::string, Observed> out;
    for (const auto &j : status["jobs"]) {
        Observed o;
        o.cpus = j.value("cpus", "");
        o.cpuset = j.value("cpuset", "");
        o.cgroup = j.value("cgroup", "");
        o.cgroup_cpus = cgroup_cpus(o.cgroup).value_or("(missing)");
        o.generation = j.value("generation", 0ull);
        o.pids = job_pids(j);
        for (pid_t pid : o.pids) o.threads[pid] = thread_cpus_allowed(pid);
        out[j.value("job", "")] = o;
    }
    return out;
}

// One line per job; threads are summarized by their distinct allowed lists (the library may start
// or end a helper thread while it reconnects; what matters is where threads may run).
std::string describe(const std::map<std::string, Observed> &jobs) {
    std::string text;
    for (const auto &[name, o] : jobs) {
        text += name + ": cpus=" + o.cpus + " cpuset=" + o.cpuset + " gen=" + std::to_string(o.generation) +
                " cgroup=" + o.cgroup + " (" + o.cgroup_cpus + ") threads allowed on:";
        for (const auto &[pid, threads] : o.threads) {
            std::set<std::string> lists;
            for (const auto &[tid, list] : threads) lists.insert(list);
            text += " " + std::to_string(pid) + "{";
            for (const auto &l : lists) text += l + ";";
            text += "}";
        }
        text += "\n";
    }
    return text;
}

TEST(Restart, KilledMalldReadoptsJobsWithoutChangingThem) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    MalldOptions options;
    options.ack_timeout_ms = 20000;  // the clients step every ms: a timeout would mean a lost ack
    PrivateMalld malld(options);
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;

    ChildOptions with_stderr;
    with_stderr.capture_stderr = true;  // libmall's lines about the lost and the regained connection
    Child a(mallrun_argv(malld.socket(), "1:2", "a", test_client_argv({"--threads", "2"})), with_stderr);
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "a", "0-1", 1); }, 20s))
        << status_text(malld);
    Child b(mallrun_argv(malld.socket(), "1:2", "b", test_client_argv({"--threads", "3"})));
    ASSERT_TRUE(wait_until(
        [&] {
            auto s = status_json(malld.socket());
            if (!s) return false;
            auto ja = find_job(*s, "a"), jb = find_job(*s, "b");
            return ja && jb && ja->value("ncpus", 0) == 1 && jb->value("ncpus", 0) == 1 &&
                   job_settled_on(malld.socket(), "a", ja->value("cpus", "?"), 1) &&
                   job_settled_on(malld.socket(), "b", jb->value("cpus", "?"), 1);
        },
        30s))
        << status_text(malld);
    // Let every thread settle on its job's cpus before taking the picture.
    ASSERT_TRUE(wait_until(
        [&] {
            auto s = status_json(malld.socket());
            if (!s) return false;
            for (const auto &[name, o] : observe(*s))
                if (!threads_all_on(o.pids, o.cpus) || o.cgroup_cpus != o.cpus) return false;
            return true;
        },
        10s));
    auto before_status = status_json(malld.socket());
    ASSERT_TRUE(before_status);
    const auto before = observe(*before_status);
    ASSERT_EQ(before.size(), 2u);

    // Crash: no chance to clean up. The jobs keep running in their cgroups.
    const pid_t old_pid = malld.pid();
    malld.kill9();
    ASSERT_TRUE(malld.restart(&error)) << error;
    EXPECT_NE(malld.pid(), old_pid);

    auto after_status = status_json(malld.socket());
    ASSERT_TRUE(after_status);
    const auto after = observe(*after_status);
    EXPECT_EQ(describe(after), describe(before))
        << "restart changed jobs, allocations, generations, cgroups or thread masks";
    for (const auto &[name, o] : before) {
        auto it = after.find(name);
        ASSERT_NE(it, after.end()) << name << " was not re-adopted:\n" << after_status->dump(1);
        EXPECT_EQ(it->second.cpus, o.cpus) << name;
        EXPECT_EQ(it->second.cpuset, o.cpuset) << name;
        EXPECT_EQ(it->second.generation, o.generation) << name;
        EXPECT_EQ(it->second.pids, o.pids) << name;
        EXPECT_EQ(it->second.cgroup, o.cgroup) << name;
        EXPECT_EQ(it->second.cgroup_cpus, o.cgroup_cpus) << name;
        for (const auto &[pid, threads] : o.threads) {
            auto now = it->second.threads.find(pid);
            ASSERT_NE(now, it->second.threads.end()) << name << ": process " << pid << " is gone";
            for (const auto &[tid, list] : threads) {
                auto t = now->second.find(tid);
                if (t != now->second.end()) {
                    EXPECT_EQ(t->second, list) << name << " thread " << tid;
                }
            }
        }
    }
    EXPECT_EQ(after_status->value("pool", ""), before_status->value("pool", ""));
    EXPECT_EQ(after_status->value("policy", ""), before_status->value("policy", ""));

    // The processes reconnect by themselves, and re-adoption still changed nothing.
    ASSERT_TRUE(wait_until(
        [&] {
            auto s = status_json(malld.socket());
            if (!s) return false;
            for (const char *name : {"a", "b"}) {
                auto j = find_job(*s, name);
                if (!j || j->value("attached", 0) != 1) return false;
            }
            return true;
        },
        30s))
        << "the clients did not re-attach:\n" << status_text(malld);
    auto reattached = status_json(malld.socket());
    ASSERT_TRUE(reattached);
    EXPECT_EQ(describe(observe(*reattached)), describe(before));
    EXPECT_TRUE(a.exited() == false && b.exited() == false);
    // The process was told, once each, on its stderr: runs on not malleable, then malleable again.
    auto told = [&](const std::string &words) {
        int n = 0;
        for (const auto &l : a.all_lines())
            if (l.rfind("mall: " + words, 0) == 0 && l.find("(job a, malld at " + malld.socket()) != std::string::npos) ++n;
        return n;
    };
    EXPECT_TRUE(wait_until([&] { return told("reconnected to malld: malleable again") == 1; }, 10s));
    EXPECT_EQ(told("lost the connection to malld: this process keeps its cpus and runs on, not malleable"), 1);

    // A later change still reaches the re-attached processes, and they ack it through the new
    // connection: b ends, a grows to the whole pool; then an admin pins a back to one cpu.
    const std::string a_cpu = before.at("a").cpus;
    ASSERT_EQ(before.at("b").pids.size(), 1u);
    ASSERT_EQ(::kill(before.at("b").pids[0], SIGTERM), 0);
    EXPECT_EQ(b.wait_exit(20s), 0);
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "a", "0-1", 1); }, 20s))
        << status_text(malld);
    EXPECT_TRUE(a.wait_for_line([](const std::string &l) { return l.find("cpus=0-1") != std::string::npos; }, 10s));

    auto set = run_command(mallctl_argv(malld.socket(), {"set", "a", "--cpus", a_cpu}));
    ASSERT_EQ(set.exit_code, 0) << set.out << set.err;
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "a", a_cpu, 1); }, 20s))
        << status_text(malld);
    EXPECT_TRUE(a.wait_for_line(
        [&](const std::string &l) { return l.find("ncpus=1 cpus=" + a_cpu) != std::string::npos; }, 10s));
    auto ja = job_status(malld.socket(), "a");
    ASSERT_TRUE(ja);
    EXPECT_EQ(ja->value("ack_timeouts", -1), 0) << "acks did not arrive over the new connection: " << ja->dump();
    EXPECT_GT(ja->value("generation", 0ull), before.at("a").generation);
    auto pids_a = job_pids(*ja);
    EXPECT_TRUE(wait_until([&] { return threads_all_on(pids_a, a_cpu); }, 10s)) << describe_threads(pids_a);
    EXPECT_EQ(cgroup_cpus(ja->value("cgroup", "")).value_or("(missing)"), a_cpu);
}

// Starts `malld` with one job "a" (min 1, max 2) under mallrun, alone on the pool: settled on 0-1.
void start_with_lone_job(PrivateMalld &malld, std::unique_ptr<Child> *a) {
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;
    *a = std::make_unique<Child>(mallrun_argv(malld.socket(), "1:2", "a", test_client_argv()));
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "a", "0-1", 1); }, 20s))
        << status_text(malld);
}

TEST(Restart, CleanStopKeepsStateAndRestartReadopts) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    PrivateMalld malld;
    std::unique_ptr<Child> a;
    ASSERT_NO_FATAL_FAILURE(start_with_lone_job(malld, &a));
    std::string error;
    auto before = job_status(malld.socket(), "a");
    ASSERT_TRUE(before);

    // SIGTERM: a clean stop keeps the state file, so the running job is re-adopted as it was.
    EXPECT_EQ(malld.stop(), 0);
    EXPECT_EQ(cgroup_cpus(before->value("cgroup", "")).value_or("(missing)"), "0-1")
        << "a clean stop must leave a running job's cgroup alone";
    ASSERT_TRUE(malld.restart(&error)) << error;
    auto after = job_status(malld.socket(), "a");
    ASSERT_TRUE(after) << status_text(malld);
    EXPECT_EQ(after->value("cpus", ""), "0-1");
    EXPECT_EQ(after->value("generation", 0ull), before->value("generation", 0ull));
    EXPECT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "a", "0-1", 1); }, 30s))
        << status_text(malld);
}

// Accounting across restarts, as an admin reads it: a job of min 1 on the two-cpu pool is lent one
// cpu, so its lent core-seconds follow its duration, once — a restart neither counts the time
// before the last save twice nor loses it.
double lent_seconds(const json &job) { return job.value("lent_core_seconds", -1.0); }
double duration_seconds(const json &job) { return job.value("duration_seconds", -1.0); }

TEST(Restart, AccountingCountsTheTimeBeforeACleanStopOnce) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    PrivateMalld malld;
    std::unique_ptr<Child> a;
    ASSERT_NO_FATAL_FAILURE(start_with_lone_job(malld, &a));
    std::string error;
    // Time passes with no change, so nothing is saved until the stop.
    ASSERT_TRUE(wait_until([&] { auto j = job_status(malld.socket(), "a"); return j && lent_seconds(*j) >= 3; }, 20s))
        << status_text(malld);
    EXPECT_EQ(malld.stop(), 0);
    ASSERT_TRUE(malld.restart(&error)) << error;
    auto after = job_status(malld.socket(), "a");
    ASSERT_TRUE(after) << status_text(malld);
    EXPECT_GE(lent_seconds(*after), 3) << after->dump();
    // One cpu lent all along: the lent core-seconds are the duration, up to the moments between
    // registration and the first growth, and between the two reads.
    EXPECT_LE(lent_seconds(*after), duration_seconds(*after) + 0.5) << "counted twice: " << after->dump();
    EXPECT_LE(after->value("core_seconds", -1.0), 2 * duration_seconds(*after) + 0.5) << "counted twice: " << after->dump();
}

TEST(Restart, CheckpointsKeepTheAccountingOfAJobThatEndsWhileMalldIsDown) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    MalldOptions options;
    options.extra_args = {"--checkpoint-interval", "1"};
    PrivateMalld malld(options);
    std::unique_ptr<Child> a;
    ASSERT_NO_FATAL_FAILURE(start_with_lone_job(malld, &a));
    std::string error;
    ASSERT_TRUE(wait_until([&] { auto j = job_status(malld.socket(), "a"); return j && lent_seconds(*j) >= 5; }, 20s))
        << status_text(malld);

    auto running = job_status(malld.socket(), "a");
    ASSERT_TRUE(running);
    const auto pids = job_pids(*running);
    ASSERT_EQ(pids.size(), 1u) << running->dump();

    // malld dies with no chance to save; the job ends while it is down.
    malld.kill9();
    ASSERT_EQ(::kill(pids[0], SIGTERM), 0);
    EXPECT_EQ(a->wait_exit(20s), 0);
    ASSERT_TRUE(malld.restart(&error)) << error;
    EXPECT_FALSE(job_status(malld.socket(), "a")) << "the ended job was re-adopted:\n" << status_text(malld);

    auto history = run_command(mallctl_argv(malld.socket(), {"history", "--job", "a", "--json"}));
    ASSERT_EQ(history.exit_code, 0) << history.out << history.err;
    auto records = json::parse(history.out, nullptr, false);
    ASSERT_TRUE(records.is_array() && records.size() == 1) << history.out;
    // Checkpoints come every second: the last one on disk is at most a second and a loop turn
    // (and a write) older than the kill; without them the record holds about 0 (the last change).
    EXPECT_GE(lent_seconds(records[0]), 3) << "accounting since the last change was lost: " << records[0].dump();
    EXPECT_LE(lent_seconds(records[0]), duration_seconds(records[0]) + 0.5) << records[0].dump();
}

}  // namespace
}  // namespace mall::test
