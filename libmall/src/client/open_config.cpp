// SPDX-License-Identifier: BSD-3-Clause
// open_config.cpp — see open_config.hpp. The words of every refusal are part of the interface
// (users and tests read them): change them only on purpose.
#include "open_config.hpp"

#include <signal.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include "common/protocol.hpp"
#include "common/rules.hpp"
#include "error_text.hpp"

namespace mall::client {

namespace {

constexpr long kMaxAttachTimeoutMs = 60000;  // $MALL_ATTACH_TIMEOUT_MS's bound

// Parses $name as an integer in [min, max]; unset or empty gives fallback. False when malformed.
bool env_int(const char *name, long min, long max, long fallback, long *out) {
    const char *text = std::getenv(name);
    if (!text || !*text) {
        *out = fallback;
        return true;
    }
    errno = 0;
    char *end = nullptr;
    long value = std::strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value < min || value > max) return false;
    *out = value;
    return true;
}

// A notification signal's name or number: SIGUSR1, SIGUSR2, SIGRTMIN, SIGRTMIN+N, SIGRTMAX-N,
// SIGRTMAX (the "SIG" prefix may be left out) or its number; only those signals are allowed (the
// others have meanings of their own). 0 with *why when not.
int parse_notify_signal(const std::string &text, std::string *why) {
    std::string s = text;
    if (s.rfind("SIG", 0) == 0) s = s.substr(3);
    auto number = [](const std::string &digits, long *out) {
        if (digits.empty() || digits.size() > 4) return false;
        for (char c : digits)
            if (c < '0' || c > '9') return false;
        *out = std::strtol(digits.c_str(), nullptr, 10);
        return true;
    };
    long sig = -1, n = 0;
    if (s == "USR1") sig = SIGUSR1;
    else if (s == "USR2") sig = SIGUSR2;
    else if (s == "RTMIN") sig = SIGRTMIN;
    else if (s == "RTMAX") sig = SIGRTMAX;
    else if (s.rfind("RTMIN+", 0) == 0 && number(s.substr(6), &n)) sig = SIGRTMIN + n;
    else if (s.rfind("RTMAX-", 0) == 0 && number(s.substr(6), &n)) sig = SIGRTMAX - n;
    else if (!number(s, &sig)) sig = -1;
    if (sig == SIGUSR1 || sig == SIGUSR2 || (sig >= SIGRTMIN && sig <= SIGRTMAX)) return static_cast<int>(sig);
    *why = "'" + text + "' is not SIGUSR1, SIGUSR2 or a real-time signal SIGRTMIN..SIGRTMAX (SIGRTMIN+N, SIGRTMAX-N, " +
           std::to_string(SIGRTMIN) + ".." + std::to_string(SIGRTMAX) + " here)";
    return 0;
}

}  // namespace

int check_open_options(const mall_open_options_t *options, mall_error_t *err) {
    // The options of API 0.3.0 (a caller built against a later header may pass a larger struct
    // whose extra bytes must then be zero: options this library does not know are refused).
    constexpr size_t kKnownSize = sizeof(mall_open_options_t);  // with its tail padding
    if (!options || options->size < kKnownSize) {
        set_error(err, "mall_open_ex: options must be set up with MALL_OPEN_OPTIONS_INIT (size %zu or more)", kKnownSize);
        return MALL_ERR_INVAL;
    }
    for (size_t i = kKnownSize; i < options->size; ++i) {
        if (reinterpret_cast<const unsigned char *>(options)[i] != 0) {
            set_error(err, "mall_open_ex: options of a newer libmall are set (byte %zu); this library is API %d.%d.%d",
                      i, MALL_API_VERSION_MAJOR, MALL_API_VERSION_MINOR, MALL_API_VERSION_PATCH);
            return MALL_ERR_INVAL;
        }
    }
    if (options->flags != 0) {
        set_error(err, "mall_open_ex: unknown flags 0x%x (none are defined in API %d.%d)", options->flags,
                  MALL_API_VERSION_MAJOR, MALL_API_VERSION_MINOR);
        return MALL_ERR_INVAL;
    }
    return MALL_SUCCESS;
}

int read_open_config(const mall_open_options_t *options, OpenConfig *config, mall_error_t *err) {
    // The notification signal: the option, else $MALL_NOTIFY_SIGNAL, else none.
    int notify_signal = 0;
    if (options->notify_signal > 0) {
        std::string why;
        notify_signal = parse_notify_signal(std::to_string(options->notify_signal), &why);
        if (notify_signal == 0) {
            set_error(err, "mall_open_ex: notify_signal %s", why.c_str());
            return MALL_ERR_INVAL;
        }
    } else if (options->notify_signal == 0) {
        const char *env = std::getenv(mall::kNotifySignalEnv);
        if (env && *env) {
            std::string why;
            notify_signal = parse_notify_signal(env, &why);
            if (notify_signal == 0) {
                set_error(err, "%s: %s; unset it or name one of those", mall::kNotifySignalEnv, why.c_str());
                return MALL_ERR_INVAL;
            }
        }
    } else if (options->notify_signal != -1) {
        set_error(err, "mall_open_ex: notify_signal must be -1 (none), 0 ($MALL_NOTIFY_SIGNAL) or a signal number");
        return MALL_ERR_INVAL;
    }
    // Control by signal: the option, else $MALL_SIGNAL_CONTROL (1 = the default signal), else off.
    int control_signal = 0;
    {
        std::string text;
        if (options->control_signal > 0) {
            text = std::to_string(options->control_signal);
        } else if (options->control_signal == 0) {
            const char *env = std::getenv(mall::kSignalControlEnv);
            text = env ? env : "";
            if (text == "0") text.clear();
            if (text == "1") text = "SIGRTMAX-7";
        } else if (options->control_signal != -1) {
            set_error(err, "mall_open_ex: control_signal must be -1 (off), 0 ($MALL_SIGNAL_CONTROL) or a real-time signal");
            return MALL_ERR_INVAL;
        }
        if (!text.empty()) {
            std::string why;
            control_signal = parse_notify_signal(text, &why);
            if (control_signal == SIGUSR1 || control_signal == SIGUSR2) {
                control_signal = 0;
                why = "'" + text + "' is not a real-time signal (a standard signal would drop queued values)";
            }
            if (control_signal == 0) {
                set_error(err, "%s (or control_signal): %s; use 1 for SIGRTMAX-7", mall::kSignalControlEnv, why.c_str());
                return MALL_ERR_INVAL;
            }
            if (control_signal == notify_signal) {
                set_error(err, "the control signal %d is also the notification signal: choose two", control_signal);
                return MALL_ERR_INVAL;
            }
        }
    }
    // The attach request, from the environment the launcher set.
    const char *job = std::getenv(mall::kJobIdEnv);
    if (job && *job) {
        if (auto bad = mall::proto::invalid_job_name(job)) {
            set_error(err, "%s is not a valid job name: %s", mall::kJobIdEnv, bad->c_str());
            return MALL_ERR_INVAL;
        }
        config->attach_body["job"] = job;
    } else {
        long min = 1, max = 0;
        if (!env_int(mall::kMinEnv, 1, MALL_MAX_CPUS, 1, &min)) {
            set_error(err, "%s must be a whole number from 1 to %d (or unset)", mall::kMinEnv, MALL_MAX_CPUS);
            return MALL_ERR_INVAL;
        }
        if (!env_int(mall::kMaxEnv, 0, MALL_MAX_CPUS, 0, &max)) {
            set_error(err, "%s must be a whole number from 0 (whole pool) to %d (or unset)", mall::kMaxEnv, MALL_MAX_CPUS);
            return MALL_ERR_INVAL;
        }
        if (max != 0 && max < min) {
            set_error(err, "%s (%ld) is below %s (%ld)", mall::kMaxEnv, max, mall::kMinEnv, min);
            return MALL_ERR_INVAL;
        }
        config->attach_body["min"] = min;
        if (max != 0) config->attach_body["max"] = max;  // no "max" asks for up to the whole pool
    }

    long attach_timeout_ms = 0;
    if (!env_int(mall::kAttachTimeoutEnv, 0, kMaxAttachTimeoutMs, kDefaultAttachTimeout.count(),
                 &attach_timeout_ms)) {
        set_error(err, "%s must be a whole number of milliseconds from 0 to %ld (or unset)",
                  mall::kAttachTimeoutEnv, kMaxAttachTimeoutMs);
        return MALL_ERR_INVAL;
    }
    config->attach_timeout = milliseconds(attach_timeout_ms);
    config->notify_signal = notify_signal;
    config->control_signal = control_signal;
    return MALL_SUCCESS;
}

}  // namespace mall::client
