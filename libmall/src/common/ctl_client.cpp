// SPDX-License-Identifier: BSD-3-Clause
// ctl_client.cpp — blocking request/reply client for malld (see ctl_client.hpp).
// Contract: never throws; a connection is kept only to a server that may be malld
// (server_identity_problem); a request waits (bounded) for the Reply carrying its request id and
// skips Event/Notify packets; every failure comes back as a code and in words that say what to do
// about it.
#include "common/ctl_client.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

#include "mall/mall.h"

namespace mall {

namespace {

using Clock = std::chrono::steady_clock;

std::chrono::milliseconds remaining(Clock::time_point deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    return left.count() > 0 ? left : std::chrono::milliseconds(0);
}

CtlResult transport_failure(int code, std::string text) {
    CtlResult r;
    r.ok = false;
    r.code = code;
    r.error = std::move(text);
    return r;
}

}  // namespace

ConnectFailure explain_connect_failure(const std::string &path, int err, SocketNaming naming) {
    const bool option = naming == SocketNaming::Option;
    ConnectFailure f;
    f.what = "cannot connect to malld at " + path + ": " + std::strerror(err);
    switch (err) {
        case ENOENT:
        case ECONNREFUSED:
            f.nobody_listening = true;
            f.advice = option ? "is malld running? start it or pass --socket"
                              : "is malld running? start it or set MALL_SOCKET";
            break;
        case EACCES:
        case EPERM:
            f.advice = "check the permissions of the socket and its folder (malld --socket-mode)";
            break;
        case ENAMETOOLONG:
            f.advice = "the path is too long for a Unix socket (" + std::to_string(kMaxSocketPathBytes) +
                       " bytes at most), " + (option ? "pass a shorter --socket" : "set a shorter MALL_SOCKET");
            break;
        case ETIMEDOUT:
            f.what = "malld at " + path + " did not take the connection in time";
            f.advice = std::string("it is stopped, stuck or overloaded (its listen backlog is full); ") +
                       (option ? "check it with ps/top and try again" : "retrying in the background");
            break;
        case EAGAIN:
            // libmall keeps trying by itself; a tool's user runs the command again.
            f.advice = std::string("malld is not accepting connections (overloaded or stuck), ") +
                       (option ? "try again" : "retrying in the background");
            break;
        case EMFILE:
        case ENFILE:
        case ENOBUFS:
        case ENOMEM:
            f.code = MALL_ERR_SYSTEM;  // this process or host is short of resources, malld is not to blame
            break;
        default:
            f.advice = option ? "check that --socket names malld's socket"
                              : "check that MALL_SOCKET names malld's socket";
            break;
    }
    return f;
}

namespace {

// Decimal text by snprintf: std::to_string would export a libstdc++ template from libmall.so.
std::string decimal(unsigned long value) {
    char text[24];
    std::snprintf(text, sizeof text, "%lu", value);
    return std::string(text);
}

// The names of path, "" and "." left out ("/a//./b" -> a, b), last first: the stack that
// socket_lookup_problem pops.
void push_names_reversed(const std::string &path, std::vector<std::string> *pending) {
    std::vector<std::string> names;
    size_t start = 0;
    while (start <= path.size()) {
        size_t slash = path.find('/', start);
        if (slash == std::string::npos) slash = path.size();
        std::string name = path.substr(start, slash - start);
        if (!name.empty() && name != ".") names.push_back(std::move(name));
        start = slash + 1;
    }
    pending->insert(pending->end(), names.rbegin(), names.rend());
}

// Whether only root and `owner` may change what the names in a folder stand for: a folder owned
// by root or owner, writable by neither its group nor others. A sticky bit is no exception: in a
// sticky /tmp anyone may make a folder of their own (/tmp/mall) and bind malld's socket name in it.
bool only_root_or_owner_writes(const struct stat &st, uid_t owner) {
    return S_ISDIR(st.st_mode) && (st.st_uid == 0 || st.st_uid == owner) &&
           (st.st_mode & (S_IWGRP | S_IWOTH)) == 0;
}

// Walks path as connect(2) resolves it, one name at a time (symlinks followed: at most 40), and
// checks every folder a name is looked up in, those that symlinks lead to included: "" when only
// root and `owner` write each of them, with *reached the lstat of the file the path names; else
// the first other folder, with why, in words. Walked by hand rather than with realpath(): a
// symlink in a folder others write (/tmp/mall -> a folder of the owner's) is a step others decide.
std::string socket_lookup_problem(const std::string &path, uid_t owner, struct stat *reached) {
    std::vector<std::string> pending;  // the names still to look up, next at the back
    push_names_reversed(path, &pending);
    if (path.empty() || path[0] != '/') {
        char cwd[4096];
        if (::getcwd(cwd, sizeof cwd) == nullptr)
            return std::string("cannot learn the working folder: ") + std::strerror(errno);
        push_names_reversed(cwd, &pending);
    }
    std::string folder = "/";  // where the next name is looked up: no symlink in it, checked
    struct stat st{};
    if (::lstat("/", &st) != 0) return std::string("cannot stat /: ") + std::strerror(errno);
    if (!only_root_or_owner_writes(st, owner)) return "others may write /";
    int links = 0;
    while (!pending.empty()) {
        const std::string name = std::move(pending.back());
        pending.pop_back();
        if (name == "..") {  // the folder above: an ancestor of a checked folder, checked already
            const size_t slash = folder.find_last_of('/');
            folder = slash == 0 ? "/" : folder.substr(0, slash);
            continue;
        }
        const std::string next = (folder == "/" ? "" : folder) + "/" + name;
        if (::lstat(next.c_str(), &st) != 0) return "cannot stat " + next + ": " + std::strerror(errno);
        if (S_ISLNK(st.st_mode)) {
            char target[4096];
            const ssize_t n = ++links > 40 ? -1 : ::readlink(next.c_str(), target, sizeof target);
            if (n <= 0 || static_cast<size_t>(n) >= sizeof target) return "cannot follow " + next;
            const std::string text(target, static_cast<size_t>(n));
            push_names_reversed(text, &pending);
            if (text[0] == '/') folder = "/";
            continue;
        }
        if (pending.empty()) {
            *reached = st;
            return "";
        }
        if (!S_ISDIR(st.st_mode)) return next + " is not a folder";
        if (!only_root_or_owner_writes(st, owner)) return "others may write " + next;
        folder = next;
    }
    return "the path names no file";  // "/" or only "..": no socket
}

}  // namespace

namespace {

// Inside a user namespace other than the initial one, every host user outside its mapping (host
// root among them) reads as the overflow uid: a client there cannot tell malld from another
// unmapped user by uid, nor by the folders above the socket (a container's own /tmp is sticky and
// open). It takes such a server when it owns its socket: who serves there was chosen by whoever set
// up the container's mounts, and mallrun --container and the OCI hook checked the server from the
// host before the container started.
bool unmapped_server_in_a_user_namespace(uid_t server_uid) {
    std::ifstream map("/proc/self/uid_map");
    unsigned long inside = 0, outside = 0, count = 0;
    if (!(map >> inside >> outside >> count)) return false;
    const bool initial_namespace = inside == 0 && outside == 0 && count == 4294967295UL;
    if (initial_namespace) return false;
    std::ifstream overflow_file("/proc/sys/kernel/overflowuid");
    unsigned long overflow = 65534;
    overflow_file >> overflow;
    return server_uid == static_cast<uid_t>(overflow);
}

}  // namespace

std::string server_identity_problem(int sock, const std::string &path) {
    PeerCred peer;
    if (!peer_credentials(sock, &peer))
        return std::string("cannot learn who the server runs as (SO_PEERCRED): ") + std::strerror(errno);
    if (peer.uid == 0 || peer.uid == ::geteuid() || peer.uid == ::getuid()) return "";
    struct stat st{};
    const bool is_socket = ::stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
    // The words that matter first.
    if (!is_socket || st.st_uid != peer.uid)
        return "it runs as uid " + decimal(peer.uid) + ", not root, this user or the socket's owner (" +
               (is_socket ? "uid " + decimal(st.st_uid) : std::string("no socket")) + "): not malld";
    // bind() makes every listener the owner of its socket file, an impostor too: the owner is
    // malld only where root placed it (malld under a service account in a folder root made for
    // it), that is where nobody but root and the owner decides what the path leads to.
    struct stat reached{};
    std::string problem = socket_lookup_problem(path, peer.uid, &reached);
    if (problem.empty() && (reached.st_dev != st.st_dev || reached.st_ino != st.st_ino))
        problem = "the socket changed meanwhile";
    if (problem.empty() || unmapped_server_in_a_user_namespace(peer.uid)) return "";
    return "it runs as uid " + decimal(peer.uid) + ", not root or this user, and " + problem + ": not malld";
}

std::optional<CtlClient> CtlClient::connect(const std::string &socket_path, std::string *error,
                                            ConnectFailure *failure, std::chrono::milliseconds max_wait) {
    int fd = unix_connect(socket_path, std::max(max_wait, std::chrono::milliseconds(1)));
    if (fd < 0) {
        ConnectFailure f = explain_connect_failure(socket_path, errno, SocketNaming::Option);
        if (error) *error = f.text();
        if (failure) *failure = std::move(f);
        return std::nullopt;
    }
    UniqueFd sock(fd);
    if (std::string problem = server_identity_problem(sock.get(), socket_path); !problem.empty()) {
        ConnectFailure f;  // MALL_ERR_NODAEMON: whatever answers there, malld does not
        f.not_malld = true;
        f.what = "refusing the server at " + socket_path + ": " + problem;
        f.advice = "check that --socket (or MALL_SOCKET) names malld's socket";
        if (error) *error = f.text();
        if (failure) *failure = std::move(f);
        return std::nullopt;
    }
    return CtlClient(std::move(sock), socket_path);
}

namespace {

// A large reply's JSON from the sealed memfd malld passed (proto::kBodyInFdField): exactly
// `announced` bytes, at most proto::kMaxFdBody, sealed against writes, one JSON object.
std::optional<nlohmann::json> read_body_fd(int fd, const nlohmann::json &announced, std::string *why) {
    if (fd < 0) return *why = "no descriptor came with it", std::nullopt;
    if (!announced.is_number_unsigned() || announced.get<uint64_t>() > proto::kMaxFdBody)
        return *why = "its size is not a number up to " + std::to_string(proto::kMaxFdBody) + " bytes", std::nullopt;
    const int seals = ::fcntl(fd, F_GET_SEALS);
    struct stat st{};
    if (seals < 0 || !(seals & F_SEAL_WRITE) || ::fstat(fd, &st) != 0 ||
        static_cast<uint64_t>(st.st_size) != announced.get<uint64_t>())
        return *why = "the descriptor is not a sealed file of the announced size", std::nullopt;
    std::string text(static_cast<size_t>(st.st_size), '\0');
    size_t done = 0;
    while (done < text.size()) {
        const ssize_t n = ::pread(fd, text.data() + done, text.size() - done, static_cast<off_t>(done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return *why = std::string("reading it failed: ") + std::strerror(errno), std::nullopt;
        done += static_cast<size_t>(n);
    }
    nlohmann::json body = nlohmann::json::parse(text, nullptr, false);
    if (body.is_discarded() || !body.is_object()) return *why = "it is not a JSON object", std::nullopt;
    return body;
}

}  // namespace

CtlResult CtlClient::request(proto::Type type, const nlohmann::json &body, std::chrono::milliseconds timeout) {
    try {
        const char *what = proto::type_name(type);
        if (!fd_) return transport_failure(MALL_ERR_NODAEMON, "not connected to malld at " + path_);
        proto::Message msg;
        msg.type = type;
        msg.request_id = next_id_++;
        if (next_id_ == 0) next_id_ = 1;
        msg.body = body.is_object() ? body : nlohmann::json::object();
        msg.body[proto::kAcceptsBodyFdField] = true;  // a large reply may come in a memfd
        std::string packet;
        try {
            packet = proto::encode(msg);
        } catch (const std::length_error &e) {
            return transport_failure(MALL_ERR_INVAL, std::string("cannot send the ") + what + " request: " + e.what());
        }
        const auto deadline = Clock::now() + timeout;
        // The send shares the deadline: a stopped malld's full queue would block it for good.
        if (!set_send_timeout(fd_.get(), timeout) || !send_packet(fd_.get(), packet)) {
            int err = errno;
            if (auto refusal = pending_refusal(fd_.get())) return transport_failure(refusal->code, refusal->error);
            if (err == EAGAIN || err == EWOULDBLOCK)
                return transport_failure(MALL_ERR_NODAEMON,
                                         std::string("malld at ") + path_ + " did not take the " + what +
                                             " request within " + std::to_string(timeout.count()) +
                                             " ms (its queue is full); check that it is running and not stuck");
            return transport_failure(MALL_ERR_NODAEMON, std::string("cannot send the ") + what +
                                                            " request to malld at " + path_ + ": " +
                                                            std::strerror(err) + "; malld may have stopped");
        }

        std::string data;
        for (;;) {
            int ready = wait_readable(fd_.get(), remaining(deadline));
            if (ready == 0)
                return transport_failure(MALL_ERR_NODAEMON,
                                         std::string("malld at ") + path_ + " did not answer the " + what +
                                             " request within " + std::to_string(timeout.count()) +
                                             " ms; check that it is running and not stuck (or raise the timeout)");
            if (ready < 0) {
                int err = errno;
                return transport_failure(MALL_ERR_NODAEMON, std::string("waiting for malld's reply failed: ") +
                                                                std::strerror(err));
            }
            int passed = -1;
            ssize_t n = recv_packet(fd_.get(), &data, proto::kMaxPacket, &passed, true);
            UniqueFd body_fd(passed);  // a large reply's body (proto::kBodyInFdField)
            if (n == 0)
                return transport_failure(MALL_ERR_NODAEMON, std::string("malld at ") + path_ +
                                                                " closed the connection before answering the " +
                                                                what + " request (it stopped or restarted?)");
            if (n < 0) {
                int err = errno;
                if (err == EAGAIN || err == EWOULDBLOCK) continue;
                if (err == EMSGSIZE)
                    return transport_failure(MALL_ERR_PROTOCOL, "malld sent a packet larger than " +
                                                                    std::to_string(proto::kMaxPacket) + " bytes");
                if (auto refusal = pending_refusal(fd_.get())) return transport_failure(refusal->code, refusal->error);
                return transport_failure(MALL_ERR_NODAEMON, std::string("receiving malld's reply failed: ") +
                                                                std::strerror(err) +
                                                                " (malld stopped or restarted?)");
            }
            std::string why;
            proto::DecodeFailure failure;
            auto reply = proto::decode(data, &why, &failure);
            if (!reply)
                return transport_failure(proto::decode_error_code(failure.reason),
                                         "cannot read malld's reply: " + why);
            if (reply->type != proto::Type::Reply) continue;
            const bool refused_connection = reply->request_id == proto::kConnectionRefusalId;
            if (reply->request_id != msg.request_id && !refused_connection) continue;

            if (auto size = reply->body.find(proto::kBodyInFdField); size != reply->body.end()) {
                std::string body_error;
                auto large = read_body_fd(body_fd.get(), *size, &body_error);
                if (!large) return transport_failure(MALL_ERR_PROTOCOL, "cannot read malld's large reply: " + body_error);
                reply->body = std::move(*large);
            }
            proto::ReplyOutcome outcome = proto::read_reply(reply->body, what);
            CtlResult result;
            result.body = std::move(reply->body);
            result.ok = outcome.ok && !refused_connection;
            if (!result.ok) {
                result.code = outcome.ok ? MALL_ERR_PROTOCOL : outcome.code;
                result.error = refused_connection ? "malld refused the connection: " + outcome.error
                                                  : std::move(outcome.error);
            }
            return result;
        }
    } catch (const std::exception &e) {
        return transport_failure(MALL_ERR_SYSTEM, std::string("request failed: ") + e.what());
    } catch (...) {
        return transport_failure(MALL_ERR_SYSTEM, "request failed with an unknown error");
    }
}

std::optional<nlohmann::json> CtlClient::next_event(std::chrono::milliseconds timeout, bool *closed) {
    if (closed) *closed = false;
    try {
        if (!fd_) {
            if (closed) *closed = true;
            return std::nullopt;
        }
        auto deadline = Clock::now() + timeout;
        std::string data;
        for (;;) {
            int ready = wait_readable(fd_.get(), remaining(deadline));
            if (ready == 0) return std::nullopt;
            if (ready < 0) {
                if (closed) *closed = true;
                return std::nullopt;
            }
            int passed = -1;
            ssize_t n = recv_packet(fd_.get(), &data, proto::kMaxPacket, &passed, true);
            UniqueFd body_fd(passed);  // a large reply's body (proto::kBodyInFdField)
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EMSGSIZE)) continue;
            if (n <= 0) {
                if (closed) *closed = true;
                return std::nullopt;
            }
            auto msg = proto::decode(data, nullptr);
            if (!msg || msg->type != proto::Type::Event) continue;
            return std::move(msg->body);
        }
    } catch (...) {
        if (closed) *closed = true;
        return std::nullopt;
    }
}

std::optional<proto::ReplyOutcome> pending_refusal(int fd) {
    try {
        std::string data;
        // A hang-up with our request unread makes the first receive fail with ECONNRESET (the
        // error is reported, and cleared, before the queued packets).
        for (int resets = 0;;) {
            ssize_t n = recv_packet(fd, &data, proto::kMaxPacket, nullptr, /*nonblocking=*/true);
            if (n < 0 && errno == ECONNRESET && ++resets <= 2) continue;
            if (n <= 0) break;
            auto msg = proto::decode(data, nullptr);
            if (!msg || msg->type != proto::Type::Reply || msg->request_id != proto::kConnectionRefusalId) continue;
            proto::ReplyOutcome outcome = proto::read_reply(msg->body, "connection");
            if (outcome.ok) return std::nullopt;
            outcome.error = "malld refused the connection: " + outcome.error;
            return outcome;
        }
    } catch (...) {
    }
    return std::nullopt;
}

std::string resolve_socket_path(const std::string &option_value) {
    if (!option_value.empty()) return option_value;
    const char *env = std::getenv(kSocketEnv);
    if (env && *env) return env;
    return kDefaultSocketPath;
}

}  // namespace mall
