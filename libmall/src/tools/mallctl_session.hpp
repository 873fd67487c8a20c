// SPDX-License-Identifier: BSD-3-Clause
// mallctl_session.hpp — what mallctl's commands share: the global options, the one signature of
// every command (CommandHandler), one connection to malld (Session) that prints where it looked
// and how to fix it when malld cannot be reached or refuses, the status fetcher, the per-command
// option parsing, and two JSON field helpers.
// Contract: every failure is printed on stderr with mallctl's words; the exit code to use comes
// back to the caller (mallctl's: 1 malld refused, 3 malld unreachable).
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include "common/ctl_client.hpp"
#include "common/protocol.hpp"

namespace mall::tools {

// The global options (before or after the command).
struct Globals {
    std::string socket;  // --socket; empty: $MALL_SOCKET, else the default (resolve_socket_path)
};

// Prints a command's usage error (its words, its synopsis, where to read more) and returns 2.
using UsageError = std::function<int(const std::string &)>;

// Every command: the global options, its arguments (after its name), its usage error; returns
// mallctl's exit code. mallctl.cpp's command table holds one per command.
using CommandHandler = int (*)(const Globals &g, const std::vector<std::string> &args, const UsageError &usage_error);

// How a command gets malld's status: the status object, or none after printing why, with
// *exit_code set (3 when malld cannot be reached).
using StatusFetcher = std::function<std::optional<nlohmann::json>(int *exit_code)>;

// One connection to malld for one command.
class Session {
public:
    explicit Session(const std::string &socket_path);

    // Connects; on failure prints where it looked and how to fix it.
    bool connect();

    // Sends a request; on failure prints malld's words, sets *exit_code and returns nullopt.
    std::optional<nlohmann::json> request(mall::proto::Type type, const nlohmann::json &body, int *exit_code,
                                          std::chrono::milliseconds timeout = std::chrono::seconds(30));

    mall::CtlClient &client() { return *client_; }
    const std::string &path() const { return path_; }

private:
    // The connection failed: say where we looked and how to fix it.
    void unreachable(const mall::ConnectFailure &failure) const;

    std::string path_;
    std::optional<mall::CtlClient> client_;
};

// Parses a command's own arguments in the given command_line_style; throws
// boost::program_options::error on bad ones, which mallctl's dispatch (mallctl.cpp) turns into the
// command's usage error (unless the command catches it to say it in its own words).
boost::program_options::variables_map parse_command(
    const std::vector<std::string> &args, const boost::program_options::options_description &options,
    const boost::program_options::positional_options_description &positional,
    int style = boost::program_options::command_line_style::default_style);

// malld's status object (for status, and the reporting commands of tools/mallctl_reports.cpp).
// `timeout` bounds the request (a live view asks again soon, so it waits less than a script).
StatusFetcher status_fetcher(const Globals &g, std::chrono::milliseconds timeout = std::chrono::seconds(10));

// "-" for an empty text, else the text.
std::string text_or_dash(const std::string &s);
// A field of a JSON object as text: a string as it is, anything else as JSON, "" when absent or null.
std::string field_string(const nlohmann::json &j, const char *key);

}  // namespace mall::tools
