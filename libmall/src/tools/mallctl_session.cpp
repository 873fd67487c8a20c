// SPDX-License-Identifier: BSD-3-Clause
// mallctl_session.cpp — mallctl's connection to malld and the helpers its commands share (see
// mallctl_session.hpp).
#include "tools/mallctl_session.hpp"

#include <iostream>

#include "mall/mall.h"
#include "tools/exit_codes.hpp"

namespace po = boost::program_options;
using nlohmann::json;

namespace mall::tools {

Session::Session(const std::string &socket_path) : path_(mall::resolve_socket_path(socket_path)) {}

bool Session::connect() {
    mall::ConnectFailure failure;
    client_ = mall::CtlClient::connect(path_, nullptr, &failure);
    if (!client_) {
        unreachable(failure);
        return false;
    }
    return true;
}

// When nobody listens there, the fuller hint below (how to start malld on this path) replaces
// the short advice; a server that is not malld gets only its refusal and advice.
void Session::unreachable(const mall::ConnectFailure &failure) const {
    if (failure.not_malld) {
        std::cerr << "mallctl: " << failure.text() << "\n";
        return;
    }
    std::cerr << "mallctl: " << (failure.nobody_listening ? failure.what : failure.text()) << "\n"
              << "  is malld running? start it with `malld --socket " << path_
              << "` or pass --socket / set MALL_SOCKET\n";
}

std::optional<json> Session::request(mall::proto::Type type, const json &body, int *exit_code,
                                     std::chrono::milliseconds timeout) {
    mall::CtlResult r = client_->request(type, body, timeout);
    if (r.ok) return r.body;
    if (r.code == MALL_ERR_NODAEMON) {  // no answer, or the connection broke
        std::cerr << "mallctl: " << r.error << "\n";
        *exit_code = kExitUnreachable;
    } else {
        std::cerr << "mallctl: malld refused: " << r.error << "\n";
        *exit_code = kExitRefused;
    }
    return std::nullopt;
}

po::variables_map parse_command(const std::vector<std::string> &args, const po::options_description &options,
                                const po::positional_options_description &positional, int style) {
    po::variables_map vm;
    po::store(po::command_line_parser(args).options(options).positional(positional).style(style).run(), vm);
    po::notify(vm);
    return vm;
}

StatusFetcher status_fetcher(const Globals &g, std::chrono::milliseconds timeout) {
    return [socket = g.socket, timeout](int *exit_code) -> std::optional<json> {
        Session s(socket);
        if (!s.connect()) {
            *exit_code = kExitUnreachable;
            return std::nullopt;
        }
        auto body = s.request(mall::proto::Type::Status, json::object(), exit_code, timeout);
        if (body) body->erase("ok");
        return body;
    };
}

std::string text_or_dash(const std::string &s) { return s.empty() ? "-" : s; }

std::string field_string(const json &j, const char *key) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return "";
    if (it->is_string()) return it->get<std::string>();
    return it->dump();
}

}  // namespace mall::tools
