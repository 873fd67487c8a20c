// SPDX-License-Identifier: BSD-3-Clause
// mallctl_top_frame.hpp — what one refresh of `mallctl top` shows, as lines of text, from malld's
// status (the object `mallctl status --json` prints) or from why there is none. Pure: no terminal,
// no signals, no fetching (mallctl_top.cpp does those); the only outside reads are the local time
// zone (the header's clock) and gethostname() when the status names no host.
// Contract: render_frame never throws on an older or odd status: a missing or mistyped field
// shows "-" (or 0 for the totals). It does not cut lines to FrameInput::width: the table's
// titles and rows fit it, in columns, whenever the other columns leave CORES 8 cells (CORES is
// scaled down to make room, never below 8 cells), but the header and POOL lines may be longer;
// the live view's writer cuts every line with fit(). It does keep to FrameInput::height (less
// the footer's row when live): rows that do not fit give way to one "N more" line, and the
// header, POOL and table titles always stay.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/cpuset.hpp"

namespace mall::tools {

// ---------------------------------------------------------------------------------------------
// Sorting: the --sort keys, in the order the 's' key steps through them.

enum class SortKey { Name, Cpus, Lent, Ack };
inline constexpr SortKey kSortOrder[] = {SortKey::Name, SortKey::Cpus, SortKey::Lent, SortKey::Ack};

const char *sort_name(SortKey key);  // "name", "cpus", "lent", "ack"
SortKey next_sort(SortKey key);      // the one after key, wrapping to name

// ---------------------------------------------------------------------------------------------
// Text. Lines are measured in columns, not bytes: the header's dashes and the "µs" are UTF-8
// (one column each), and a terminal without UTF-8 gets ASCII instead.

struct Glyphs {
    const char *dash, *ellipsis, *micro;
};
inline constexpr Glyphs kUtf8Glyphs{"\u2014", "\u2026", "\u00b5s"};
inline constexpr Glyphs kAsciiGlyphs{"-", "...", "us"};

size_t columns(const std::string &s);                  // every byte but UTF-8 continuation bytes
std::string fit(const std::string &s, size_t width);   // the first `width` columns; 0: no limit
std::string pad(const std::string &s, size_t width);   // s, then spaces up to `width` columns
std::string local_clock(double epoch);                 // "HH:MM:SS" in the local time zone
// The last ack latency: "850µs", "2.3ms", "45ms", "1.2s"; "-" when there is none (< 0).
std::string ack_text(double us, const Glyphs &g);

// ---------------------------------------------------------------------------------------------
// The frame.

struct Frame {
    std::vector<std::string> lines;  // header, table, "N more"
    std::string footer;              // live view only: the sort and the keys
};

struct FrameInput {
    const nlohmann::json *status = nullptr;  // malld's status, or null when there is none
    std::string no_status;                   // then why: "malld unreachable: ..." or "no status: ..."
    double last_answer = 0;                  // epoch of malld's last status; 0: none yet
    double now = 0;
    SortKey sort = SortKey::Name;
    bool reversed = false;
    bool live = false;             // the live view: footer, and its row is kept free
    bool keys_help = false;        // the footer lists the keys
    bool keys = false;             // keys can be read (stdin is a terminal)
    double interval_s = 1;
    size_t width = 0, height = 0;  // the terminal; 0: no limit
    Glyphs glyphs = kAsciiGlyphs;
};

// One job of the status, read defensively.
struct JobRow {
    std::string name, uid, cpus_text, threads, state;  // state with ",pinned" / ",oversub"
    CpuSet cpus;
    int ncpus = 0, min = 0, max = 0;
    double ack_us = -1, lent = 0;
    bool others = false;  // the one row of other users' jobs (others_row), shown last
};

JobRow job_row(const nlohmann::json &job);
// Other users' jobs, which malld shows a non-admin only as the cpus they hold ("other_jobs"),
// as one row "(others)": their cpus, "N jobs of other users"; none when the status lists none.
std::optional<JobRow> others_row(const nlohmann::json &status);
// name: A to Z; cpus, lent, ack: largest first, ties by name; reversed: the whole order reversed.
void sort_rows(std::vector<JobRow> &rows, SortKey key, bool reversed);
// The job's cores in `cells` cells over the pool's cpus (ascending): one cell per cpu when they
// fit, else each cell covers a run of cpus: '#' all held, ':' some, '.' none.
std::string core_bar(const CpuSet &held, const std::vector<int> &pool, size_t cells);

std::string header_line(const FrameInput &in);        // "mall top — host — time   malld ..." or why none
std::string pool_line(const nlohmann::json &status);  // "POOL 0-3 (4 cpus)  FREE ..."
std::string footer_line(const FrameInput &in);        // "sort: name   (s sort, ...)" or the keys
Frame render_frame(const FrameInput &in);

}  // namespace mall::tools
