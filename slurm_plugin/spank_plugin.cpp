// SPDX-License-Identifier: BSD-3-Clause
// spank_plugin.cpp — the process's plugin setup: Slurm's release compared with ours and the
// plugstack.conf arguments read, each once per process, and the log helpers every file uses.
// Contract: a wrong release or bad arguments are said once (slurm_error: logs and the user's
// stderr) and turn the plugin off in this process; jobs keep running (the plugin is `optional`).
#include <cstdarg>
#include <cstdio>
#include <string>

#include "slurm_release.hpp"
#include "spank_plugin.hpp"

namespace mall::spank {
namespace {

// The plugin's setup in this process (see spank_plugin.hpp for the other files' state).
struct PluginSetup {
    bool configured = false;       // plugstack arguments looked at (once per process)
    bool enabled = false;          // plugstack arguments parsed fine
    mall::slurm::PlugstackConfig config;
    bool release_checked = false;  // the running Slurm's release compared with ours (once)
    bool wrong_release = false;    // built for another Slurm release: everything stays off
};
PluginSetup g_setup;

std::string format_text(const char *fmt, va_list ap) {
    char buf[1024];
    vsnprintf(buf, sizeof buf, fmt, ap);
    return buf;
}

// Slurm 22.05's and 24.11's loaders refuse a SPANK plugin of another release before it runs;
// a loader that does not (older ones skipped the check for spank) would run it with the other
// release's struct layouts: compare once per process and stay off, with the words of
// slurm_release.hpp (slurmd's and the step's logs, the user's srun/sbatch stderr), when the release
// differs. MALL_SPANK_BUILT_FOR (default SLURM_VERSION_NUMBER) lets a hand-made test build claim
// another release while its plugin_version still passes the loader.
#ifndef MALL_SPANK_BUILT_FOR
#define MALL_SPANK_BUILT_FOR SLURM_VERSION_NUMBER
#endif
bool right_release(spank_t sp) {
    if (g_setup.release_checked) return !g_setup.wrong_release;
    g_setup.release_checked = true;
    char *major = nullptr, *minor = nullptr, *full = nullptr;  // S_SLURM_VERSION*: every context
    if (spank_get_item(sp, S_SLURM_VERSION_MAJOR, &major) != ESPANK_SUCCESS) major = nullptr;
    if (spank_get_item(sp, S_SLURM_VERSION_MINOR, &minor) != ESPANK_SUCCESS) minor = nullptr;
    if (spank_get_item(sp, S_SLURM_VERSION, &full) != ESPANK_SUCCESS) full = nullptr;
    if (auto text = mall::slurm::release_mismatch(MALL_SPANK_BUILT_FOR, major, minor, full)) {
        slurm_error("mall: %s", text->c_str());
        g_setup.wrong_release = true;
    }
    return !g_setup.wrong_release;
}

}  // namespace

const mall::slurm::PlugstackConfig &config() { return g_setup.config; }

bool wrong_release() { return g_setup.wrong_release; }

// Slurm calls slurm_spank_init in srun/sbatch/salloc and slurmstepd, but not in the job
// prolog/epilog process (22.05 goes straight to job_prolog/job_epilog), so every callback makes
// sure the release was checked and the arguments were read.
bool enabled(spank_t sp, int ac, char **av) {
    if (!right_release(sp)) return false;
    if (g_setup.configured) return g_setup.enabled;
    g_setup.configured = true;
    std::string error;
    auto parsed = mall::slurm::parse_plugstack_args(ac, av, &error);
    if (!parsed) {
        // Logged in every context; jobs keep running (the plugin is loaded `optional`).
        slurm_error("mall: %s; the mall plugin is disabled, --malleable jobs run non-malleable", error.c_str());
        g_setup.enabled = false;
        return false;
    }
    g_setup.config = *parsed;
    g_setup.enabled = true;
    return true;
}

void tell_user(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string text = format_text(fmt, ap);
    va_end(ap);
    slurm_error("mall: %s", text.c_str());
}

void log_info(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string text = format_text(fmt, ap);
    va_end(ap);
    slurm_info("mall: %s", text.c_str());
}

void log_debug(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string text = format_text(fmt, ap);
    va_end(ap);
    slurm_debug("mall: %s", text.c_str());
}

}  // namespace mall::spank
