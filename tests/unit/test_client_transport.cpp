// SPDX-License-Identifier: BSD-3-Clause
// test_client_transport.cpp — proves what libmall's handshake stands on: the seqlock page (thread
// count, never-torn snapshots), the unix-socket helpers (listen, descriptor passing, truncation),
// CtlClient's replies and errors, and the one explanation of a failed connect for the tools and
// the library.
#include "client_test_support.hpp"

using namespace std::chrono_literals;
using namespace mall::test::client;
using mall::test::FakeDaemon;

namespace {

MALL_TEST_WATCHDOG(60);

}  // namespace

// The page carries the thread count (mallctl set --threads) inside the seqlock; a page written
// without one (0, as by a malld before API 0.3) or with one out of range reads as one per cpu.
TEST(SharedPage, ThreadCountRoundTripsAndDefaultsToOnePerCpu) {
    auto page = std::make_unique<mall::SharedPage>();
    mall::page_init(page.get());
    uint64_t mask[MALL_MAX_CPUS / 64] = {};
    mask[0] = 0xf;
    mall_alloc_t snap{};
    mall::page_write(page.get(), 1, mask, 4, "0-3", 2);
    ASSERT_TRUE(mall::page_read(page.get(), &snap));
    EXPECT_EQ(snap.ncpus, 4);
    EXPECT_EQ(snap.nthreads, 2);
    EXPECT_EQ(mall_alloc_threads(&snap), 2);
    mall::page_write(page.get(), 2, mask, 4, "0-3");  // no count: one per cpu
    ASSERT_TRUE(mall::page_read(page.get(), &snap));
    EXPECT_EQ(snap.nthreads, 4);
    mall::page_write(page.get(), 3, mask, 4, "0-3", 9);  // more than the cpus: one per cpu
    ASSERT_TRUE(mall::page_read(page.get(), &snap));
    EXPECT_EQ(snap.nthreads, 4);
}

TEST(SharedPage, ConcurrentSnapshotsAreNeverTorn) {
    mall_test_watchdog_arm(60);  // a fresh 60 s for this test alone
    auto *page = new mall::SharedPage;
    mall::page_init(page);
    std::atomic<bool> writer_done{false};
    uint64_t big[MALL_MAX_CPUS / 64] = {};
    for (int i = 0; i < 512; ++i) big[i / 64] |= uint64_t{1} << (i % 64);
    uint64_t small[MALL_MAX_CPUS / 64] = {};
    small[600 / 64] |= uint64_t{1} << (600 % 64);
    constexpr uint64_t kWrites = 200000;
    std::thread writer([&] {
        for (uint64_t g = 1; g <= kWrites; ++g) {
            if (g % 2)
                mall::page_write(page, g, big, 512, "0-511");
            else
                mall::page_write(page, g, small, 1, "600");
            if (g % 64 == 0) std::this_thread::yield();  // let the reader in now and then
        }
        writer_done = true;
    });
    auto check = [](const mall_alloc_t &snap) {
        int bits = 0;
        for (uint64_t w : snap.mask) bits += std::popcount(w);
        EXPECT_EQ(bits, snap.ncpus) << "torn snapshot at generation " << snap.generation;
        EXPECT_STREQ(snap.cpus, snap.generation % 2 ? "0-511" : "600") << "torn at " << snap.generation;
        return bits == snap.ncpus;
    };
    long consistent = 0, refused = 0;
    while (!writer_done.load()) {
        mall_alloc_t snap;
        if (!mall::page_read(page, &snap)) {
            ++refused;
            continue;
        }
        if (snap.generation == 0) continue;
        ++consistent;
        if (!check(snap)) break;
    }
    writer.join();
    std::printf("snapshots during writes: %ld consistent, %ld given up (writer busy)\n", consistent, refused);
    mall_alloc_t final_snap;
    ASSERT_TRUE(mall::page_read(page, &final_snap));
    EXPECT_EQ(final_snap.generation, kWrites);
    check(final_snap);

    // Invalid pages are refused.
    mall_alloc_t snap;
    page->magic = 0;
    EXPECT_FALSE(mall::page_read(page, &snap));
    mall::page_init(page);
    page->ncpus = MALL_MAX_CPUS + 1;
    EXPECT_FALSE(mall::page_read(page, &snap));
    mall::page_init(page);
    std::memset(page->cpus, 'x', sizeof page->cpus);
    EXPECT_FALSE(mall::page_read(page, &snap));
    delete page;
}

// The socket helpers under the client: listen safety, descriptor passing, truncation, credentials.
TEST_F(ClientTest, UnixListenRefusesNonSocketsAndLiveSocketsButReplacesStaleOnes) {
    std::string why;
    std::string file = dir_ + "/not-a-socket";
    { std::ofstream(file) << "keep me"; }
    EXPECT_LT(mall::unix_listen(file, 0600, &why), 0);
    EXPECT_NE(why.find("not a socket"), std::string::npos) << why;
    struct stat st;
    EXPECT_EQ(stat(file.c_str(), &st), 0) << "the file must not be removed";
    unlink(file.c_str());

    // A stale socket: bound, then its listener closed without unlinking.
    {
        mall::UniqueFd stale(mall::unix_listen(socket_, 0600, &why));
        ASSERT_TRUE(stale) << why;
    }
    mall::UniqueFd live(mall::unix_listen(socket_, 0600, &why));
    ASSERT_TRUE(live) << "a stale socket should be replaced: " << why;
    EXPECT_LT(mall::unix_listen(socket_, 0600, &why), 0) << "a live socket must not be taken over";
    EXPECT_EQ(errno, EADDRINUSE);
    EXPECT_NE(why.find("listening"), std::string::npos) << why;
    live.reset();
    unlink(socket_.c_str());

    // Missing parent folders are created.
    std::string nested = dir_ + "/a/b/malld.sock";
    mall::UniqueFd created(mall::unix_listen(nested, 0666, &why));
    ASSERT_TRUE(created) << why;
    ASSERT_EQ(stat(nested.c_str(), &st), 0);
    EXPECT_TRUE(S_ISSOCK(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0666u);
    created.reset();
    unlink(nested.c_str());
    rmdir((dir_ + "/a/b").c_str());
    rmdir((dir_ + "/a").c_str());
}

TEST_F(ClientTest, PacketsCarryDescriptorsAndTruncationIsReported) {
    std::string why;
    mall::UniqueFd listener(mall::unix_listen(socket_, 0600, &why));
    ASSERT_TRUE(listener) << why;
    mall::UniqueFd client(mall::unix_connect(socket_));
    ASSERT_TRUE(client);
    mall::UniqueFd server(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    ASSERT_TRUE(server);

    mall::PeerCred cred;
    ASSERT_TRUE(mall::peer_credentials(server.get(), &cred));
    EXPECT_EQ(cred.pid, getpid());
    EXPECT_EQ(cred.uid, getuid());

    int pipe_fds[2];
    ASSERT_EQ(pipe(pipe_fds), 0);
    ASSERT_TRUE(mall::send_packet(server.get(), "hello", pipe_fds[1]));
    close(pipe_fds[1]);
    std::string data;
    int received = -1;
    ASSERT_EQ(mall::recv_packet(client.get(), &data, 100, &received), 5);
    EXPECT_EQ(data, "hello");
    ASSERT_GE(received, 0);
    EXPECT_TRUE(fcntl(received, F_GETFD) & FD_CLOEXEC) << "passed descriptors must be close-on-exec";
    ASSERT_EQ(write(received, "x", 1), 1);
    char byte = 0;
    ASSERT_EQ(read(pipe_fds[0], &byte, 1), 1);
    EXPECT_EQ(byte, 'x');
    close(received);
    close(pipe_fds[0]);

    ASSERT_TRUE(mall::send_packet(server.get(), std::string(200, 'z')));
    EXPECT_EQ(mall::recv_packet(client.get(), &data, 100), -1);
    EXPECT_EQ(errno, EMSGSIZE);

    EXPECT_EQ(mall::wait_readable(client.get(), 0ms), 0);
    EXPECT_EQ(mall::recv_packet(client.get(), &data, 100, nullptr, /*nonblocking=*/true), -1);
    EXPECT_EQ(errno, EAGAIN);
    server.reset();
    EXPECT_EQ(mall::wait_readable(client.get(), 5000ms), 1);
    EXPECT_EQ(mall::recv_packet(client.get(), &data, 100), 0) << "hang-up reads as 0";
    EXPECT_FALSE(mall::send_packet(client.get(), "late")) << "no SIGPIPE, just an error";
    EXPECT_EQ(errno, EPIPE);
}

TEST_F(ClientTest, CtlClientWaitsForItsReplyAndExplainsFailures) {
    std::string error;
    EXPECT_FALSE(mall::CtlClient::connect(socket_, &error).has_value());
    EXPECT_NE(error.find(socket_), std::string::npos) << error;
    EXPECT_NE(error.find("is malld running"), std::string::npos) << error;

    const uint16_t v = mall::proto::kVersion;
    using mall::proto::Type;
    {
        ScriptedServer server(socket_, std::vector<std::string>{
                                           reply_packet(v, {{"generation", 3}}, Type::Notify, 0),
                                           reply_packet(v, {{"event", "publish"}}, Type::Event, 0),
                                           reply_packet(v, mall::proto::ok_reply({{"other", 1}}), Type::Reply, 99),
                                           reply_packet(v, mall::proto::ok_reply({{"pool", "0-1"}}), Type::Reply, 1)});
        auto ctl = mall::CtlClient::connect(socket_, &error);
        ASSERT_TRUE(ctl.has_value()) << error;
        mall::CtlResult result = ctl->request(Type::Status, nlohmann::json::object(), 5s);
        EXPECT_TRUE(result.ok) << result.error;
        EXPECT_EQ(result.body.value("pool", ""), "0-1");
    }
    unlink(socket_.c_str());
    {
        ScriptedServer server(socket_, reply_packet(v, mall::proto::error_reply(MALL_ERR_DENIED, "not an admin")));
        auto ctl = mall::CtlClient::connect(socket_, &error);
        ASSERT_TRUE(ctl.has_value()) << error;
        mall::CtlResult result = ctl->request(Type::Set, {{"job", "a"}, {"cpus", "0"}}, 5s);
        EXPECT_FALSE(result.ok);
        EXPECT_EQ(result.code, MALL_ERR_DENIED);
        EXPECT_EQ(result.error, "not an admin");
    }
    unlink(socket_.c_str());
    {
        ScriptedServer server(socket_, std::vector<std::string>{});  // never answers
        auto ctl = mall::CtlClient::connect(socket_, &error);
        ASSERT_TRUE(ctl.has_value()) << error;
        mall::CtlResult result = ctl->request(Type::Status, nlohmann::json::object(), 200ms);
        EXPECT_FALSE(result.ok);
        EXPECT_EQ(result.code, MALL_ERR_NODAEMON);
        EXPECT_NE(result.error.find("did not answer"), std::string::npos) << result.error;
    }
    unlink(socket_.c_str());
    {
        ScriptedServer server(socket_, reply_packet(2, mall::proto::ok_reply()));
        auto ctl = mall::CtlClient::connect(socket_, &error);
        ASSERT_TRUE(ctl.has_value()) << error;
        mall::CtlResult result = ctl->request(Type::Status, nlohmann::json::object(), 5s);
        EXPECT_FALSE(result.ok);
        EXPECT_EQ(result.code, MALL_ERR_VERSION);
        EXPECT_NE(result.error.find("protocol version 2"), std::string::npos) << result.error;
    }
}

// Issue 11 (error text used as an API): libmall and CtlClient take MALL_ERR_VERSION from decode()'s
// reason. A peer of another version whose header is shorter than ours is still "another version"
// (CtlClient used to see "truncated packet" there and say MALL_ERR_PROTOCOL), and a packet that is
// not mall's at all is MALL_ERR_PROTOCOL for both.
TEST_F(ClientTest, VersionAndProtocolErrorsComeFromTheDecodeReason) {
    std::string short_other_version = reply_packet(2, mall::proto::ok_reply()).substr(0, 8);
    std::string bad_magic = reply_packet(mall::proto::kVersion, mall::proto::ok_reply({{"job", "x"}}));
    bad_magic[0] = 'X';
    struct Case {
        std::string packet;
        int code;
        const char *words;
    };
    for (const Case &c : {Case{short_other_version, MALL_ERR_VERSION, "version 2"},
                          Case{bad_magic, MALL_ERR_PROTOCOL, "bad magic"}}) {
        mall_error_t err{};
        mall_t *m = nullptr;
        {
            ScriptedServer server(socket_, c.packet);
            EXPECT_EQ(mall_open(socket_.c_str(), &m, &err), c.code) << err.text;
            mall_close(m);
        }
        EXPECT_NE(std::string(err.text).find(c.words), std::string::npos) << err.text;
        unlink(socket_.c_str());
        {
            ScriptedServer server(socket_, c.packet);
            std::string error;
            auto ctl = mall::CtlClient::connect(socket_, &error);
            ASSERT_TRUE(ctl.has_value()) << error;
            mall::CtlResult result = ctl->request(mall::proto::Type::Status, nlohmann::json::object(), 5s);
            EXPECT_FALSE(result.ok);
            EXPECT_EQ(result.code, c.code) << result.error;
            EXPECT_NE(result.error.find(c.words), std::string::npos) << result.error;
        }
        unlink(socket_.c_str());
    }
}

// Issue 11 (connect advice written twice): one explanation of a failed connect for the tools and
// libmall; each names the socket the way its user does (--socket, MALL_SOCKET), and the tools read
// "nobody listens there" from a field instead of cutting the sentence.
TEST(ConnectFailure, OneExplanationForToolsAndLibrary) {
    using mall::SocketNaming;
    const std::string path = "/tmp/mall-nowhere/malld.sock";
    struct Case {
        int err;
        int code;
        bool nobody_listening;
        const char *advice;  // in the advice for both namings
    };
    for (const Case &c : {Case{ENOENT, MALL_ERR_NODAEMON, true, "is malld running?"},
                          Case{ECONNREFUSED, MALL_ERR_NODAEMON, true, "is malld running?"},
                          Case{EACCES, MALL_ERR_NODAEMON, false, "permissions"},
                          Case{EPERM, MALL_ERR_NODAEMON, false, "permissions"},
                          Case{ENAMETOOLONG, MALL_ERR_NODAEMON, false, "107 bytes at most"},
                          Case{EAGAIN, MALL_ERR_NODAEMON, false, "not accepting connections"},
                          Case{EMFILE, MALL_ERR_SYSTEM, false, ""},
                          Case{ENOMEM, MALL_ERR_SYSTEM, false, ""},
                          Case{EIO, MALL_ERR_NODAEMON, false, "names malld's socket"}}) {
        for (SocketNaming naming : {SocketNaming::Option, SocketNaming::Environment}) {
            mall::ConnectFailure f = mall::explain_connect_failure(path, c.err, naming);
            const std::string label = std::string(std::strerror(c.err)) +
                                      (naming == SocketNaming::Option ? " (tool)" : " (library)");
            EXPECT_EQ(f.code, c.code) << label;
            EXPECT_EQ(f.nobody_listening, c.nobody_listening) << label;
            EXPECT_EQ(f.what, "cannot connect to malld at " + path + ": " + std::strerror(c.err)) << label;
            EXPECT_NE(f.advice.find(c.advice), std::string::npos) << label << ": " << f.advice;
            EXPECT_EQ(f.text(), f.advice.empty() ? f.what : f.what + "; " + f.advice) << label;
            // Advice that names the socket names it the way this user sets it (malld's own
            // --socket-mode is about malld, not about this user's knob).
            auto mentions = [&](const std::string &name) {
                for (size_t at = f.advice.find(name); at != std::string::npos; at = f.advice.find(name, at + 1))
                    if (f.advice.compare(at, name.size() + 1, name + "-") != 0) return true;
                return false;
            };
            if (mentions("--socket") || mentions("MALL_SOCKET")) {
                const bool tool = naming == SocketNaming::Option;
                EXPECT_TRUE(mentions(tool ? "--socket" : "MALL_SOCKET")) << label << ": " << f.advice;
                EXPECT_FALSE(mentions(tool ? "MALL_SOCKET" : "--socket")) << label << ": " << f.advice;
            }
        }
    }
    // CtlClient::connect gives the same, as words and as parts.
    std::string error;
    mall::ConnectFailure failure;
    EXPECT_FALSE(mall::CtlClient::connect(path, &error, &failure).has_value());
    EXPECT_TRUE(failure.nobody_listening);
    EXPECT_EQ(error, failure.text());
    EXPECT_EQ(error, mall::explain_connect_failure(path, ENOENT, SocketNaming::Option).text());
}

// mall_open() explains a missing malld with the library's naming of the socket.
TEST_F(ClientTest, OpenWithoutMalldNamesMallSocket) {
    mall_error_t err{};
    mall_t *m = open_handle(MALL_ERR_NODAEMON, &err);
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(std::string(err.text),
              mall::explain_connect_failure(socket_, ENOENT, mall::SocketNaming::Environment).text().substr(
                  0, sizeof err.text - 1));
    EXPECT_NE(std::string(err.text).find(socket_), std::string::npos) << err.text;
}
