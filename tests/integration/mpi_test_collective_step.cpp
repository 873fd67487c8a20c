// SPDX-License-Identifier: BSD-3-Clause
// Proves, with real Open MPI (mpirun --bind-to none) over private mallds (one per modelled node, all
// on this machine's cpus 0-1), that mall_mpi applies a change of one rank's allocation on every rank
// at the same step (2 and 4 ranks), that balanced mode caps the other ranks, lends their surplus
// cores to a second job and takes them back, that unbalanced mode leaves each rank its own count,
// and that a killed rank fails the job the MPI way while malld returns every core.
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "support/malld_fixture.hpp"

MALL_TEST_WATCHDOG(590);

#ifndef MALL_MPIEXEC
#define MALL_MPIEXEC "mpirun"
#endif

namespace mall::test {
namespace {

using nlohmann::json;

// "rank R change step S threads A -> B share N cap C sharers K cpus L" (mall_train_mpi --log-changes)
struct Change {
    int rank = -1, step = -1, from = -1, to = -1, share = -1, cap = -1, sharers = -1;
    std::string cpus;
};

std::optional<Change> parse_change(const std::string &line) {
    static const std::regex re(
        R"(^rank (\d+) change step (\d+) threads (\d+) -> (\d+) share (\d+) cap (\d+) sharers (\d+) cpus (\S+)$)");
    std::smatch m;
    if (!std::regex_match(line, m, re)) return std::nullopt;
    return Change{std::stoi(m[1]), std::stoi(m[2]), std::stoi(m[3]), std::stoi(m[4]),
                  std::stoi(m[5]), std::stoi(m[6]), std::stoi(m[7]), m[8]};
}

std::string joined(const std::vector<std::string> &lines, size_t last = 80) {
    std::string s;
    for (size_t i = lines.size() > last ? lines.size() - last : 0; i < lines.size(); ++i) s += lines[i] + "\n";
    return s;
}

// Processes whose command line mentions `token` (the run's private folder): what must not outlive
// the run. mpirun puts each rank in its own process group, so the Child's group kill misses them.
std::vector<pid_t> processes_mentioning(const std::string &token) {
    std::vector<pid_t> found;
    DIR *proc = opendir("/proc");
    if (proc == nullptr) return found;
    while (dirent *e = readdir(proc)) {
        char *end = nullptr;
        const long pid = std::strtol(e->d_name, &end, 10);
        if (*end != '\0' || pid <= 0 || pid == getpid()) continue;
        std::string cmdline = read_file("/proc/" + std::string(e->d_name) + "/cmdline");
        std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
        const std::string stat = read_file("/proc/" + std::string(e->d_name) + "/stat");
        const auto paren = stat.rfind(')');
        const bool zombie = paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z';
        if (!zombie && cmdline.find(token) != std::string::npos) found.push_back(static_cast<pid_t>(pid));
    }
    closedir(proc);
    return found;
}

// A multi-rank mall_train_mpi run: `nodes` private mallds (pool 0-1 each), rank r registered by
// mallrun (--malleable=1:2, job "rank<r>") at the malld of node r % nodes.
class MpiRun {
public:
    MpiRun(int ranks, int nodes, std::vector<std::string> trainer_options = {}) : ranks_(ranks) {
        char dir_template[] = "/tmp/mall-mpi-test.XXXXXX";
        if (mkdtemp(dir_template) != nullptr) dir_ = dir_template;
        for (int n = 0; n < nodes; ++n) {
            MalldOptions options;
            options.ack_timeout_ms = 20000;  // ranks step every millisecond or so: every change is acked
            nodes_.push_back(std::make_unique<PrivateMalld>(options));
        }
        trainer_options_ = std::move(trainer_options);
    }
    ~MpiRun() {
        if (mpirun_ && !mpirun_->exited()) {
            (void)stop(20s);
            mpirun_.reset();  // SIGTERM to mpirun's group, SIGKILL after 3 s
        }
        mpirun_.reset();
        borrowers_.clear();
        // Ranks and mallruns whose mpirun is gone; they stop by themselves (--max-seconds), but a
        // test leaves nothing behind.
        wait_until([&] { return processes_mentioning(dir_).empty(); }, 5s);
        for (pid_t pid : processes_mentioning(dir_)) ::kill(pid, SIGKILL);
        wait_until([&] { return processes_mentioning(dir_).empty(); }, 5s);
        nodes_.clear();
        if (!dir_.empty()) std::system(("rm -rf '" + dir_ + "'").c_str());
    }

    const std::string &dir() const { return dir_; }
    PrivateMalld &node(int n) { return *nodes_.at(static_cast<size_t>(n)); }
    PrivateMalld &node_of(int rank) { return node(rank % static_cast<int>(nodes_.size())); }
    std::string job(int rank) const { return "rank" + std::to_string(rank); }
    Child &mpirun() { return *mpirun_; }

    // Starts the mallds, then mpirun; waits until every rank holds 0-1, settled, and has applied
    // its first allocation.
    bool start(std::string *error) {
        if (dir_.empty()) return *error = "mkdtemp failed", false;
        for (auto &n : nodes_)
            if (!n->start(error)) return false;
        std::string script =
            "i=$OMPI_COMM_WORLD_RANK; eval \"s=\\$MPI_TEST_SOCKET_$i\"; exec " + bin_path("mallrun") +
            " --socket \"$s\" --malleable=1:2 --job rank$i -- \"$@\"";
        std::vector<std::string> argv = {MALL_MPIEXEC, "--bind-to", "none", "--oversubscribe",
                                         "-np", std::to_string(ranks_)};
        ChildOptions options;
        options.capture_stderr = true;
        options.env = {{"OMPI_ALLOW_RUN_AS_ROOT", "1"}, {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"},
                       {"OMPI_MCA_mpi_yield_when_idle", "1"}};  // ranks share 2 cpus: do not spin
        for (int r = 0; r < ranks_; ++r) {
            const std::string name = "MPI_TEST_SOCKET_" + std::to_string(r);
            options.env.emplace_back(name, node_of(r).socket());
            argv.insert(argv.end(), {"-x", name});
        }
        argv.insert(argv.end(), {"sh", "-c", script, "sh", bin_path("mall_train_mpi"), "--steps", "100000000",
                                 "--hidden", "64", "--batch", "64", "--print-every", "0", "--log-changes",
                                 "--stop-file", dir_ + "/stop", "--max-seconds", "300"});
        argv.insert(argv.end(), trainer_options_.begin(), trainer_options_.end());
        mpirun_ = std::make_unique<Child>(argv, options);
        if (!mpirun_->started()) return *error = "mpirun could not be started", false;
        for (int r = 0; r < ranks_; ++r) {
            if (!wait_until([&] { return job_settled_on(node_of(r).socket(), job(r), "0-1", 1); }, 60s))
                return *error = "rank " + std::to_string(r) + " did not settle on 0-1:\n" +
                                status_text(node_of(r)) + joined(mpirun_->all_lines()),
                       false;
        }
        if (!wait_until([&] { return current_threads_all(2); }, 60s))
            return *error = "the ranks did not all start with 2 threads:\n" + joined(mpirun_->all_lines()), false;
        return true;
    }

    // Every change line so far, by rank.
    std::map<int, std::vector<Change>> changes() const {
        std::map<int, std::vector<Change>> by_rank;
        for (const auto &line : mpirun_->all_lines())
            if (auto c = parse_change(line)) by_rank[c->rank].push_back(*c);
        return by_rank;
    }
    // The thread count each rank applied last (-1 before its first change).
    int current_threads(int rank) const {
        auto all = changes();
        auto it = all.find(rank);
        return it == all.end() || it->second.empty() ? -1 : it->second.back().to;
    }
    bool current_threads_all(int threads) const {
        for (int r = 0; r < ranks_; ++r)
            if (current_threads(r) != threads) return false;
        return true;
    }
    // True when every rank logged changes at the same steps, with the same thread counts unless
    // each rank runs its own count (unbalanced).
    bool same_steps_everywhere(std::string *why, bool same_counts = true) const {
        auto all = changes();
        auto key = [same_counts](const std::vector<Change> &v) {
            std::vector<std::pair<int, int>> k;
            for (const auto &c : v) k.emplace_back(c.step, same_counts ? c.to : 0);
            return k;
        };
        for (int r = 1; r < ranks_; ++r) {
            if (key(all[r]) != key(all[0])) {
                *why = "rank " + std::to_string(r) + "'s changes differ from rank 0's";
                return false;
            }
        }
        return true;
    }
    // same_steps_everywhere() once the ranks' output has caught up (10 s at most): each rank's
    // line for one step reaches mpirun's output on its own, so right after one rank's line is read
    // another's may still be on its way (seen under ThreadSanitizer, which slows the ranks down).
    bool same_steps_soon(std::string *why, bool same_counts = true) const {
        return wait_until([&] { return same_steps_everywhere(why, same_counts); }, 10s);
    }

    std::optional<json> job_entry(int rank) { return job_status(node_of(rank).socket(), job(rank)); }
    int usage_cap(int rank) {
        auto j = job_entry(rank);
        return j ? j->value("usage_cap", -1) : -1;
    }
    std::string cpus(int rank) {
        auto j = job_entry(rank);
        return j ? j->value("cpus", std::string("?")) : "gone";
    }
    bool settled_on_one(int rank) {
        auto j = job_entry(rank);
        return j && j->value("ncpus", 0) == 1 && job_settled_on(node_of(rank).socket(), job(rank), cpus(rank));
    }
    std::vector<pid_t> pids(int rank) {
        auto j = job_entry(rank);
        return j ? job_pids(*j) : std::vector<pid_t>{};
    }

    // Asks rank 0 to stop (all ranks stop at one step) and waits for mpirun's exit code.
    std::optional<int> stop(Millis timeout = 60s) {
        std::ofstream(dir_ + "/stop").put('\n');
        return mpirun_->wait_exit(timeout);
    }

    // A second job on a node: mall_test_client through mallrun --malleable=1:2.
    Child &start_borrower(int node_index, const std::string &name) {
        borrowers_.push_back(std::make_unique<Child>(mallrun_argv(node(node_index).socket(), "1:2", name,
                                                                  test_client_argv({"--step-us", "1000"}))));
        return *borrowers_.back();
    }
    void stop_borrowers() { borrowers_.clear(); }

private:
    int ranks_;
    std::string dir_;
    std::vector<std::unique_ptr<PrivateMalld>> nodes_;
    std::vector<std::string> trainer_options_;
    std::unique_ptr<Child> mpirun_;
    std::vector<std::unique_ptr<Child>> borrowers_;
};

void set_cpus(PrivateMalld &node, const std::string &job, const std::string &cpus) {
    auto r = run_command(mallctl_argv(node.socket(), {"set", job, "--cpus", cpus}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
}

// The end of a run: every rank trained to the same weights, and no malld lists a job.
void expect_clean_finish(MpiRun &run, int ranks) {
    auto code = run.stop();
    ASSERT_TRUE(code.has_value()) << "mpirun did not end after the stop file\n" << joined(run.mpirun().all_lines());
    EXPECT_EQ(*code, 0) << joined(run.mpirun().all_lines());
    const std::regex final_re(R"(^rank (\d+) final loss (\S+) first_loss (\S+) test_accuracy (\S+) checksum ([0-9a-f]+)$)");
    std::map<int, std::string> checksums;
    for (const auto &line : run.mpirun().all_lines()) {
        std::smatch m;
        if (!std::regex_match(line, m, final_re)) continue;
        checksums[std::stoi(m[1])] = m[5];
        EXPECT_LT(std::stod(m[2]), std::stod(m[3])) << "the loss did not go down: " << line;
    }
    ASSERT_EQ(static_cast<int>(checksums.size()), ranks) << joined(run.mpirun().all_lines());
    if (std::getenv("MALL_MPI_TEST_VERBOSE") != nullptr) std::fprintf(stderr, "%s", joined(run.mpirun().all_lines()).c_str());
    for (const auto &[rank, sum] : checksums) EXPECT_EQ(sum, checksums.begin()->second) << "rank " << rank;
    for (int r = 0; r < ranks; ++r)
        EXPECT_TRUE(wait_until([&] { return !run.job_entry(r); }, 20s)) << status_text(run.node_of(r));
}

// One rank's allocation changes (an admin shrinks it, then gives it back): every rank applies the
// job-wide count at the same step.
void shrink_and_grow_back(int ranks) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    MpiRun run(ranks, ranks);
    std::string error;
    ASSERT_TRUE(run.start(&error)) << error;
    const int shrunk = ranks - 1;

    set_cpus(run.node_of(shrunk), run.job(shrunk), "0");
    ASSERT_TRUE(wait_until([&] { return run.current_threads_all(1); }, 60s))
        << "not every rank dropped to 1 thread\n" << joined(run.mpirun().all_lines());
    std::string why;
    EXPECT_TRUE(run.same_steps_soon(&why)) << why << "\n" << joined(run.mpirun().all_lines());
    // Balanced mode: every other rank now uses 1 cpu and told its malld so.
    for (int r = 0; r < ranks; ++r) {
        if (r == shrunk) continue;
        EXPECT_TRUE(wait_until([&] { return run.usage_cap(r) == 1 && run.settled_on_one(r); }, 30s))
            << "rank " << r << ": " << status_text(run.node_of(r));
    }

    set_cpus(run.node_of(shrunk), run.job(shrunk), "auto");
    ASSERT_TRUE(wait_until([&] { return run.current_threads_all(2); }, 60s))
        << "the ranks did not all return to 2 threads\n" << joined(run.mpirun().all_lines());
    EXPECT_TRUE(run.same_steps_soon(&why)) << why << "\n" << joined(run.mpirun().all_lines());
    for (int r = 0; r < ranks; ++r)
        EXPECT_TRUE(wait_until([&] { return job_settled_on(run.node_of(r).socket(), run.job(r), "0-1", 1); }, 30s))
            << "rank " << r << ": " << status_text(run.node_of(r));
    // Every rank logged: the first allocation, the drop to 1 and the return to 2 (the caps add
    // steps where only the cpus change), at identical steps.
    for (const auto &[rank, list] : run.changes()) {
        std::vector<int> counts;
        for (const auto &c : list)
            if (counts.empty() || counts.back() != c.to) counts.push_back(c.to);
        EXPECT_EQ(counts, (std::vector<int>{2, 1, 2})) << "rank " << rank;
    }
    expect_clean_finish(run, ranks);
}

TEST(MpiCollectiveStep, TwoRanksChangeAtTheSameStep) { shrink_and_grow_back(2); }

// mallctl set --threads on one rank's node job: that rank keeps its cpus but counts 1 thread, so
// in balanced mode every rank runs 1 at the same step and the other rank's malld lends its surplus
// (usage cap 1); --threads auto brings the job back to 2 everywhere.
TEST(MpiCollectiveStep, AThreadCountOnOneRankBalancesTheJob) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    MpiRun run(2, 2);
    std::string error;
    ASSERT_TRUE(run.start(&error)) << error;
    auto set = run_command(mallctl_argv(run.node(0).socket(), {"set", "rank0", "--threads", "1"}));
    ASSERT_EQ(set.exit_code, 0) << set.err;
    ASSERT_TRUE(wait_until([&] { return run.current_threads_all(1); }, 60s))
        << "not every rank dropped to 1 thread\n" << joined(run.mpirun().all_lines());
    std::string why;
    EXPECT_TRUE(run.same_steps_soon(&why)) << why << "\n" << joined(run.mpirun().all_lines());
    EXPECT_EQ(run.cpus(0), "0-1") << "the thread count must not take rank 0's cpus";
    EXPECT_TRUE(wait_until([&] { return run.usage_cap(1) == 1 && run.settled_on_one(1); }, 30s))
        << status_text(run.node(1));

    set = run_command(mallctl_argv(run.node(0).socket(), {"set", "rank0", "--threads", "auto"}));
    ASSERT_EQ(set.exit_code, 0) << set.err;
    ASSERT_TRUE(wait_until([&] { return run.current_threads_all(2); }, 60s))
        << "the ranks did not all return to 2 threads\n" << joined(run.mpirun().all_lines());
    for (int r = 0; r < 2; ++r)
        EXPECT_TRUE(wait_until([&] { return job_settled_on(run.node(r).socket(), run.job(r), "0-1", 1); }, 30s))
            << status_text(run.node(r));
    EXPECT_TRUE(run.same_steps_soon(&why)) << why << "\n" << joined(run.mpirun().all_lines());
    expect_clean_finish(run, 2);
}

TEST(MpiCollectiveStep, FourRanksChangeAtTheSameStep) { shrink_and_grow_back(4); }

// Balanced mode: rank 0 shrinks; rank 1 caps itself to 1 cpu, its malld lists the other cpu as free
// and reclaims it at once when rank 0 grows back. The second time a borrower job takes the free
// cpu; when rank 0 grows back rank 1 keeps its fair share (the borrower keeps its minimum) and the
// job stays at 1 thread, rank 0 now capping itself, until the borrower ends.
TEST(MpiCollectiveStep, BalancedModeLendsTheSurplusAndTakesItBack) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    MpiRun run(2, 2);
    std::string error;
    ASSERT_TRUE(run.start(&error)) << error;
    std::string why;

    // 1. Shrink, free, reclaim.
    set_cpus(run.node(0), "rank0", "0");
    ASSERT_TRUE(wait_until([&] { return run.current_threads_all(1); }, 60s)) << joined(run.mpirun().all_lines());
    ASSERT_TRUE(wait_until([&] { return run.usage_cap(1) == 1 && run.settled_on_one(1); }, 30s))
        << status_text(run.node(1));
    const std::string kept = run.cpus(1), lent = kept == "0" ? "1" : "0";
    auto status = status_json(run.node(1).socket());
    ASSERT_TRUE(status);
    EXPECT_EQ(status->value("free", std::string("?")), lent) << status->dump(1);
    const auto rank1_pids = run.pids(1);
    EXPECT_TRUE(wait_until([&] { return threads_all_on(rank1_pids, kept); }, 10s)) << describe_threads(rank1_pids);

    set_cpus(run.node(0), "rank0", "auto");
    ASSERT_TRUE(wait_until([&] { return run.current_threads_all(2); }, 60s)) << joined(run.mpirun().all_lines());
    EXPECT_TRUE(wait_until([&] { return job_settled_on(run.node(1).socket(), "rank1", "0-1", 1); }, 30s))
        << status_text(run.node(1));
    EXPECT_TRUE(wait_until([&] { return threads_all_on(rank1_pids, "0-1"); }, 10s)) << describe_threads(rank1_pids);
    EXPECT_TRUE(run.same_steps_soon(&why)) << why;

    // 2. Shrink again; a borrower on rank 1's node takes the lent cpu.
    set_cpus(run.node(0), "rank0", "0");
    ASSERT_TRUE(wait_until([&] { return run.current_threads_all(1); }, 60s)) << joined(run.mpirun().all_lines());
    ASSERT_TRUE(wait_until([&] { return run.usage_cap(1) == 1 && run.settled_on_one(1); }, 30s))
        << status_text(run.node(1));
    const std::string kept2 = run.cpus(1), lent2 = kept2 == "0" ? "1" : "0";
    Child &borrower = run.start_borrower(1, "borrower");
    ASSERT_TRUE(wait_until([&] { return job_settled_on(run.node(1).socket(), "borrower", lent2, 1); }, 30s))
        << "the borrower did not get the lent cpu " << lent2 << "\n" << status_text(run.node(1));
    EXPECT_EQ(run.cpus(1), kept2) << "rank 1 must keep its cpu while the borrower holds the other";
    auto borrower_job = job_status(run.node(1).socket(), "borrower");
    ASSERT_TRUE(borrower_job);
    const auto borrower_pids = job_pids(*borrower_job);
    EXPECT_TRUE(wait_until([&] { return threads_all_on(borrower_pids, lent2); }, 10s)) << describe_threads(borrower_pids);
    (void)borrower;

    // Rank 0 grows back: rank 1 lifts its cap, but the borrower keeps its minimum, so rank 1 stays
    // on one cpu and the job at 1 thread; rank 0 caps itself and its malld frees a cpu.
    set_cpus(run.node(0), "rank0", "auto");
    EXPECT_TRUE(wait_until([&] { return run.usage_cap(1) == 2; }, 30s)) << status_text(run.node(1));
    EXPECT_TRUE(wait_until([&] { return run.usage_cap(0) == 1 && run.settled_on_one(0); }, 30s))
        << status_text(run.node(0));
    EXPECT_TRUE(run.current_threads_all(1)) << joined(run.mpirun().all_lines());

    // The borrower ends: rank 1 takes its cpu back, rank 0 lifts its cap, the job returns to 2.
    run.stop_borrowers();
    ASSERT_TRUE(wait_until([&] { return run.current_threads_all(2); }, 60s)) << joined(run.mpirun().all_lines());
    for (int r = 0; r < 2; ++r)
        EXPECT_TRUE(wait_until([&] { return job_settled_on(run.node(r).socket(), run.job(r), "0-1", 1); }, 30s))
            << status_text(run.node(r));
    EXPECT_TRUE(run.same_steps_soon(&why)) << why << "\n" << joined(run.mpirun().all_lines());
    expect_clean_finish(run, 2);
}

// Unbalanced mode: the shrunk rank runs 1 thread, the other keeps 2 and sets no cap; the change
// is still applied by every rank at one step.
TEST(MpiCollectiveStep, UnbalancedModeKeepsEachRanksOwnCount) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    MpiRun run(2, 2, {"--unbalanced"});
    std::string error;
    ASSERT_TRUE(run.start(&error)) << error;
    set_cpus(run.node(0), "rank0", "0");
    ASSERT_TRUE(wait_until([&] { return run.current_threads(0) == 1; }, 60s)) << joined(run.mpirun().all_lines());
    std::string why;
    EXPECT_TRUE(run.same_steps_soon(&why, false)) << joined(run.mpirun().all_lines());
    const auto rank1 = run.changes()[1];
    ASSERT_FALSE(rank1.empty());
    EXPECT_EQ(rank1.back().to, 2);
    EXPECT_EQ(rank1.back().step, run.changes()[0].back().step);
    EXPECT_EQ(run.usage_cap(1), 0) << status_text(run.node(1));
    EXPECT_EQ(run.cpus(1), "0-1");
    expect_clean_finish(run, 2);
}

// A rank killed mid-run: mpirun fails the job (non-zero exit), the other rank ends, both mallds
// return every cpu and list no job, and no process of the run is left.
TEST(MpiCollectiveStep, KilledRankFailsTheJobAndFreesEveryCore) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    MpiRun run(2, 2);
    std::string error;
    ASSERT_TRUE(run.start(&error)) << error;
    const auto victims = run.pids(1);
    ASSERT_EQ(victims.size(), 1u) << status_text(run.node(1));
    ASSERT_EQ(::kill(victims[0], SIGKILL), 0);
    auto code = run.mpirun().wait_exit(90s);
    ASSERT_TRUE(code.has_value()) << "mpirun did not end after rank 1 was killed\n" << joined(run.mpirun().all_lines());
    EXPECT_NE(*code, 0) << joined(run.mpirun().all_lines());
    for (int n = 0; n < 2; ++n) {
        EXPECT_TRUE(wait_until(
            [&] {
                auto s = status_json(run.node(n).socket());
                return s && (*s)["jobs"].empty() && s->value("free", std::string()) == "0-1";
            },
            30s))
            << status_text(run.node(n));
    }
    EXPECT_TRUE(wait_until([&] { return processes_mentioning(run.dir()).empty(); }, 30s))
        << "left running: " << testing::PrintToString(processes_mentioning(run.dir()));
}

}  // namespace
}  // namespace mall::test
