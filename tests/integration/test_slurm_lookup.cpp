// SPDX-License-Identifier: BSD-3-Clause
// Proves malld's Reclaim by owner (what a Slurm job prolog sends: no cpus, malld looks the job up
// in Slurm) reserves the Linux cpus of the job's Slurm cores on SMT and interleaved nodes (issue 12,
// defect 4: it reserved Slurm's ids as if they were Linux cpus); and that malld asks slurmctld
// nothing about a job whose step sockets slurmd's spool shows (issue 39), asks about one that
// vanished from it and releases it when Slurm has ended it (with no AdminComment update then);
// and that an admin's Record (`mallctl record`, issue 39: figures reach Slurm "on demand") writes
// a running Slurm job's figures so far and is answered once slurmctld took them, and is refused
// with words, changing nothing, for other jobs, other users and a malld without --slurm.
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <sys/socket.h>
#include <sys/un.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "common/ctl_client.hpp"
#include "daemon/backend.hpp"
#include "daemon/core/topology.hpp"
#include "daemon/server.hpp"
#include "daemon/slurm_jobs.hpp"
#include "daemon/slurmd_spool.hpp"
#include "support/malld_fixture.hpp"

MALL_TEST_WATCHDOG(60);

namespace mall::test {
namespace {

// Two packages x four cores x two threads; core k of package p = Linux cpus 2k+p and 2k+p+8.
const std::string kInterleavedXml = std::string(MALL_SOURCE_DIR) + "/tests/data/topology-2pack-4core-2pu-interleaved.xml";

// Slurm as libslurm answers malld for one running job: its abstract core ids on this node (what
// slurm_job_cpus_allocated_str_on_node gives malld) and Slurm's description of the node.
class FakeSlurm final : public SlurmQuery {
public:
    FakeSlurm(uint32_t job, std::string cores, SlurmNodeShape node)
        : job_(job), cores_(std::move(cores)), node_(node) {}
    SlurmJobState query(uint32_t id) override {
        SlurmJobState s;
        s.job_id = id;
        ++queries;
        if (id != job_ || ended) {
            s.kind = SlurmJobState::Kind::NotRunning;
            s.detail = "unknown to slurmctld";
            return s;
        }
        s.kind = SlurmJobState::Kind::Running;
        s.uid = ::getuid();
        s.detail = "RUNNING";
        s.slurm_cores = CpuSet::parse(cores_);
        s.slurm_node = node_;
        return s;
    }
    // As slurmctld takes a while (annotate_delay: a slow slurmctld simulated, not a wait): the
    // Deregister's answer must wait for it. annotated_at is when the update ended.
    Annotated annotate(uint32_t id, const std::string &figures, mall::CommentChain *) override {
        ++annotate_calls;
        std::this_thread::sleep_for(annotate_delay);
        std::lock_guard<std::mutex> lock(mu);
        annotated.push_back(std::to_string(id) + " " + figures);
        annotated_at = std::chrono::steady_clock::now();
        return annotate_answer;
    }
    // malld's thread destroys the fake (with the Server) after the test read `annotated` under
    // `mu`: taking it here orders that read before the destruction (ThreadSanitizer sees no order
    // in the SIGTERM that stops the server).
    ~FakeSlurm() override { std::lock_guard<std::mutex> lock(mu); }
    uid_t slurmd_uid() const override { return ::getuid(); }  // the test's spool folder is its own
    std::chrono::milliseconds annotate_delay{0};
    std::atomic<int> queries{0};     // what slurmctld was asked (each a REQUEST_JOB_INFO_SINGLE)
    std::atomic<bool> ended{false};  // Slurm has ended the job
    std::mutex mu;
    std::vector<std::string> annotated;
    std::chrono::steady_clock::time_point annotated_at{};
    std::atomic<int> annotate_calls{0};  // updates begun (the one in flight included)
    Annotated annotate_answer;           // what slurmctld answers each update (default: taken)

private:
    uint32_t job_;
    std::string cores_;
    SlurmNodeShape node_;
};

// malld's server in this process, on a private socket, with the affinity backend (no cgroups) and
// a fake Slurm; served on its own thread until the destructor stops it with SIGTERM.
class InProcessMalld {
public:
    InProcessMalld(const std::string &topology_spec, std::unique_ptr<SlurmQuery> slurm,
                   std::chrono::seconds interval = std::chrono::seconds(3600),
                   std::optional<SlurmdSpool> spool = std::nullopt) {
        char tmpl[] = "/tmp/mall_test_slurm_lookup_XXXXXX";
        if (char *d = ::mkdtemp(tmpl)) dir_ = d;
        socket_ = dir_ + "/malld.sock";
        std::promise<std::string> started;
        auto ready = started.get_future();
        thread_ = std::thread([this, topology_spec, &started, interval, query = std::move(slurm),
                               spool = std::move(spool)]() mutable {
            std::string error;
            auto topology = Topology::load(topology_spec, &error);
            std::string why;
            auto backend = topology ? make_backend(BackendKind::Affinity, "mall", &why, &error) : nullptr;
            if (!topology || !backend) {
                started.set_value("cannot set up: " + error);
                return;
            }
            ServerOptions options;
            options.socket_path = socket_;
            options.state_dir = dir_ + "/state";
            Server server(options, *topology, topology->all_cpus(), std::move(backend));
            server.enable_slurm_checks(std::move(query), interval, std::chrono::seconds(0), std::move(spool));
            if (!server.start(&error)) {
                started.set_value("start failed: " + error);
                return;
            }
            started.set_value("");
            server.run();
        });
        start_error_ = ready.get();
    }
    ~InProcessMalld() {
        if (thread_.joinable()) {
            // The server thread blocks SIGTERM and reads it from its signalfd.
            ::pthread_kill(thread_.native_handle(), SIGTERM);
            thread_.join();
        }
        std::error_code ignored;
        std::filesystem::remove_all(dir_, ignored);
    }
    const std::string &start_error() const { return start_error_; }
    const std::string &socket() const { return socket_; }

private:
    std::string dir_, socket_, start_error_;
    std::thread thread_;
};

struct Case {
    std::string topology;    // what malld runs on (--topology)
    SlurmNodeShape slurm;    // slurm.conf's description of the node
    std::string slurm_cores; // the job's cores in Slurm's numbering
    std::string linux_cpus;  // what must be reserved for it
};

void PrintTo(const Case &c, std::ostream *os) { *os << c.topology << " cores " << c.slurm_cores; }

class PrologReclaim : public ::testing::TestWithParam<Case> {};

TEST_P(PrologReclaim, ReservesTheLinuxCpusOfTheJobsSlurmCores) {
    const Case &c = GetParam();
    InProcessMalld malld(c.topology, std::make_unique<FakeSlurm>(7, c.slurm_cores, c.slurm));
    ASSERT_EQ(malld.start_error(), "");

    std::string error;
    auto client = CtlClient::connect(malld.socket(), &error);
    ASSERT_TRUE(client.has_value()) << error;
    CtlResult reply = client->request(proto::Type::Reclaim, {{"owner", "slurm-7"}}, std::chrono::seconds(20));
    ASSERT_TRUE(reply.ok) << reply.error;
    EXPECT_EQ(reply.body.value("cpus", ""), c.linux_cpus);

    auto status = status_json(malld.socket());
    ASSERT_TRUE(status.has_value());
    EXPECT_EQ((*status)["reserved"].value("slurm-7", ""), c.linux_cpus) << status->dump();
}

INSTANTIATE_TEST_SUITE_P(
    SmtAndInterleaved, PrologReclaim,
    ::testing::Values(
        // Numbering alternates packages, siblings 8 apart: Slurm's core 1 is package 0's second core.
        Case{kInterleavedXml, {2, 4, 2}, "1", "2,10"},
        Case{kInterleavedXml, {2, 4, 2}, "0,4", "0-1,8-9"},
        // Siblings adjacent (core c = cpus 2c, 2c+1).
        Case{"package:2 core:4 pu:2", {2, 4, 2}, "1", "2-3"},
        // Siblings numbered 4 apart, one package (core k = cpus k, k+4).
        Case{"pack:1 core:4 pu:2(indexes=0,4,1,5,2,6,3,7)", {1, 4, 2}, "1-2", "1-2,5-6"},
        // One thread per core, numbered in order: the identity.
        Case{"pack:1 core:4", {1, 4, 1}, "1-2", "1-2"}));

// Ids the node does not have reserve nothing, and the prolog hears why.
TEST(PrologReclaimRefusal, SlurmCoresTheNodeDoesNotHaveReserveNothing) {
    InProcessMalld malld("package:2 core:4 pu:2", std::make_unique<FakeSlurm>(7, "3,9", SlurmNodeShape{2, 8, 2}));
    ASSERT_EQ(malld.start_error(), "");
    std::string error;
    auto client = CtlClient::connect(malld.socket(), &error);
    ASSERT_TRUE(client.has_value()) << error;
    CtlResult reply = client->request(proto::Type::Reclaim, {{"owner", "slurm-7"}}, std::chrono::seconds(20));
    EXPECT_FALSE(reply.ok);
    EXPECT_NE(reply.error.find("core id 9 is beyond this node's 8 cores"), std::string::npos) << reply.error;
    auto status = status_json(malld.socket());
    ASSERT_TRUE(status.has_value());
    EXPECT_FALSE((*status)["reserved"].contains("slurm-7")) << status->dump();
}

// A Slurm job's end is recorded in Slurm (its AdminComment) before malld answers the Deregister
// of its last task: the step's task-exit waits, so slurmctld still runs the job when the update
// comes (it refuses updates to finished jobs).
TEST(SlurmAdminComment, TheLastDeregisterIsAnsweredAfterTheJobsFiguresReachedSlurm) {
    auto slurm = std::make_unique<FakeSlurm>(7, "0-1", SlurmNodeShape{1, 4, 1});
    FakeSlurm *fake = slurm.get();
    fake->annotate_delay = std::chrono::milliseconds(400);
    InProcessMalld malld("pack:1 core:4", std::move(slurm));
    ASSERT_EQ(malld.start_error(), "");
    Child task({"/bin/sleep", "120"});
    std::string error;
    auto client = CtlClient::connect(malld.socket(), &error);
    ASSERT_TRUE(client.has_value()) << error;
    nlohmann::json job{{"job", "slurm-7"}, {"uid", ::getuid()}, {"pids", {task.pid()}}, {"min", 1}, {"max", 2}};
    CtlResult registered = client->request(proto::Type::Register, job, std::chrono::seconds(20));
    ASSERT_TRUE(registered.ok) << registered.error;
    // It holds its cpus (the resize its figures count) before it ends.
    ASSERT_TRUE(wait_until([&] {
        auto j = job_status(malld.socket(), "slurm-7");
        return j && j->value("cpuset", "") == "0-1";
    }, 20s)) << status_json(malld.socket()).value_or(nlohmann::json()).dump();
    CtlResult ended = client->request(proto::Type::Deregister, {{"job", "slurm-7"}, {"pid", task.pid()}},
                                      std::chrono::seconds(20));
    const auto answered = std::chrono::steady_clock::now();
    ASSERT_TRUE(ended.ok) << ended.error;
    std::lock_guard<std::mutex> lock(fake->mu);
    EXPECT_GE(answered, fake->annotated_at) << "answered before the AdminComment update ended";
    ASSERT_EQ(fake->annotated.size(), 1u);
    EXPECT_EQ(fake->annotated[0].rfind("7 lent_core_s=", 0), 0u) << fake->annotated[0];
    EXPECT_NE(fake->annotated[0].find(",resizes=1,ack_timeouts=0,"), std::string::npos) << fake->annotated[0];
}

// A slurmstepd's socket in a spool folder of the test's own: bound while the object lives.
class StepdSocket {
public:
    explicit StepdSocket(const std::string &path) : path_(path) {
        fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
        bound_ = fd_ >= 0 && ::bind(fd_, reinterpret_cast<sockaddr *>(&addr), sizeof addr) == 0;
    }
    ~StepdSocket() { close(); }
    void close() {  // the step ended
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
        ::unlink(path_.c_str());
    }
    bool bound() const { return bound_; }

private:
    std::string path_;
    int fd_ = -1;
    bool bound_ = false;
};

// Registers `name` for `pid` as the Slurm plugin does and waits until it holds its cpus (so its
// figures count a resize).
void register_and_wait(const std::string &socket, const std::string &name, pid_t pid) {
    std::string error;
    auto client = CtlClient::connect(socket, &error);
    ASSERT_TRUE(client.has_value()) << error;
    nlohmann::json job{{"job", name}, {"uid", ::getuid()}, {"pids", {pid}}, {"min", 1}, {"max", 2}};
    CtlResult registered = client->request(proto::Type::Register, job, std::chrono::seconds(20));
    ASSERT_TRUE(registered.ok) << registered.error;
    ASSERT_TRUE(wait_until([&] {
        auto j = job_status(socket, name);
        return j && !j->value("cpuset", "").empty() && j->value("state", "") == "settled";
    }, 20s)) << status_json(socket).value_or(nlohmann::json()).dump();
}

// A spool folder of the test's own (mode as asked), removed with the object.
struct TempSpool {
    explicit TempSpool(mode_t mode) {
        char tmpl[] = "/tmp/mall_test_spool_XXXXXX";
        if (::mkdtemp(tmpl) != nullptr && ::chmod(tmpl, mode) == 0) dir = tmpl;
    }
    ~TempSpool() {
        std::error_code ignored;
        if (!dir.empty()) std::filesystem::remove_all(dir, ignored);
    }
    std::string dir;  // empty when it could not be made
};

// Issue 39: with the job's step in slurmd's spool, neither its registration nor any of the
// reconciliations (every second here) asks slurmctld anything; once its step socket is gone and
// Slurm says it ended, malld asks (once), releases it, and does not try to update a finished job's
// AdminComment.
TEST(SlurmSteadyState, AJobTheSpoolShowsCostsSlurmctldNothing) {
    TempSpool folder(0755);
    const std::string &spool = folder.dir;
    ASSERT_FALSE(spool.empty());
    StepdSocket extern_step(spool + "/node1_7.4294967291");
    StepdSocket step(spool + "/node1_7.0");
    ASSERT_TRUE(extern_step.bound() && step.bound());

    auto slurm = std::make_unique<FakeSlurm>(7, "0-1", SlurmNodeShape{1, 4, 1});
    FakeSlurm *fake = slurm.get();
    InProcessMalld malld("pack:1 core:4", std::move(slurm), std::chrono::seconds(1),
                         SlurmdSpool(spool, "node1", ::getuid()));
    ASSERT_EQ(malld.start_error(), "");
    Child task({"/bin/sleep", "120"});
    register_and_wait(malld.socket(), "slurm-7", task.pid());
    // Three reconciliation rounds with the job running here: no question to slurmctld.
    std::this_thread::sleep_for(3500ms);
    EXPECT_EQ(fake->queries.load(), 0) << "slurmctld was asked about a job slurmd's spool shows";
    ASSERT_TRUE(job_status(malld.socket(), "slurm-7").has_value());

    // The job's steps end and the plugin's end never comes: malld asks Slurm, which ended it.
    fake->ended = true;
    step.close();
    extern_step.close();
    EXPECT_TRUE(wait_until([&] { return !job_status(malld.socket(), "slurm-7").has_value(); }, 20s))
        << status_json(malld.socket()).value_or(nlohmann::json()).dump();
    EXPECT_GE(fake->queries.load(), 1);
    std::this_thread::sleep_for(1500ms);  // an end recorded would be sent by now
    std::lock_guard<std::mutex> lock(fake->mu);
    EXPECT_TRUE(fake->annotated.empty()) << "tried to update the AdminComment of a job Slurm had ended: "
                                         << fake->annotated[0];
}

// Issue 39: a spool folder malld cannot trust (writable by others) is not read: malld says so and
// asks slurmctld instead, as it did before (the job is still checked).
TEST(SlurmSteadyState, AnUntrustedSpoolFallsBackToAskingSlurmctld) {
    TempSpool folder(0777);
    const std::string &spool = folder.dir;
    ASSERT_FALSE(spool.empty());
    StepdSocket step(spool + "/node1_7.0");
    ASSERT_TRUE(step.bound());
    auto slurm = std::make_unique<FakeSlurm>(7, "0-1", SlurmNodeShape{1, 4, 1});
    FakeSlurm *fake = slurm.get();
    InProcessMalld malld("pack:1 core:4", std::move(slurm), std::chrono::seconds(1),
                         SlurmdSpool(spool, "node1", ::getuid()));
    ASSERT_EQ(malld.start_error(), "");
    Child task({"/bin/sleep", "120"});
    register_and_wait(malld.socket(), "slurm-7", task.pid());
    EXPECT_TRUE(wait_until([&] { return fake->queries.load() >= 2; }, 20s)) << fake->queries.load();
    EXPECT_TRUE(job_status(malld.socket(), "slurm-7").has_value());  // Slurm runs it: kept
}

// --- Record: a Slurm job's figures so far, on demand (issue 39) ---

constexpr uid_t kOtherUid = 61001;  // a throwaway uid: no passwd entry needed

// argv that runs `argv` as kOtherUid (gid the same, no supplementary groups).
std::vector<std::string> as_other_user(std::vector<std::string> argv) {
    std::vector<std::string> out = {"/usr/bin/setpriv", "--reuid=" + std::to_string(kOtherUid),
                                    "--regid=" + std::to_string(kOtherUid), "--clear-groups"};
    out.insert(out.end(), argv.begin(), argv.end());
    return out;
}

CtlResult record(const std::string &socket, const std::string &job) {
    std::string error;
    auto client = CtlClient::connect(socket, &error);
    if (!client) return CtlResult{false, {}, "cannot connect: " + error, MALL_ERR_NODAEMON};
    return client->request(proto::Type::Record, {{"job", job}}, std::chrono::seconds(20));
}

std::vector<std::string> annotated_of(FakeSlurm *fake) {
    std::lock_guard<std::mutex> lock(fake->mu);
    return fake->annotated;
}

// The job's figures so far reach Slurm's annotate, marked running_as_of, and the reply (and
// mallctl's line) carry what was sent; the job runs on.
TEST(SlurmRecord, ARecordSendsTheRunningFiguresToSlurmAndAnswersWithThem) {
    auto slurm = std::make_unique<FakeSlurm>(7, "0-1", SlurmNodeShape{1, 4, 1});
    FakeSlurm *fake = slurm.get();
    InProcessMalld malld("pack:1 core:4", std::move(slurm));
    ASSERT_EQ(malld.start_error(), "");
    Child task({"/bin/sleep", "120"});
    register_and_wait(malld.socket(), "slurm-7", task.pid());
    const auto before = std::chrono::duration_cast<std::chrono::seconds>(
        std::chrono::system_clock::now().time_since_epoch()).count();

    CtlResult reply = record(malld.socket(), "slurm-7");
    ASSERT_TRUE(reply.ok) << reply.error;
    EXPECT_EQ(reply.body.value("job", ""), "slurm-7");
    EXPECT_EQ(reply.body.value("final", true), false);
    const std::string figures = reply.body.value("figures", "");
    EXPECT_EQ(figures.rfind("lent_core_s=", 0), 0u) << figures;
    EXPECT_NE(figures.find(",resizes=1,ack_timeouts=0,"), std::string::npos) << figures;
    const auto as_of = figures.find(",running_as_of=");
    ASSERT_NE(as_of, std::string::npos) << figures;
    EXPECT_GE(std::stoll(figures.substr(as_of + 15)), before) << figures;
    auto sent = annotated_of(fake);
    ASSERT_EQ(sent.size(), 1u);
    EXPECT_EQ(sent[0], "7 " + figures);

    // mallctl's command line: the same request, its figures on stdout, exit 0.
    auto r = run_command(mallctl_argv(malld.socket(), {"record", "slurm-7"}));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("job slurm-7: recorded lent_core_s="), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(",running_as_of="), std::string::npos) << r.out;
    sent = annotated_of(fake);
    ASSERT_EQ(sent.size(), 2u);
    EXPECT_NE(sent[1].find(",running_as_of="), std::string::npos) << sent[1];
    EXPECT_TRUE(job_status(malld.socket(), "slurm-7").has_value()) << "a Record ended the job";
}

// A job that is not Slurm's, a Slurm job not on this node, a bad request and a user who is not an
// admin: refused with words that say why, nothing sent to Slurm, the jobs as they were.
TEST(SlurmRecord, ARecordOfAnotherJobOrByAnotherUserIsRefusedAndChangesNothing) {
    auto slurm = std::make_unique<FakeSlurm>(7, "0-1", SlurmNodeShape{1, 4, 1});
    FakeSlurm *fake = slurm.get();
    InProcessMalld malld("pack:1 core:4", std::move(slurm));
    ASSERT_EQ(malld.start_error(), "");
    Child task({"/bin/sleep", "120"});
    Child other({"/bin/sleep", "120"});
    register_and_wait(malld.socket(), "slurm-7", task.pid());
    register_and_wait(malld.socket(), "train", other.pid());
    auto jobs_before = status_json(malld.socket()).value_or(nlohmann::json())["jobs"].size();

    CtlResult not_slurm = record(malld.socket(), "train");
    EXPECT_FALSE(not_slurm.ok);
    EXPECT_EQ(not_slurm.code, MALL_ERR_INVAL);
    EXPECT_NE(not_slurm.error.find("job train is not a Slurm job"), std::string::npos) << not_slurm.error;
    EXPECT_NE(not_slurm.error.find("slurm-<jobid>"), std::string::npos) << not_slurm.error;

    CtlResult not_here = record(malld.socket(), "slurm-8");
    EXPECT_FALSE(not_here.ok);
    EXPECT_EQ(not_here.code, MALL_ERR_NOJOB);
    EXPECT_NE(not_here.error.find("no job slurm-8 on this node"), std::string::npos) << not_here.error;

    std::string error;
    auto client = CtlClient::connect(malld.socket(), &error);
    ASSERT_TRUE(client.has_value()) << error;
    CtlResult no_job = client->request(proto::Type::Record, nlohmann::json::object(), std::chrono::seconds(20));
    EXPECT_FALSE(no_job.ok);
    EXPECT_NE(no_job.error.find("\"job\""), std::string::npos) << no_job.error;

    // An ordinary user (mallctl as uid 61001; the socket is 0666, its folder opened to others).
    ASSERT_EQ(::chmod(std::filesystem::path(malld.socket()).parent_path().c_str(), 0711), 0);
    auto denied = run_command(as_other_user(mallctl_argv(malld.socket(), {"record", "slurm-7"})));
    EXPECT_EQ(denied.exit_code, 1) << denied.out << denied.err;
    EXPECT_NE(denied.err.find("Record needs root or an admin uid"), std::string::npos) << denied.err;
    // mallctl's own refusals: exit 1 with malld's words, exit 2 for a name that is not Slurm's.
    auto missing = run_command(mallctl_argv(malld.socket(), {"record", "slurm-8"}));
    EXPECT_EQ(missing.exit_code, 1) << missing.err;
    EXPECT_NE(missing.err.find("no job slurm-8 on this node"), std::string::npos) << missing.err;
    auto usage = run_command(mallctl_argv(malld.socket(), {"record", "train"}));
    EXPECT_EQ(usage.exit_code, 2) << usage.err;
    EXPECT_NE(usage.err.find("not a Slurm job's name"), std::string::npos) << usage.err;
    auto nameless = run_command(mallctl_argv(malld.socket(), {"record"}));
    EXPECT_EQ(nameless.exit_code, 2) << nameless.err;

    std::this_thread::sleep_for(300ms);  // an update wrongly queued would have been sent by now
    EXPECT_TRUE(annotated_of(fake).empty()) << "a refused Record reached Slurm: " << annotated_of(fake)[0];
    auto status = status_json(malld.socket());
    ASSERT_TRUE(status.has_value());
    EXPECT_EQ((*status)["jobs"].size(), jobs_before) << status->dump();
    EXPECT_TRUE(job_status(malld.socket(), "slurm-7").has_value());
    EXPECT_TRUE(job_status(malld.socket(), "train").has_value());
}

// slurmctld is slow: each Record is answered after its own update ended, also the one sent while
// another Record's update was in flight (queued behind it, not dropped nor answered by it).
TEST(SlurmRecord, ARecordIsAnsweredAfterItsOwnUpdateReachedSlurm) {
    auto slurm = std::make_unique<FakeSlurm>(7, "0-1", SlurmNodeShape{1, 4, 1});
    FakeSlurm *fake = slurm.get();
    fake->annotate_delay = std::chrono::milliseconds(500);
    InProcessMalld malld("pack:1 core:4", std::move(slurm));
    ASSERT_EQ(malld.start_error(), "");
    Child task({"/bin/sleep", "120"});
    register_and_wait(malld.socket(), "slurm-7", task.pid());

    auto first = std::async(std::launch::async, [&] { return record(malld.socket(), "slurm-7"); });
    ASSERT_TRUE(wait_until([&] { return fake->annotate_calls.load() == 1; }, 20s));  // first in flight
    CtlResult second = record(malld.socket(), "slurm-7");
    const auto answered = std::chrono::steady_clock::now();
    CtlResult first_reply = first.get();
    ASSERT_TRUE(first_reply.ok) << first_reply.error;
    ASSERT_TRUE(second.ok) << second.error;
    std::lock_guard<std::mutex> lock(fake->mu);
    ASSERT_EQ(fake->annotated.size(), 2u) << "the second Record's update was not sent";
    EXPECT_GE(answered, fake->annotated_at) << "answered before its AdminComment update ended";
    EXPECT_EQ(fake->annotated[0], "7 " + first_reply.body.value("figures", ""));
    EXPECT_EQ(fake->annotated[1], "7 " + second.body.value("figures", ""));
}

// A Record that comes while the job's end is being recorded is answered by that update (its last
// figures, final), and sends no running figures after it (they would replace the last ones).
TEST(SlurmRecord, ARecordDuringTheJobsEndIsAnsweredWithItsLastFigures) {
    auto slurm = std::make_unique<FakeSlurm>(7, "0-1", SlurmNodeShape{1, 4, 1});
    FakeSlurm *fake = slurm.get();
    fake->annotate_delay = std::chrono::milliseconds(500);
    InProcessMalld malld("pack:1 core:4", std::move(slurm));
    ASSERT_EQ(malld.start_error(), "");
    Child task({"/bin/sleep", "120"});
    register_and_wait(malld.socket(), "slurm-7", task.pid());

    auto ended = std::async(std::launch::async, [&] {
        std::string error;
        auto client = CtlClient::connect(malld.socket(), &error);
        if (!client) return CtlResult{false, {}, error, MALL_ERR_NODAEMON};
        return client->request(proto::Type::Deregister, {{"job", "slurm-7"}, {"pid", task.pid()}},
                               std::chrono::seconds(20));
    });
    ASSERT_TRUE(wait_until([&] { return fake->annotate_calls.load() == 1; }, 20s));  // the end in flight
    CtlResult reply = record(malld.socket(), "slurm-7");
    ASSERT_TRUE(ended.get().ok);
    ASSERT_TRUE(reply.ok) << reply.error;
    EXPECT_EQ(reply.body.value("final", false), true);
    const std::string figures = reply.body.value("figures", "");
    EXPECT_EQ(figures.find("running_as_of"), std::string::npos) << figures;
    std::this_thread::sleep_for(700ms);  // a running update queued after the end would be sent by now
    auto sent = annotated_of(fake);
    ASSERT_EQ(sent.size(), 1u) << "running figures went to Slurm after the job's last ones: " << sent.back();
    EXPECT_EQ(sent[0], "7 " + figures);
}

// slurmctld refuses (the job finished in Slurm): the admin gets Slurm's words, mallctl exits 1.
TEST(SlurmRecord, SlurmctldsRefusalReachesTheAdminWithItsWords) {
    auto slurm = std::make_unique<FakeSlurm>(7, "0-1", SlurmNodeShape{1, 4, 1});
    FakeSlurm *fake = slurm.get();
    fake->annotate_answer = {"cannot load the job: Job has already finished", true};
    InProcessMalld malld("pack:1 core:4", std::move(slurm));
    ASSERT_EQ(malld.start_error(), "");
    Child task({"/bin/sleep", "120"});
    register_and_wait(malld.socket(), "slurm-7", task.pid());
    CtlResult reply = record(malld.socket(), "slurm-7");
    EXPECT_FALSE(reply.ok);
    EXPECT_NE(reply.error.find("Slurm had finished job 7"), std::string::npos) << reply.error;
    EXPECT_NE(reply.error.find("Job has already finished"), std::string::npos) << reply.error;
    auto r = run_command(mallctl_argv(malld.socket(), {"record", "slurm-7"}));
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.err.find("Job has already finished"), std::string::npos) << r.err;
}

// A malld without --slurm records nothing in Slurm and says so.
TEST(SlurmRecord, AMalldWithoutSlurmChecksSaysSo) {
    MalldOptions options;
    options.backend = "affinity";
    PrivateMalld malld(options);
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;
    auto r = run_command(mallctl_argv(malld.socket(), {"record", "slurm-7"}));
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.err.find("not started with --slurm"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace mall::test
