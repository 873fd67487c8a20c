// ctl_client.hpp — a blocking request/reply client for malld, used by mallctl, mallrun, the Slurm
// plugin and the tests. One connection, one outstanding request at a time. Never throws.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "protocol.hpp"
#include "unix_socket.hpp"

namespace mall {

struct CtlResult {
    bool ok = false;
    nlohmann::json body;  // the reply body (ok or not)
    std::string error;    // when !ok: malld's error text, or the transport failure in words
    int code = 0;         // malld's error code (mall_rc value) or MALL_ERR_NODAEMON / _PROTOCOL
};

class CtlClient {
public:
    // Connects; on failure returns nullopt and *error says what failed and how to fix it
    // (e.g. "cannot connect to malld at /run/mall/malld.sock: No such file or directory; is malld
    // running? start it or pass --socket").
    static std::optional<CtlClient> connect(const std::string &socket_path, std::string *error);

    // Sends a request and waits for its reply (timeout covers deferred replies such as register
    // and reclaim, which malld sends once the cpus have moved).
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

// The socket path a tool should use: the explicit option, else $MALL_SOCKET, else the default.
std::string resolve_socket_path(const std::string &option_value);

}  // namespace mall
