// SPDX-License-Identifier: BSD-3-Clause
// mallctl_top_frame.cpp — `mallctl top`'s frames (see mallctl_top_frame.hpp): malld's status
// JSON in, lines of text out. Every field is read defensively (a missing or mistyped one gives a
// fallback), so an older malld's status still draws; nothing here touches the terminal.
#include "tools/mallctl_top_frame.hpp"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <iterator>
#include <string>
#include <vector>

#include "tools/time_text.hpp"

using nlohmann::json;

namespace mall::tools {

namespace {

std::string format(const char *fmt, double x) {
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, fmt, x);
    return buffer;
}

// Fields of malld's status, read defensively: a missing or mistyped field gives the fallback.
std::string str_field(const json &j, const char *key, const std::string &fallback = "-") {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return fallback;
    if (it->is_string()) return it->get<std::string>().empty() ? fallback : it->get<std::string>();
    return it->dump();
}

double num_field(const json &j, const char *key, double fallback) {
    auto it = j.find(key);
    return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}

bool bool_field(const json &j, const char *key) {
    auto it = j.find(key);
    return it != j.end() && it->is_boolean() && it->get<bool>();
}

// A cpu count from a field that is a list ("2-3") or a number.
std::string cpu_count_field(const json &j, const char *key) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return "-";
    if (it->is_number()) return it->dump();
    if (!it->is_string()) return "-";
    auto cpus = CpuSet::parse(it->get<std::string>());
    return cpus ? std::to_string(cpus->count()) : "-";
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Sorting.

const char *sort_name(SortKey key) {
    switch (key) {
    case SortKey::Name: return "name";
    case SortKey::Cpus: return "cpus";
    case SortKey::Lent: return "lent";
    case SortKey::Ack: return "ack";
    }
    return "?";
}

SortKey next_sort(SortKey key) {
    const size_t n = std::size(kSortOrder);
    for (size_t i = 0; i < n; ++i)
        if (kSortOrder[i] == key) return kSortOrder[(i + 1) % n];
    return SortKey::Name;
}

// ---------------------------------------------------------------------------------------------
// Text.

size_t columns(const std::string &s) {
    size_t n = 0;
    for (unsigned char c : s)
        if ((c & 0xC0) != 0x80) ++n;  // count every byte but UTF-8 continuation bytes
    return n;
}

// The first `width` columns of s (whole characters); width 0 means no limit.
std::string fit(const std::string &s, size_t width) {
    if (width == 0) return s;
    size_t n = 0;
    for (size_t i = 0; i < s.size(); ++i) {
        if ((static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) continue;
        if (n++ == width) return s.substr(0, i);
    }
    return s;
}

std::string pad(const std::string &s, size_t width) {
    const size_t n = columns(s);
    return n >= width ? s : s + std::string(width - n, ' ');
}

std::string local_clock(double epoch) { return local_time_text(epoch, "%H:%M:%S"); }

// The last ack latency: "850µs", "2.3ms", "45ms", "1.2s"; "-" when there is none (-1).
std::string ack_text(double us, const Glyphs &g) {
    if (!(us >= 0)) return "-";
    if (us < 1000) return format("%.0f", us) + g.micro;
    if (us < 10000) return format("%.1fms", us / 1000);
    if (us < 1e6) return format("%.0fms", us / 1000);
    return format("%.1fs", us / 1e6);
}

// ---------------------------------------------------------------------------------------------
// The frame.

JobRow job_row(const json &j) {
    JobRow r;
    r.name = str_field(j, "job");
    r.uid = str_field(j, "uid");
    r.cpus_text = str_field(j, "cpus", "");
    r.cpus = CpuSet::parse(r.cpus_text).value_or(CpuSet());
    r.ncpus = static_cast<int>(num_field(j, "ncpus", r.cpus.count()));
    r.min = static_cast<int>(num_field(j, "min", 0));
    r.max = static_cast<int>(num_field(j, "max", 0));
    r.threads = str_field(j, "active_threads");
    r.ack_us = num_field(j, "last_ack_latency_us", -1);
    r.lent = num_field(j, "lent_core_seconds", 0);
    r.state = str_field(j, "state");
    if (bool_field(j, "pinned")) r.state += ",pinned";
    if (bool_field(j, "oversubscribed")) r.state += ",oversub";
    return r;
}

std::optional<JobRow> others_row(const json &s) {
    auto it = s.find("other_jobs");
    if (it == s.end() || !it->is_array() || it->empty()) return std::nullopt;
    JobRow r;
    r.others = true;
    r.name = "(others)";
    r.threads = "-";
    for (const json &j : *it)
        if (j.is_object()) r.cpus |= CpuSet::parse(str_field(j, "cpus", "")).value_or(CpuSet());
    r.ncpus = r.cpus.count();
    r.cpus_text = r.cpus.to_string();
    r.state = std::to_string(it->size()) + (it->size() == 1 ? " job" : " jobs") + " of other users";
    return r;
}

void sort_rows(std::vector<JobRow> &rows, SortKey key, bool reversed) {
    auto by = [key](const JobRow &a, const JobRow &b) {
        switch (key) {  // largest first for the figures; ties by name
        case SortKey::Name: break;
        case SortKey::Cpus:
            if (a.ncpus != b.ncpus) return a.ncpus > b.ncpus;
            break;
        case SortKey::Lent:
            if (a.lent != b.lent) return a.lent > b.lent;
            break;
        case SortKey::Ack:
            if (a.ack_us != b.ack_us) return a.ack_us > b.ack_us;
            break;
        }
        return a.name < b.name;
    };
    std::stable_sort(rows.begin(), rows.end(), by);
    if (reversed) std::reverse(rows.begin(), rows.end());
}

// The job's cores in `cells` cells over the pool's cpus (ascending): one cell per cpu when they
// fit, else each cell covers a run of cpus: '#' all held, ':' some, '.' none.
std::string core_bar(const CpuSet &held, const std::vector<int> &pool, size_t cells) {
    const size_t n = pool.size();
    if (n == 0) return "";
    cells = std::max<size_t>(1, std::min(cells, n));
    std::string bar;
    for (size_t c = 0; c < cells; ++c) {
        const size_t from = c * n / cells, to = (c + 1) * n / cells;
        size_t count = 0;
        for (size_t i = from; i < to; ++i) count += held.contains(pool[i]) ? 1 : 0;
        bar += count == 0 ? '.' : count == to - from ? '#' : ':';
    }
    return bar;
}

std::string header_line(const FrameInput &in) {
    std::string host;
    if (in.status) host = str_field(*in.status, "host", "");
    if (host.empty()) {
        char name[256] = {};
        if (::gethostname(name, sizeof name - 1) == 0) host = name;
    }
    const std::string dash = std::string(" ") + in.glyphs.dash + " ";
    std::string line = "mall top" + dash + host + dash + local_clock(in.now) + "   ";
    if (!in.status) {
        line += in.no_status + "; retrying every " + format("%g", in.interval_s) + " s";
        return line;
    }
    const json &s = *in.status;
    return line + "malld " + str_field(s, "version") + ", policy " + str_field(s, "policy") + ", backend " +
           str_field(s, "backend");
}

std::string pool_line(const json &s) {
    const json node = s.contains("node") && s["node"].is_object() ? s["node"] : json::object();
    const json jobs = s.contains("jobs") && s["jobs"].is_array() ? s["jobs"] : json::array();
    const std::string pool = str_field(s, "pool");
    const std::string reclaimed = str_field(s, "reclaimed");
    std::string line = "POOL " + pool + " (" + cpu_count_field(s, "pool") + " cpus)";
    line += "  FREE " + cpu_count_field(s, "free");
    line += "  RECLAIMED " + (reclaimed == "-" ? std::string("0") : cpu_count_field(s, "reclaimed") + " (" + reclaimed + ")");
    // A non-admin's status lists its own jobs in "jobs" and the rest in "other_jobs".
    const size_t others = s.contains("other_jobs") && s["other_jobs"].is_array() ? s["other_jobs"].size() : 0;
    line += "  JOBS " + std::to_string(jobs.size() + others);
    line += "  ENDED " + str_field(node, "jobs_ended", "0");
    line += "  LENT core-s total " + format("%.1f", num_field(node, "lent_core_seconds", 0));
    return line;
}

std::string footer_line(const FrameInput &in) {
    if (in.keys_help)
        return "keys: q or Ctrl-C quit, s next sort (name, cpus, lent, ack), r reverse, h or ? this help, "
               "any other key refreshes";
    std::string line = std::string("sort: ") + sort_name(in.sort) + (in.reversed ? ", reversed" : "");
    line += in.keys ? "   (s sort, r reverse, h keys, q quit)" : "   (keys need a terminal on stdin; Ctrl-C quits)";
    return line;
}

Frame render_frame(const FrameInput &in) {
    Frame frame;
    if (in.live) frame.footer = footer_line(in);
    auto &lines = frame.lines;
    lines.push_back(header_line(in));
    if (!in.status) {
        lines.push_back(in.last_answer > 0 ? "no answer from malld since " + local_clock(in.last_answer)
                                           : std::string("no answer from malld yet"));
        return frame;
    }
    const json &s = *in.status;
    lines.push_back(pool_line(s));
    lines.push_back("");

    std::vector<JobRow> rows;
    if (s.contains("jobs") && s["jobs"].is_array())
        for (const json &j : s["jobs"])
            if (j.is_object()) rows.push_back(job_row(j));
    const std::optional<JobRow> other_users = others_row(s);
    if (rows.empty() && !other_users) {
        lines.push_back("no jobs registered");
        return frame;
    }
    sort_rows(rows, in.sort, in.reversed);
    if (other_users) rows.push_back(*other_users);  // last, whatever the sort

    const std::vector<int> pool = CpuSet::parse(str_field(s, "pool", "")).value_or(CpuSet()).to_vector();
    // Columns: every one but CORES sized to its widest cell; CORES gets one cell per cpu, or
    // what is left of the terminal's width when that is less.
    enum { kJob, kUid, kCpus, kCores, kThreads, kAck, kLent, kState, kColumns };
    const char *titles[kColumns] = {"JOB", "UID", "CPUS", "CORES", "THREADS", "ACK", "LENT-S", "STATE"};
    std::vector<std::vector<std::string>> cells;
    for (const JobRow &r : rows) {
        if (r.others) {  // their cpus only: malld shows nothing else of other users' jobs
            cells.push_back({r.name, "-", std::to_string(r.ncpus), "", "-", "-", "-", r.state});
            continue;
        }
        cells.push_back({r.name, r.uid, std::to_string(r.ncpus) + "/" + std::to_string(r.min) + "-" + std::to_string(r.max),
                         "", r.threads, ack_text(r.ack_us, in.glyphs), format("%.1f", r.lent), r.state});
    }
    size_t width[kColumns];
    size_t others = 0;
    for (int c = 0; c < kColumns; ++c) {
        width[c] = columns(titles[c]);
        for (const auto &row : cells) width[c] = std::max(width[c], columns(row[c]));
        if (c != kCores) others += width[c] + 2;
    }
    size_t bar_cells = pool.size();
    if (in.width > 0 && others + bar_cells + 2 > in.width)
        bar_cells = std::max<size_t>(std::min<size_t>(8, pool.size()), in.width > others + 2 ? in.width - others - 2 : 0);
    for (size_t i = 0; i < rows.size(); ++i) cells[i][kCores] = core_bar(rows[i].cpus, pool, bar_cells);
    width[kCores] = std::max(columns(titles[kCores]), bar_cells);

    auto table_line = [&](const std::vector<std::string> &row) {
        std::string line;
        for (int c = 0; c < kColumns; ++c) line += c + 1 < kColumns ? pad(row[c], width[c] + 2) : row[c];
        return line;
    };
    lines.push_back(table_line(std::vector<std::string>(std::begin(titles), std::end(titles))));

    size_t shown = rows.size();
    if (in.height > 0) {
        const size_t used = lines.size() + (in.live ? 1 : 0);  // the footer has the last row
        const size_t room = in.height > used ? in.height - used : 0;
        if (room < rows.size()) shown = room > 0 ? room - 1 : 0;
    }
    for (size_t i = 0; i < shown; ++i) lines.push_back(table_line(cells[i]));
    if (shown < rows.size() && in.height > lines.size() + (in.live ? 1 : 0))
        lines.push_back(std::string(in.glyphs.ellipsis) + " " + std::to_string(rows.size() - shown) + " more");
    return frame;
}

}  // namespace mall::tools
