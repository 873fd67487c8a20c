// SPDX-License-Identifier: BSD-3-Clause
// Proves that malformed bytes on malld's socket get an error reply (or a hang-up when not even a
// header can be read) and never disturb malld: a well-behaved job keeps stepping and status answers.
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include <gtest/gtest.h>

#include "common/protocol.hpp"
#include "common/unix_socket.hpp"
#include "mall/mall.h"
#include "support/malld_fixture.hpp"

MALL_TEST_WATCHDOG(240);

namespace mall::test {
namespace {

using nlohmann::json;

// A wire header built by hand (magic, version, type, payload length, request id; host order),
// so the tests can break each field; checked against proto::encode below.
std::string raw_header(uint16_t type, uint32_t length, uint32_t request_id, uint16_t version = proto::kVersion,
                       uint32_t magic = proto::kMagic) {
    std::string h(proto::kHeaderSize, '\0');
    std::memcpy(h.data() + 0, &magic, 4);
    std::memcpy(h.data() + 4, &version, 2);
    std::memcpy(h.data() + 6, &type, 2);
    std::memcpy(h.data() + 8, &length, 4);
    std::memcpy(h.data() + 12, &request_id, 4);
    return h;
}

std::string raw_packet(proto::Type type, const std::string &payload, uint32_t request_id) {
    return raw_header(static_cast<uint16_t>(type), static_cast<uint32_t>(payload.size()), request_id) + payload;
}

struct Answer {
    bool closed = false;      // malld hung up without a reply
    bool timed_out = false;   // neither a reply nor a hang-up
    bool unreadable = false;  // a packet came that does not decode
    std::optional<proto::Message> reply;
    std::string describe() const {
        if (reply) return proto::type_name(reply->type) + std::string(" ") + reply->body.dump();
        return closed ? "hang-up" : timed_out ? "no answer" : "an unreadable packet";
    }
};

// Waits for malld's answer on fd.
Answer receive(int fd, Millis timeout = 5s) {
    Answer a;
    int ready = wait_readable(fd, timeout);
    if (ready <= 0) {
        a.timed_out = ready == 0;
        a.closed = ready < 0;
        return a;
    }
    std::string data;
    ssize_t n = recv_packet(fd, &data, proto::kMaxPacket);
    if (n <= 0) {
        a.closed = true;
        return a;
    }
    std::string why;
    a.reply = proto::decode(data, &why);
    a.unreadable = !a.reply;
    return a;
}

Answer hung_up() {
    Answer a;
    a.closed = true;
    return a;
}

// Sends one raw packet on a fresh connection and returns malld's answer.
Answer send_and_receive(const std::string &socket, const std::string &packet) {
    UniqueFd fd(unix_connect(socket));
    if (!fd) {
        ADD_FAILURE() << "cannot connect to " << socket << ": " << std::strerror(errno);
        return hung_up();
    }
    if (::send(fd.get(), packet.data(), packet.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(packet.size())) {
        ADD_FAILURE() << "cannot send a " << packet.size() << "-byte packet: " << std::strerror(errno);
        return hung_up();
    }
    return receive(fd.get());
}

// The answer is an error Reply for our request id, with words and a negative mall_rc code.
::testing::AssertionResult is_error_reply(const Answer &a, uint32_t request_id) {
    if (!a.reply) return ::testing::AssertionFailure() << "expected an error reply, got " << a.describe();
    const auto &m = *a.reply;
    if (m.type != proto::Type::Reply) return ::testing::AssertionFailure() << "not a Reply: " << a.describe();
    if (m.request_id != request_id)
        return ::testing::AssertionFailure() << "reply for request " << m.request_id << ", expected " << request_id;
    if (m.body.value("ok", true)) return ::testing::AssertionFailure() << "malld accepted it: " << a.describe();
    if (m.body.value("error", "").empty())
        return ::testing::AssertionFailure() << "the error has no words: " << a.describe();
    if (!m.body.contains("code") || !m.body["code"].is_number_integer() || m.body["code"].get<int>() >= 0)
        return ::testing::AssertionFailure() << "the error has no negative code: " << a.describe();
    return ::testing::AssertionSuccess();
}

// When not even a header can be read there is no request to answer: an error reply or a hang-up.
::testing::AssertionResult is_error_or_hangup(const Answer &a) {
    if (a.closed) return ::testing::AssertionSuccess();
    if (a.reply && a.reply->type == proto::Type::Reply && !a.reply->body.value("ok", true))
        return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "expected an error reply or a hang-up, got " << a.describe();
}

class Malformed : public ::testing::Test {
protected:
    void SetUp() override {
        MALL_REQUIRE_ROOT_AND_CPUSET();
        MalldOptions options;
        options.ack_timeout_ms = 20000;  // the good job steps every ms: a timeout means it stopped
        malld_ = std::make_unique<PrivateMalld>(options);
        std::string error;
        ASSERT_TRUE(malld_->start(&error)) << error;
        good_ = std::make_unique<Child>(
            mallrun_argv(malld_->socket(), "1:2", "good", test_client_argv({"--step-us", "1000"})));
        ASSERT_TRUE(wait_until([&] { return job_settled_on(malld_->socket(), "good", "0-1", 1); }, 20s))
            << malld_->log();
    }

    // malld still serves: it runs, status answers, the good job is untouched, and a change still
    // reaches the good job's process, which acks it.
    void expect_still_serving() {
        ASSERT_TRUE(malld_->running());
        ASSERT_EQ(::kill(malld_->pid(), 0), 0) << "malld died";
        auto status = status_json(malld_->socket());
        ASSERT_TRUE(status) << "malld stopped answering Status";
        auto good = find_job(*status, "good");
        ASSERT_TRUE(good) << status->dump(1);
        EXPECT_EQ(status->value("jobs", json::array()).size(), 1u) << "a malformed request registered a job:\n"
                                                                   << status->dump(1);
        auto ctl = run_command(mallctl_argv(malld_->socket(), {"status"}));
        EXPECT_EQ(ctl.exit_code, 0) << ctl.err;

        ++round_;
        const std::string target = round_ % 2 ? "0" : "1";
        auto set = run_command(mallctl_argv(malld_->socket(), {"set", "good", "--cpus", target}));
        ASSERT_EQ(set.exit_code, 0) << set.err;
        EXPECT_TRUE(wait_until([&] { return job_settled_on(malld_->socket(), "good", target, 1); }, 20s))
            << status_json(malld_->socket()).value_or(json()).dump(1);
        EXPECT_TRUE(good_->wait_for_line(
            [&](const std::string &l) { return l.find("ncpus=1 cpus=" + target) != std::string::npos; }, 10s))
            << "the good job did not step through the change";
        auto back = run_command(mallctl_argv(malld_->socket(), {"set", "good", "--cpus", "auto"}));
        ASSERT_EQ(back.exit_code, 0) << back.err;
        EXPECT_TRUE(wait_until([&] { return job_settled_on(malld_->socket(), "good", "0-1", 1); }, 20s));
        auto j = job_status(malld_->socket(), "good");
        ASSERT_TRUE(j);
        EXPECT_EQ(j->value("ack_timeouts", -1), 0) << j->dump();
    }

    std::unique_ptr<PrivateMalld> malld_;
    std::unique_ptr<Child> good_;
    int round_ = 0;
};

TEST(MalformedWire, HandBuiltHeaderMatchesTheProtocol) {
    proto::Message m;
    m.type = proto::Type::Status;
    m.request_id = 77;
    EXPECT_EQ(raw_packet(proto::Type::Status, "{}", 77), proto::encode(m));
}

TEST_F(Malformed, UnreadableHeadersGetAnErrorOrAHangUp) {
    EXPECT_TRUE(is_error_or_hangup(send_and_receive(malld_->socket(), "hello, malld!")));
    EXPECT_TRUE(is_error_or_hangup(send_and_receive(malld_->socket(), std::string(1, '\0'))));
    std::string valid = raw_packet(proto::Type::Status, "{}", 5);
    EXPECT_TRUE(is_error_or_hangup(send_and_receive(malld_->socket(), valid.substr(0, 10)))) << "truncated header";
    EXPECT_TRUE(is_error_or_hangup(
        send_and_receive(malld_->socket(), raw_header(6, 2, 9, proto::kVersion, 0xdeadbeef) + "{}")))
        << "bad magic";
    std::string junk(300, '\0');
    for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<char>((i * 131 + 7) & 0xff);
    EXPECT_TRUE(is_error_or_hangup(send_and_receive(malld_->socket(), junk))) << "random bytes";
    expect_still_serving();
}

TEST_F(Malformed, BadHeadersGetAnErrorReply) {
    EXPECT_TRUE(is_error_reply(send_and_receive(malld_->socket(), raw_header(6, 2, 11, proto::kVersion + 1) + "{}"), 11))
        << "wrong version";
    EXPECT_TRUE(is_error_reply(send_and_receive(malld_->socket(), raw_header(999, 2, 12) + "{}"), 12)) << "unknown type";
    EXPECT_TRUE(is_error_reply(send_and_receive(malld_->socket(), raw_packet(proto::Type::Reply, "{\"ok\":true}", 13)), 13))
        << "a client may not send a Reply";
    EXPECT_TRUE(is_error_reply(send_and_receive(malld_->socket(), raw_packet(proto::Type::Notify, "{\"generation\":1}", 14)),
                               14))
        << "a client may not send a Notify";
    EXPECT_TRUE(is_error_reply(send_and_receive(malld_->socket(), raw_header(6, 2, 15) + "{}xyz"), 15)) << "trailing bytes";
    EXPECT_TRUE(is_error_reply(send_and_receive(malld_->socket(), raw_header(6, 100, 16) + "{}"), 16))
        << "payload shorter than the header says";
    EXPECT_TRUE(is_error_reply(
        send_and_receive(malld_->socket(), raw_header(6, static_cast<uint32_t>(proto::kMaxPayload + 1), 17) + "{}"), 17))
        << "length over the limit";
    expect_still_serving();
}

TEST_F(Malformed, OversizedPacketGetsAnErrorReply) {
    std::string payload = "{\"pad\":\"" + std::string(proto::kMaxPayload + 1000, 'x') + "\"}";
    EXPECT_TRUE(is_error_reply(send_and_receive(malld_->socket(), raw_packet(proto::Type::Status, payload, 21)), 21));
    expect_still_serving();
}

TEST_F(Malformed, BrokenJsonGetsAnErrorReply) {
    EXPECT_TRUE(is_error_reply(send_and_receive(malld_->socket(), raw_packet(proto::Type::Status, "{\"job\": ", 31)), 31));
    EXPECT_TRUE(is_error_reply(send_and_receive(malld_->socket(), raw_packet(proto::Type::Set, "not json at all", 32)), 32));
    EXPECT_TRUE(is_error_reply(send_and_receive(malld_->socket(), raw_packet(proto::Type::Set, "[1,2,3]", 33)), 33))
        << "a payload must be an object";
    EXPECT_TRUE(is_error_reply(send_and_receive(malld_->socket(), raw_packet(proto::Type::Set, "", 34)), 34))
        << "empty payload";
    std::string bad_utf8 = "{\"job\":\"\xff\xfe\",\"cpus\":\"0\"}";
    EXPECT_TRUE(is_error_reply(send_and_receive(malld_->socket(), raw_packet(proto::Type::Set, bad_utf8, 35)), 35))
        << "invalid UTF-8";
    expect_still_serving();
}

TEST_F(Malformed, BadRequestsGetAnErrorReplyAndChangeNothing) {
    // A live process to name in registrations, so that only the field under test is wrong.
    Child victim({"/bin/sleep", "60"});
    ASSERT_TRUE(victim.started());
    const int pid = victim.pid();
    auto reg = [&](json body, uint32_t id) {
        return send_and_receive(malld_->socket(), raw_packet(proto::Type::Register, body.dump(), id));
    };
    json good_fields = {{"job", "intruder"}, {"uid", 0}, {"pids", {pid}}, {"min", 1}, {"max", 1}};
    auto without = [&](const char *field) {
        json j = good_fields;
        j.erase(field);
        return j;
    };
    auto with = [&](const char *field, json value) {
        json j = good_fields;
        j[field] = std::move(value);
        return j;
    };
    EXPECT_TRUE(is_error_reply(reg(json::object(), 41), 41)) << "no fields";
    EXPECT_TRUE(is_error_reply(reg(without("job"), 42), 42)) << "no job";
    EXPECT_TRUE(is_error_reply(reg(without("pids"), 43), 43)) << "no pids";
    EXPECT_TRUE(is_error_reply(reg(without("min"), 44), 44)) << "no min";
    EXPECT_TRUE(is_error_reply(reg(with("min", 2), 45), 45)) << "min > max";
    EXPECT_TRUE(is_error_reply(reg(with("min", 0), 46), 46)) << "min 0";
    EXPECT_TRUE(is_error_reply(reg(with("max", 99), 47), 47)) << "max beyond the pool";
    EXPECT_TRUE(is_error_reply(reg(with("guaranteed", "3-1"), 48), 48)) << "reversed cpu range";
    EXPECT_TRUE(is_error_reply(reg(with("guaranteed", "99"), 49), 49)) << "cpu not in the pool";
    EXPECT_TRUE(is_error_reply(reg(with("guaranteed", "0,,1"), 50), 50)) << "bad cpu list";
    EXPECT_TRUE(is_error_reply(reg(with("job", "bad name!"), 51), 51)) << "bad job name";
    EXPECT_TRUE(is_error_reply(reg(with("job", "good"), 52), 52)) << "a job of that name exists";
    EXPECT_TRUE(is_error_reply(reg(with("pids", json::array({"x"})), 53), 53)) << "pid not a number";
    EXPECT_TRUE(is_error_reply(reg(with("pids", json::array()), 54), 54)) << "no pid";
    EXPECT_TRUE(is_error_reply(reg(with("pids", json::array({-5})), 55), 55)) << "negative pid";
    EXPECT_TRUE(is_error_reply(reg(with("min", "1"), 56), 56)) << "min as a string";

    auto set = [&](json body, uint32_t id) {
        return send_and_receive(malld_->socket(), raw_packet(proto::Type::Set, body.dump(), id));
    };
    EXPECT_TRUE(is_error_reply(set({{"job", "good"}, {"cpus", "3-1"}}, 61), 61)) << "reversed range";
    EXPECT_TRUE(is_error_reply(set({{"job", "good"}, {"cpus", "99"}}, 62), 62)) << "cpu not in the pool";
    EXPECT_TRUE(is_error_reply(set({{"job", "nosuchjob"}, {"cpus", "0"}}, 63), 63)) << "unknown job";
    EXPECT_TRUE(is_error_reply(set({{"job", "good"}}, 64), 64)) << "no cpus";
    EXPECT_TRUE(is_error_reply(
        send_and_receive(malld_->socket(), raw_packet(proto::Type::Policy, "{\"name\":\"bogus\"}", 65)), 65))
        << "unknown policy";
    EXPECT_TRUE(is_error_reply(
        send_and_receive(malld_->socket(), raw_packet(proto::Type::Reclaim, "{\"cpus\":\"1-0\"}", 66)), 66))
        << "bad reclaim list";
    EXPECT_TRUE(is_error_reply(
        send_and_receive(malld_->socket(), raw_packet(proto::Type::Release, "{\"cpus\":\"1\"}", 67)), 67))
        << "releasing cpus that were not reclaimed";
    EXPECT_TRUE(is_error_reply(
        send_and_receive(malld_->socket(), raw_packet(proto::Type::Deregister, "{\"job\":\"nosuchjob\"}", 68)), 68))
        << "deregistering an unknown job";
    EXPECT_TRUE(is_error_reply(
        send_and_receive(malld_->socket(), raw_packet(proto::Type::Attach, "{\"job\":\"nosuchjob\"}", 69)), 69))
        << "attaching to an unknown job";

    auto status = status_json(malld_->socket());
    ASSERT_TRUE(status);
    EXPECT_EQ(status->value("policy", ""), "equal");
    EXPECT_EQ(status->value("reclaimed", "?"), "");
    expect_still_serving();
}

TEST_F(Malformed, ClientsThatHangUpMidRequestDoNotDisturbMalld) {
    // Connect and leave without a word, many times.
    for (int i = 0; i < 50; ++i) {
        UniqueFd fd(unix_connect(malld_->socket()));
        ASSERT_TRUE(fd);
    }
    // Ask and leave before the answer.
    for (int i = 0; i < 20; ++i) {
        UniqueFd fd(unix_connect(malld_->socket()));
        ASSERT_TRUE(fd);
        std::string p = raw_packet(proto::Type::Status, "{}", 100 + i);
        ::send(fd.get(), p.data(), p.size(), MSG_NOSIGNAL);
    }
    // Start watching and leave.
    {
        UniqueFd fd(unix_connect(malld_->socket()));
        std::string p = raw_packet(proto::Type::Watch, "{}", 200);
        ::send(fd.get(), p.data(), p.size(), MSG_NOSIGNAL);
    }
    // Half-close after a request: malld may still answer on the open direction.
    {
        UniqueFd fd(unix_connect(malld_->socket()));
        std::string p = raw_packet(proto::Type::Status, "{}", 201);
        ::send(fd.get(), p.data(), p.size(), MSG_NOSIGNAL);
        ::shutdown(fd.get(), SHUT_WR);
        Answer a = receive(fd.get());
        EXPECT_TRUE(a.closed || (a.reply && a.reply->request_id == 201)) << a.describe();
    }
    // A registration whose reply is deferred (it must wait for the good job to shrink), abandoned
    // before the reply: malld must carry on, and the job it registered must be manageable.
    Child victim({"/bin/sleep", "60"});
    ASSERT_TRUE(victim.started());
    {
        UniqueFd fd(unix_connect(malld_->socket()));
        json body = {{"job", "abandoned"}, {"uid", 0}, {"pids", {victim.pid()}}, {"min", 1}, {"max", 1}};
        std::string p = raw_packet(proto::Type::Register, body.dump(), 300);
        ASSERT_EQ(::send(fd.get(), p.data(), p.size(), MSG_NOSIGNAL), static_cast<ssize_t>(p.size()));
    }
    auto status = status_json(malld_->socket());
    ASSERT_TRUE(status) << "malld stopped answering after a client left mid-request";
    if (find_job(*status, "abandoned")) {
        // The registration stood: it ends like any job whose process exits.
        EXPECT_TRUE(wait_until(
            [&] { return job_status(malld_->socket(), "abandoned").value_or(json()).value("ncpus", 0) == 1; }, 20s))
            << status_json(malld_->socket()).value_or(json()).dump(1);
        victim.signal(SIGKILL);
        victim.wait_exit(10s);
        EXPECT_TRUE(wait_until([&] { return !job_status(malld_->socket(), "abandoned"); }, 10s))
            << "the abandoned job's process died but the job stays:\n"
            << status_json(malld_->socket()).value_or(json()).dump(1);
    }
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld_->socket(), "good", "0-1", 1); }, 20s))
        << status_json(malld_->socket()).value_or(json()).dump(1);
    expect_still_serving();
}

}  // namespace
}  // namespace mall::test
