// SPDX-License-Identifier: BSD-3-Clause
// ctl_client.hpp — a blocking request/reply client for malld, used by mallctl, mallrun, the Slurm
// plugin and the tests. One connection, one outstanding request at a time. Never throws. Also what
// every client (these and libmall) shares about reaching malld: which socket to use, and what to
// say when nothing answers there.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "mall/mall.h"
#include "protocol.hpp"
#include "unix_socket.hpp"

namespace mall {

// How the user names malld's socket, so that advice points at the knob they can turn: the tools
// take --socket, libmall reads mall_open()'s argument or $MALL_SOCKET.
enum class SocketNaming { Option, Environment };

// A failed connection to malld, as a code and in words (the same for the tools and libmall).
struct ConnectFailure {
    int code = MALL_ERR_NODAEMON;   // MALL_ERR_NODAEMON, or MALL_ERR_SYSTEM when this process is out
                                    // of descriptors or memory
    bool nobody_listening = false;  // ENOENT / ECONNREFUSED: no malld at that path (not running,
                                    // or the socket is elsewhere)
    bool not_malld = false;         // something answers there, but server_identity_problem says it
                                    // is not malld: no "is malld running?" hint applies
    std::string what;               // "cannot connect to malld at PATH: <strerror>"
    std::string advice;             // how to fix it ("is malld running? start it or pass --socket");
                                    // empty when there is nothing to add to `what`
    std::string text() const { return advice.empty() ? what : what + "; " + advice; }
};

// Explains a connect(2) to malld's socket at path that failed with errno err.
ConnectFailure explain_connect_failure(const std::string &path, int err, SocketNaming naming);

// Whether the server that sock reached through the socket file at path may be malld: "" when it
// may, else the refusal in words (short: libmall's mall_error_t keeps 160 bytes; the caller adds
// where to look). The rule, for libmall and every tool alike: the server's SO_PEERCRED uid (the
// one it had when it listened) is root (a node's malld), this process's user (a private malld of
// the user's own), or the owner of the socket file (malld under a service account of its own)
// where only root and that owner decide what path leads to: every folder a name of path is looked
// up in (those of its symlinks' targets too) is owned by root or the owner and writable by neither
// group nor others, a sticky one included. bind() makes every listener its socket file's owner,
// so the owner alone vouches for nothing: a user who made /tmp/mall first listens there as its
// owner. A rootless container sees host root as the overflow uid and its own / as root's: malld's
// socket folder, mounted from the host, owned by "the overflow uid" as the socket, still passes.
// Inside a user namespace a server that reads as the overflow uid and owns its socket is taken
// wherever the socket lies (the container's creator chose the mount; mallrun --container and the
// OCI hook checked the server from the host first).
// Anyone else (a local user, or a container's root, listening on a path a client was pointed at)
// is not malld. The owner is that of the file connect(2) reached: stat, not lstat, follows a
// symlink as connect did, and only a socket counts (a swapped-in other file names no server).
std::string server_identity_problem(int sock, const std::string &path);

struct CtlResult {
    bool ok = false;
    nlohmann::json body;  // the reply body (ok or not)
    std::string error;    // when !ok: malld's error text, or the transport failure in words
    int code = 0;         // malld's error code (mall_rc value) or MALL_ERR_NODAEMON / _PROTOCOL
};

class CtlClient {
public:
    // Connects; on failure returns nullopt, *error says what failed and how to fix it (e.g.
    // "cannot connect to malld at /run/mall/malld.sock: No such file or directory; is malld
    // running? start it or pass --socket": explain_connect_failure(..., Option).text()) and
    // *failure, when given, holds the same as a code and parts. Either pointer may be null.
    // A server that is not malld by server_identity_problem's rule is such a failure too
    // (MALL_ERR_NODAEMON, "refusing the server at PATH: it runs as uid N, ...: not malld").
    // Waits at most max_wait for malld to take the connection (a stopped or overloaded malld's
    // full backlog): then it fails with ETIMEDOUT's words.
    static std::optional<CtlClient> connect(const std::string &socket_path, std::string *error,
                                            ConnectFailure *failure = nullptr,
                                            std::chrono::milliseconds max_wait = kDefaultConnectWait);

    // Sends a request and waits for its reply; the whole exchange (sending included: a stopped
    // malld's queue fills) takes at most timeout, which also covers deferred replies such as
    // register and reclaim, sent once the cpus have moved. When malld refused the connection
    // itself (proto::kConnectionRefusalId) the result carries its words.
    CtlResult request(proto::Type type, const nlohmann::json &body,
                      std::chrono::milliseconds timeout = std::chrono::seconds(30));

    // After a Watch request: the next event body, or nullopt on timeout / hang-up (*closed set).
    std::optional<nlohmann::json> next_event(std::chrono::milliseconds timeout, bool *closed);

    int fd() const { return fd_.get(); }
    const std::string &socket_path() const { return path_; }

private:
    CtlClient(UniqueFd fd, std::string path) : fd_(std::move(fd)), path_(std::move(path)) {}
    UniqueFd fd_;
    std::string path_;
    uint32_t next_id_ = 1;
};

// After a send to or receive from malld failed because it hung up (EPIPE, ECONNRESET): malld may
// have refused the connection with words first (a Reply with proto::kConnectionRefusalId, still in the receive queue). Returns
// that refusal (its code and "malld refused the connection: <words>"), or nullopt. Never waits.
std::optional<proto::ReplyOutcome> pending_refusal(int fd);

// The socket path a client should use: the explicit option (or mall_open() argument), else
// $MALL_SOCKET, else kDefaultSocketPath.
std::string resolve_socket_path(const std::string &option_value);

}  // namespace mall
