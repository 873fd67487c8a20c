// SPDX-License-Identifier: BSD-3-Clause
// open_config.hpp — what mall_open_ex() reads before it creates a handle: its options struct and
// the environment the launcher set ($MALL_JOB_ID, else the self-registration's $MALL_MIN and
// $MALL_MAX; $MALL_ATTACH_TIMEOUT_MS; $MALL_NOTIFY_SIGNAL; $MALL_SIGNAL_CONTROL).
// Contract: an option set in the struct wins over its variable; anything malformed is refused with
// MALL_ERR_INVAL and words in err that name the option or variable and how to fix it, before
// anything is created. Checks run in a fixed order (the first problem found is the one reported).
#pragma once

#include <chrono>
#include <string>

#include <nlohmann/json.hpp>

#include "handle.hpp"

namespace mall::client {

struct OpenConfig {
    int notify_signal = 0;   // 0 = none
    int control_signal = 0;  // 0 = no control by signal
    nlohmann::json attach_body = nlohmann::json::object();  // {"job"} or {"min"[, "max"]}
    milliseconds attach_timeout = kDefaultAttachTimeout;
};

// The options struct itself: its size (a newer caller's extra bytes must be zero) and flags.
// Never throws.
int check_open_options(const mall_open_options_t *options, mall_error_t *err);

// The signals, the attach request and the attach timeout, from options and the environment.
// May throw std::bad_alloc.
int read_open_config(const mall_open_options_t *options, OpenConfig *config, mall_error_t *err);

}  // namespace mall::client
