// SPDX-License-Identifier: BSD-3-Clause
// Proves what `mallctl top` shows, frame by frame, from statuses shaped like `mallctl status
// --json` (NodeManager::status plus the server's host, version and backend): the CORES bars (one
// cell per cpu, or scaled to the width with '#' all, ':' some, '.' none held), the table's rows
// fitting the width, the sort keys with ties by name, the "N more" line under a height limit, the
// frames without a status or without jobs, the STATE flags, and an older malld's status (missing or
// mistyped fields show "-", never throw). The live terminal is proved in tools/top_check.sh.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/watchdog.h"
#include "tools/mallctl_top_frame.hpp"

using nlohmann::json;
using namespace mall::tools;

MALL_TEST_WATCHDOG(30);

namespace {

// 2024-03-01 12:34:56 UTC; the frames' clocks are read in UTC (the fixture sets TZ).
constexpr double kNow = 1709296496;
// The header line of every frame built from status() at kNow.
const std::string kHeaderLine = "mall top - node1 - 12:34:56   malld 0.3.0, policy equal, backend affinity";

class TopFrame : public ::testing::Test {
protected:
    void SetUp() override {
        ::setenv("TZ", "UTC", 1);
        ::tzset();
    }
};

// A job as NodeManager::status writes it (the fields top reads, and a few it does not).
json job(const std::string &name, const std::string &cpus, int ncpus, int min, int max) {
    return {{"job", name},
            {"uid", 1000},
            {"min", min},
            {"max", max},
            {"weight", 1},
            {"guaranteed", ""},
            {"cpus", cpus},
            {"ncpus", ncpus},
            {"cpuset", cpus},
            {"target", cpus},
            {"pinned", false},
            {"threads", ncpus},
            {"active_threads", ncpus},
            {"state", "settled"},
            {"last_ack_latency_us", 850},
            {"lent_core_seconds", 0.0},
            {"oversubscribed", false}};
}

json status(const std::string &pool, const std::string &free, const json &jobs) {
    return {{"pool", pool},
            {"available", pool},
            {"reclaimed", ""},
            {"reserved", json::object()},
            {"free", free},
            {"policy", "equal"},
            {"ack_timeout_ms", 2000},
            {"backend", "affinity"},
            {"version", "0.3.0"},
            {"host", "node1"},
            {"jobs", jobs},
            {"node", {{"jobs_ended", 3}, {"lent_core_seconds", 12.5}, {"core_seconds", 100.0}}}};
}

FrameInput input(const json &s) {
    FrameInput in;
    in.status = &s;
    in.now = kNow;
    return in;
}

// A table line's cells: every cell but the last is padded with at least two spaces, and no cell
// holds two spaces in a row.
std::vector<std::string> cells_of(const std::string &line) {
    static const std::regex gap(" {2,}");
    std::vector<std::string> out;
    for (std::sregex_token_iterator it(line.begin(), line.end(), gap, -1), end; it != end; ++it) out.push_back(*it);
    return out;
}

// The index of the table's title line ("JOB  UID  ...").
size_t title_index(const Frame &f) {
    for (size_t i = 0; i < f.lines.size(); ++i)
        if (f.lines[i].rfind("JOB ", 0) == 0) return i;
    ADD_FAILURE() << "no table title line";
    return f.lines.size();
}

// A job's cells, by the title of their column.
std::string cell(const Frame &f, const std::string &name, const std::string &title) {
    const std::vector<std::string> titles = cells_of(f.lines[title_index(f)]);
    for (size_t i = title_index(f) + 1; i < f.lines.size(); ++i) {
        const std::vector<std::string> cells = cells_of(f.lines[i]);
        if (cells.empty() || cells[0] != name) continue;
        for (size_t c = 0; c < titles.size() && c < cells.size(); ++c)
            if (titles[c] == title) return cells[c];
        ADD_FAILURE() << "no " << title << " cell in " << f.lines[i];
        return "";
    }
    ADD_FAILURE() << "no row for " << name;
    return "";
}

// The jobs' names in the order the table shows them.
std::vector<std::string> order(const Frame &f) {
    std::vector<std::string> names;
    for (size_t i = title_index(f) + 1; i < f.lines.size(); ++i) names.push_back(cells_of(f.lines[i])[0]);
    return names;
}

std::string joined(const Frame &f) {
    std::string text;
    for (const std::string &line : f.lines) text += line + "\n";
    return text + "[footer] " + f.footer + "\n";
}

TEST_F(TopFrame, SmallPoolHasOneCellPerCpuAndExactBars) {
    json b = job("beta", "2", 1, 1, 2);
    b["state"] = "changing";
    b["last_ack_latency_us"] = -1;
    json a = job("alpha", "0-1", 2, 1, 4);
    a["lent_core_seconds"] = 12.5;
    const json s = status("0-3", "3", json::array({b, a}));
    const Frame f = render_frame(input(s));
    // Every line as the user reads it (plain frame, ASCII glyphs, no footer).
    const std::vector<std::string> expected = {
        kHeaderLine,
        "POOL 0-3 (4 cpus)  FREE 1  RECLAIMED 0  JOBS 2  ENDED 3  LENT core-s total 12.5",
        "",
        "JOB    UID   CPUS   CORES  THREADS  ACK    LENT-S  STATE",
        "alpha  1000  2/1-4  ##..   2        850us  12.5    settled",
        "beta   1000  1/1-2  ..#.   1        -      0.0     changing",
    };
    EXPECT_EQ(f.lines, expected) << joined(f);
    EXPECT_EQ(f.footer, "");  // plain frames have none
}

TEST_F(TopFrame, WidePoolScalesTheCoresBarToTheWidth) {
    json wide = job("wide", "64-255", 192, 1, 256);
    wide["last_ack_latency_us"] = 2300;
    json tiny = job("tiny", "1", 1, 1, 1);  // 1 cpu of a cell that covers at least 3
    const json s = status("0-255", "0,2-63", json::array({wide, tiny}));

    // Unlimited width: one cell per cpu.
    Frame f = render_frame(input(s));
    EXPECT_EQ(cell(f, "wide", "CORES"), std::string(64, '.') + std::string(192, '#'));
    EXPECT_EQ(cell(f, "tiny", "CORES"), "." + std::string("#") + std::string(254, '.'));

    // 80 columns, UTF-8 glyphs (µs, the dashes): the bar gets what the other columns leave.
    FrameInput in = input(s);
    in.width = 80;
    in.height = 24;
    in.live = true;
    in.glyphs = kUtf8Glyphs;
    f = render_frame(in);
    const std::string wide_bar = cell(f, "wide", "CORES"), tiny_bar = cell(f, "tiny", "CORES");
    const size_t n = wide_bar.size();
    EXPECT_LT(n, 256u) << joined(f);
    EXPECT_GE(n, 8u) << joined(f);
    EXPECT_EQ(tiny_bar.size(), n);
    // tiny holds part of the first cell's cpus: ':', then nothing.
    EXPECT_EQ(tiny_bar, ":" + std::string(n - 1, '.')) << joined(f);
    // wide holds the top three quarters: '.' cells, at most one ':' at the edge, then '#' cells.
    EXPECT_TRUE(std::regex_match(wide_bar, std::regex("\\.+:?#+"))) << wide_bar;
    const long hashes = std::count(wide_bar.begin(), wide_bar.end(), '#');
    EXPECT_NEAR(static_cast<double>(hashes), 0.75 * static_cast<double>(n), 1.0) << wide_bar;
    EXPECT_EQ(cell(f, "wide", "ACK"), "2.3ms");
    EXPECT_EQ(cell(f, "tiny", "ACK"), "850\u00b5s");

    // The promise: the table (titles and rows) fits the width, counted in columns (µs is one);
    // the header and POOL lines are left whole for the writer to cut with fit().
    const size_t title = title_index(f);
    for (size_t i = title; i < f.lines.size(); ++i)
        EXPECT_LE(columns(f.lines[i]), 80u) << "line " << i << ": " << f.lines[i];
    EXPECT_EQ(f.lines[0], "mall top \u2014 node1 \u2014 12:34:56   malld 0.3.0, policy equal, backend affinity");
    EXPECT_EQ(f.lines[1], "POOL 0-255 (256 cpus)  FREE 63  RECLAIMED 0  JOBS 2  ENDED 3  LENT core-s total 12.5");
    for (const std::string &line : f.lines) EXPECT_LE(columns(fit(line, 80)), 80u);
    EXPECT_EQ(fit(f.lines[0], 12), "mall top \u2014 n");  // whole characters, not bytes
}

TEST_F(TopFrame, SortsByEachKeyWithTiesByNameAndReverses) {
    // ncpus, lent, ack: ties on each key, so the names decide.
    auto make = [](const std::string &name, const std::string &cpus, int ncpus, double lent, double ack) {
        json j = job(name, cpus, ncpus, 1, 4);
        j["lent_core_seconds"] = lent;
        j["last_ack_latency_us"] = ack;
        return j;
    };
    const json s = status("0-7", "6-7",
                          json::array({make("delta", "0-1", 2, 5, 100), make("alpha", "2", 1, 5, 900),
                                       make("charlie", "3-4", 2, 1, -1), make("bravo", "5", 1, 0, 900)}));
    struct Case {
        SortKey key;
        std::vector<std::string> expected;
    };
    const Case cases[] = {
        {SortKey::Name, {"alpha", "bravo", "charlie", "delta"}},
        {SortKey::Cpus, {"charlie", "delta", "alpha", "bravo"}},
        {SortKey::Lent, {"alpha", "delta", "charlie", "bravo"}},
        {SortKey::Ack, {"alpha", "bravo", "delta", "charlie"}},
    };
    for (const Case &c : cases) {
        FrameInput in = input(s);
        in.sort = c.key;
        EXPECT_EQ(order(render_frame(in)), c.expected) << sort_name(c.key);
        in.reversed = true;
        in.live = true;
        const Frame f = render_frame(in);
        EXPECT_EQ(order(f), std::vector<std::string>(c.expected.rbegin(), c.expected.rend())) << sort_name(c.key);
        EXPECT_EQ(f.footer, std::string("sort: ") + sort_name(c.key) + ", reversed" +
                                "   (keys need a terminal on stdin; Ctrl-C quits)");
    }
    // The 's' key steps through them in the --sort order and wraps.
    EXPECT_EQ(next_sort(SortKey::Name), SortKey::Cpus);
    EXPECT_EQ(next_sort(SortKey::Cpus), SortKey::Lent);
    EXPECT_EQ(next_sort(SortKey::Lent), SortKey::Ack);
    EXPECT_EQ(next_sort(SortKey::Ack), SortKey::Name);
}

TEST_F(TopFrame, RowsBeyondTheHeightGiveWayToAMoreLine) {
    json jobs = json::array();
    for (int i = 0; i < 10; ++i) jobs.push_back(job("job" + std::to_string(i), std::to_string(i), 1, 1, 1));
    const json s = status("0-15", "10-15", jobs);

    FrameInput in = input(s);
    in.height = 8;  // header, POOL, blank, titles: room for 3 rows and "N more"
    Frame f = render_frame(in);
    ASSERT_EQ(f.lines.size(), 8u) << joined(f);
    EXPECT_EQ(f.lines[0], kHeaderLine);
    EXPECT_EQ(f.lines[1].rfind("POOL 0-15 (16 cpus)", 0), 0u);
    EXPECT_EQ(f.lines[3].rfind("JOB ", 0), 0u);
    EXPECT_EQ(cells_of(f.lines[6])[0], "job2");
    EXPECT_EQ(f.lines[7], "... 7 more");

    // Live: the footer keeps the last row, and the glyph is the terminal's.
    in.live = true;
    in.keys = true;
    in.glyphs = kUtf8Glyphs;
    f = render_frame(in);
    ASSERT_EQ(f.lines.size(), 7u) << joined(f);
    EXPECT_EQ(cells_of(f.lines[5])[0], "job1");
    EXPECT_EQ(f.lines[6], "\u2026 8 more");
    EXPECT_EQ(f.footer, "sort: name   (s sort, r reverse, h keys, q quit)");

    // Room for all: no "more" line.
    in.height = 15;
    f = render_frame(in);
    EXPECT_EQ(f.lines.size(), 14u) << joined(f);
    EXPECT_EQ(cells_of(f.lines.back())[0], "job9");

    // Room for none: the header, POOL and titles stay; nothing goes past the height.
    in.height = 5;
    f = render_frame(in);
    EXPECT_EQ(f.lines.size(), 4u) << joined(f);
    EXPECT_EQ(f.lines[3].rfind("JOB ", 0), 0u);
}

TEST_F(TopFrame, WithoutAStatusTheHeaderSaysWhyAndSinceWhen) {
    FrameInput in;
    in.now = kNow;
    in.live = true;
    in.interval_s = 0.5;
    in.no_status = "malld unreachable: cannot connect to /run/mall/malld.sock: No such file or directory";
    Frame f = render_frame(in);
    ASSERT_EQ(f.lines.size(), 2u) << joined(f);
    EXPECT_EQ(f.lines[0].rfind("mall top - ", 0), 0u) << f.lines[0];
    const std::string why = " - 12:34:56   malld unreachable: cannot connect to /run/mall/malld.sock: No such file or "
                            "directory; retrying every 0.5 s";
    EXPECT_EQ(f.lines[0].substr(f.lines[0].size() - why.size()), why) << f.lines[0];
    EXPECT_EQ(f.lines[1], "no answer from malld yet");
    EXPECT_FALSE(f.footer.empty());

    in.last_answer = kNow - 6;
    f = render_frame(in);
    ASSERT_EQ(f.lines.size(), 2u) << joined(f);
    EXPECT_EQ(f.lines[1], "no answer from malld since 12:34:50");
}

TEST_F(TopFrame, WithoutJobsItSaysSo) {
    const json s = status("0-3", "0-3", json::array());
    const Frame f = render_frame(input(s));
    const std::vector<std::string> expected = {
        kHeaderLine,
        "POOL 0-3 (4 cpus)  FREE 4  RECLAIMED 0  JOBS 0  ENDED 3  LENT core-s total 12.5",
        "",
        "no jobs registered",
    };
    EXPECT_EQ(f.lines, expected) << joined(f);
}

TEST_F(TopFrame, StateShowsPinnedAndOversubscribed) {
    json pinned = job("pinned", "0", 1, 1, 2);
    pinned["pinned"] = true;
    json over = job("over", "1", 1, 1, 2);
    over["state"] = "changing";
    over["oversubscribed"] = true;
    json both = job("both", "2", 1, 1, 2);
    both["pinned"] = true;
    both["oversubscribed"] = true;
    json s = status("0-3", "3", json::array({pinned, over, both}));
    s["reclaimed"] = "3";  // and the pool line counts reclaimed cpus
    const Frame f = render_frame(input(s));
    EXPECT_EQ(cell(f, "pinned", "STATE"), "settled,pinned");
    EXPECT_EQ(cell(f, "over", "STATE"), "changing,oversub");
    EXPECT_EQ(cell(f, "both", "STATE"), "settled,pinned,oversub");
    EXPECT_NE(f.lines[1].find("  RECLAIMED 1 (3)  "), std::string::npos) << f.lines[1];
}

TEST_F(TopFrame, AnOlderOrOddStatusShowsDashesAndNeverThrows) {
    // An older malld: no host, version, backend, node or free; a job with only a name and cpus;
    // fields of the wrong type; a job entry that is not an object.
    const json s = {{"pool", "0-3"},
                    {"policy", 7},
                    {"jobs",
                     json::array({{{"job", "old"}, {"cpus", "0-1"}},
                                  {{"job", "odd"},
                                   {"cpus", json::array({"2"})},
                                   {"ncpus", "two"},
                                   {"min", nullptr},
                                   {"max", "4"},
                                   {"uid", ""},
                                   {"active_threads", nullptr},
                                   {"last_ack_latency_us", "soon"},
                                   {"lent_core_seconds", "lots"},
                                   {"state", ""},
                                   {"pinned", "yes"},
                                   {"oversubscribed", 1}},
                                  "not a job"})},
                    {"node", json::array()}};
    FrameInput in = input(s);
    in.width = 80;
    Frame f;
    ASSERT_NO_THROW(f = render_frame(in));
    EXPECT_NE(f.lines[0].find("   malld -, policy 7, backend -"), std::string::npos) << f.lines[0];
    EXPECT_EQ(f.lines[1].rfind("POOL 0-3 (4 cpus)  FREE -  RECLAIMED 0  JOBS ", 0), 0u) << f.lines[1];
    EXPECT_NE(f.lines[1].find("  ENDED 0  LENT core-s total 0.0"), std::string::npos) << f.lines[1];
    EXPECT_EQ(order(f), (std::vector<std::string>{"odd", "old"}));
    EXPECT_EQ(cell(f, "old", "UID"), "-");
    EXPECT_EQ(cell(f, "old", "CPUS"), "2/0-0");  // ncpus from the cpus; no limits given
    EXPECT_EQ(cell(f, "old", "CORES"), "##..");
    EXPECT_EQ(cell(f, "old", "THREADS"), "-");
    EXPECT_EQ(cell(f, "old", "ACK"), "-");
    EXPECT_EQ(cell(f, "old", "LENT-S"), "0.0");
    EXPECT_EQ(cell(f, "old", "STATE"), "-");
    EXPECT_EQ(cell(f, "odd", "UID"), "-");
    EXPECT_EQ(cell(f, "odd", "CPUS"), "0/0-0");  // unreadable cpus hold nothing
    EXPECT_EQ(cell(f, "odd", "CORES"), "....");
    EXPECT_EQ(cell(f, "odd", "THREADS"), "-");
    EXPECT_EQ(cell(f, "odd", "ACK"), "-");
    EXPECT_EQ(cell(f, "odd", "LENT-S"), "0.0");
    EXPECT_EQ(cell(f, "odd", "STATE"), "-");  // no ",pinned" or ",oversub" from non-booleans

    // Not even an object, or jobs that are not a list: still a frame.
    const json nothing = json::array();
    ASSERT_NO_THROW(f = render_frame(input(nothing)));
    EXPECT_EQ(f.lines[1], "POOL - (- cpus)  FREE -  RECLAIMED 0  JOBS 0  ENDED 0  LENT core-s total 0.0");
    EXPECT_EQ(f.lines.back(), "no jobs registered");
    const json jobs_object = {{"pool", "0-1"}, {"jobs", {{"a", 1}}}};
    ASSERT_NO_THROW(f = render_frame(input(jobs_object)));
    EXPECT_EQ(f.lines.back(), "no jobs registered");
}

TEST_F(TopFrame, AckLatencyIsShownInItsUnit) {
    EXPECT_EQ(ack_text(-1, kAsciiGlyphs), "-");
    EXPECT_EQ(ack_text(850, kAsciiGlyphs), "850us");
    EXPECT_EQ(ack_text(850, kUtf8Glyphs), "850\u00b5s");
    EXPECT_EQ(ack_text(2300, kAsciiGlyphs), "2.3ms");
    EXPECT_EQ(ack_text(45000, kAsciiGlyphs), "45ms");
    EXPECT_EQ(ack_text(1.2e6, kAsciiGlyphs), "1.2s");
}

}  // namespace
