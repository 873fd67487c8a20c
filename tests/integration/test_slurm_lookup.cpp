// SPDX-License-Identifier: BSD-3-Clause
// Proves malld's Reclaim by owner (what a Slurm job prolog sends: no cpus, malld looks the job up
// in Slurm) reserves the Linux cpus of the job's Slurm cores on SMT and interleaved nodes (issue 12,
// defect 4: it reserved Slurm's ids as if they were Linux cpus); and that malld asks slurmctld
// nothing about a job whose step sockets slurmd's spool shows (issue 39), asks about one that
// vanished from it and releases it when Slurm has ended it (with no AdminComment update then).
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
    Annotated annotate(uint32_t id, const std::string &figures) override {
        std::this_thread::sleep_for(annotate_delay);
        std::lock_guard<std::mutex> lock(mu);
        annotated.push_back(std::to_string(id) + " " + figures);
        annotated_at = std::chrono::steady_clock::now();
        return {};
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

// Issue 39: with the job's step in slurmd's spool, neither its registration nor any of the
// reconciliations (every second here) asks slurmctld anything; once its step socket is gone and
// Slurm says it ended, malld asks (once), releases it, and does not try to update a finished job's
// AdminComment.
TEST(SlurmSteadyState, AJobTheSpoolShowsCostsSlurmctldNothing) {
    char tmpl[] = "/tmp/mall_test_spool_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    const std::string spool = tmpl;
    ASSERT_EQ(::chmod(spool.c_str(), 0755), 0);
    struct RemoveSpool {
        std::string dir;
        ~RemoveSpool() { std::error_code e; std::filesystem::remove_all(dir, e); }
    } remove_spool{spool};
    StepdSocket extern_step(spool + "/node1_7.4294967291");
    StepdSocket step(spool + "/node1_7.0");
    ASSERT_TRUE(extern_step.bound() && step.bound());

    auto slurm = std::make_unique<FakeSlurm>(7, "0-1", SlurmNodeShape{1, 4, 1});
    FakeSlurm *fake = slurm.get();
    InProcessMalld malld("pack:1 core:4", std::move(slurm), std::chrono::seconds(1),
                         SlurmdSpool(spool, "node1", ::getuid()));
    ASSERT_EQ(malld.start_error(), "");
    Child task({"/bin/sleep", "120"});
    std::string error;
    auto client = CtlClient::connect(malld.socket(), &error);
    ASSERT_TRUE(client.has_value()) << error;
    nlohmann::json job{{"job", "slurm-7"}, {"uid", ::getuid()}, {"pids", {task.pid()}}, {"min", 1}, {"max", 2}};
    CtlResult registered = client->request(proto::Type::Register, job, std::chrono::seconds(20));
    ASSERT_TRUE(registered.ok) << registered.error;
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
    char tmpl[] = "/tmp/mall_test_spool_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    const std::string spool = tmpl;
    ASSERT_EQ(::chmod(spool.c_str(), 0777), 0);
    struct RemoveSpool {
        std::string dir;
        ~RemoveSpool() { std::error_code e; std::filesystem::remove_all(dir, e); }
    } remove_spool{spool};
    StepdSocket step(spool + "/node1_7.0");
    ASSERT_TRUE(step.bound());
    auto slurm = std::make_unique<FakeSlurm>(7, "0-1", SlurmNodeShape{1, 4, 1});
    FakeSlurm *fake = slurm.get();
    InProcessMalld malld("pack:1 core:4", std::move(slurm), std::chrono::seconds(1),
                         SlurmdSpool(spool, "node1", ::getuid()));
    ASSERT_EQ(malld.start_error(), "");
    Child task({"/bin/sleep", "120"});
    std::string error;
    auto client = CtlClient::connect(malld.socket(), &error);
    ASSERT_TRUE(client.has_value()) << error;
    nlohmann::json job{{"job", "slurm-7"}, {"uid", ::getuid()}, {"pids", {task.pid()}}, {"min", 1}, {"max", 2}};
    ASSERT_TRUE(client->request(proto::Type::Register, job, std::chrono::seconds(20)).ok);
    EXPECT_TRUE(wait_until([&] { return fake->queries.load() >= 2; }, 20s)) << fake->queries.load();
    EXPECT_TRUE(job_status(malld.socket(), "slurm-7").has_value());  // Slurm runs it: kept
}

}  // namespace
}  // namespace mall::test
