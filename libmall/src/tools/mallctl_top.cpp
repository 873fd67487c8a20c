// SPDX-License-Identifier: BSD-3-Clause
// mallctl_top.cpp — `mallctl top` (see mallctl_top.hpp). The frames are drawn by render_frame
// (mallctl_top_frame.cpp: status JSON in, lines of text out, no terminal involved); here are the
// options, the fetching, the live terminal (termios, alternate screen, signals; an RAII guard that
// gives everything back), and the two loops: live (redraw on a timer and on keys, retry while
// malld is away) and plain (--once / --batch N, no escapes).
#include "tools/mallctl_top.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <boost/program_options.hpp>

#include "tools/exit_codes.hpp"
#include "tools/mallctl_top_frame.hpp"
#include "tools/time_text.hpp"

namespace po = boost::program_options;
using nlohmann::json;

namespace mall::tools {

const char *const kTopSynopsis = "top [--interval S] [--sort KEY] [--reverse] [--once | --batch N]";
const char *const kTopSummary = "a live view of the pool and the jobs' cores, refreshed every second";
const char *const kTopDetails =
    "Shows malld's status as a live terminal view, redrawn every --interval seconds and at once\n"
    "on a key. The header names the node, the time, malld's version, policy and backend; the\n"
    "next line the pool, its free and reclaimed cpus, the jobs registered and ended, and the\n"
    "node's lent core-seconds. Then one row per job:\n"
    "  JOB      the job name                    UID   the owner's uid\n"
    "  CPUS     the cpus it holds / its MIN-MAX limits, e.g. 2/1-4\n"
    "  CORES    one cell per cpu of the pool, in order: # the job holds it, . it does not; a\n"
    "           pool wider than the terminal is scaled (a cell covers several cpus: # all held,\n"
    "           : some held)\n"
    "  THREADS  the threads its processes were told to run\n"
    "  ACK      its last acknowledgement latency (publication to ack); - before the first\n"
    "  LENT-S   its lent core-seconds: cpus held above its guaranteed cpus (or its min) times\n"
    "           the time held\n"
    "  STATE    settled, or changing while a move waits for the job's ack; then \",pinned\"\n"
    "           (mallctl set --cpus) and \",oversub\" (more threads than cpus after an ack timeout)\n"
    "Lines are cut at the terminal's width; rows that do not fit end in a \"N more\" line. When\n"
    "malld cannot be reached the header says so and top keeps trying until you quit.\n"
    "\n"
    "The terminal is given back as it was on every exit (q, Ctrl-C, SIGTERM, SIGHUP, an error).\n"
    "When stdout is not a terminal, top prints one frame, as with --once, unless --batch is given.\n"
    "\n"
    "Options:\n"
    "  --interval S   seconds between refreshes, 0.2 to 60 (default 1)\n"
    "  --sort KEY     sort the jobs by name (A to Z), cpus, lent or ack (largest first);\n"
    "                 default name\n"
    "  --reverse      reverse the order\n"
    "  --once         print one frame as plain text, without escape codes, and exit\n"
    "  --batch N      print N frames as plain text, one every --interval, separated by blank\n"
    "                 lines (as top -b -n N)\n"
    "\n"
    "Keys:\n"
    "  q, Ctrl-C   quit\n"
    "  s           sort by the next key: name, cpus, lent, ack\n"
    "  r           reverse the order\n"
    "  h, ?        show the keys in the footer\n"
    "  any other   refresh now\n"
    "\n"
    "Exit status: 0 done; 2 usage error; 3 malld could not be reached (with --once or --batch; the\n"
    "live view keeps trying).\n"
    "\n"
    "Anyone may run it. Root and malld's admins see every job; other users see their own jobs\n"
    "and a last row \"(others)\" with the cpus other users' jobs hold, and nothing more of them.\n"
    "\n"
    "Examples:\n"
    "  mallctl top\n"
    "  mallctl top --interval 0.5 --sort lent\n"
    "  mallctl top --once\n"
    "  mallctl top --batch 5 --interval 2 > top.log\n";

namespace {

// ---------------------------------------------------------------------------------------------
// Options.

struct TopOptions {
    double interval_s = 1.0;
    SortKey sort = SortKey::Name;
    bool reversed = false;
    bool once = false;
    long batch = 0;  // 0: not given
};

constexpr double kMinInterval = 0.2, kMaxInterval = 60;
constexpr long kMaxBatch = 1000000;

// Parses the command's arguments; on a bad one returns the words for usage_error.
std::optional<std::string> parse_options(const std::vector<std::string> &args, TopOptions *o) {
    po::options_description options;
    options.add_options()("interval", po::value<std::string>(), "")("sort", po::value<std::string>(), "")(
        "reverse", po::bool_switch(), "")("once", po::bool_switch(), "")("batch", po::value<std::string>(), "");
    po::variables_map vm;
    try {
        po::store(po::command_line_parser(args).options(options).run(), vm);
        po::notify(vm);
    } catch (const po::error &e) {
        return std::string(e.what());
    }
    if (vm.count("interval")) {
        const std::string text = vm["interval"].as<std::string>();
        char *end = nullptr;
        errno = 0;
        const double s = std::strtod(text.c_str(), &end);
        if (text.empty() || *end != '\0' || errno != 0 || !(s >= kMinInterval && s <= kMaxInterval))
            return "--interval must be a number of seconds from 0.2 to 60, e.g. --interval 0.5 (got '" + text + "')";
        o->interval_s = s;
    }
    if (vm.count("sort")) {
        const std::string text = vm["sort"].as<std::string>();
        bool known = false;
        for (SortKey key : kSortOrder)
            if (text == sort_name(key)) o->sort = key, known = true;
        if (!known) return "--sort takes name, cpus, lent or ack (got '" + text + "')";
    }
    o->reversed = vm["reverse"].as<bool>();
    o->once = vm["once"].as<bool>();
    if (vm.count("batch")) {
        const std::string text = vm["batch"].as<std::string>();
        char *end = nullptr;
        errno = 0;
        const long n = std::strtol(text.c_str(), &end, 10);
        if (text.empty() || *end != '\0' || errno != 0 || n < 1 || n > kMaxBatch)
            return "--batch must be a number of frames from 1 to " + std::to_string(kMaxBatch) +
                   ", e.g. --batch 3 (got '" + text + "')";
        o->batch = n;
    }
    if (o->once && o->batch) return "give --once or --batch N, not both (--once is --batch 1)";
    return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// The environment: UTF-8 glyphs when the locale says so (else ASCII), and the wall clock.

bool locale_is_utf8() {
    for (const char *name : {"LC_ALL", "LC_CTYPE", "LANG"}) {
        const char *value = std::getenv(name);
        if (value == nullptr || *value == '\0') continue;  // the first one set decides, as in setlocale
        std::string v = value;
        std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
        return v.find("utf-8") != std::string::npos || v.find("utf8") != std::string::npos;
    }
    return false;
}

// ---------------------------------------------------------------------------------------------
// Fetching. The fetcher explains a failure on std::cerr, which in the live view would scribble
// over the screen: its words are caught and shown in the header instead.

struct Fetched {
    std::optional<json> status;
    std::string why;  // when !status: the fetcher's first line, without "mallctl: "
    int exit_code = kExitOk;
};

Fetched fetch_quietly(const StatusFetcher &fetch_status) {
    std::ostringstream words;
    struct Redirect {
        std::streambuf *saved;
        explicit Redirect(std::streambuf *to) : saved(std::cerr.rdbuf(to)) {}
        ~Redirect() { std::cerr.rdbuf(saved); }
    };
    Fetched f;
    {
        Redirect redirect(words.rdbuf());
        f.status = fetch_status(&f.exit_code);
    }
    if (!f.status) {
        std::string first = words.str().substr(0, words.str().find('\n'));
        if (first.rfind("mallctl: ", 0) == 0) first.erase(0, 9);
        f.why = first.empty() ? "no status" : first;
    }
    return f;
}

// ---------------------------------------------------------------------------------------------
// The live terminal. Signal handlers only set flags; the loop acts on them.

volatile sig_atomic_t g_stop_signal = 0;  // SIGINT, SIGTERM, SIGHUP, SIGQUIT: leave
volatile sig_atomic_t g_resized = 0;      // SIGWINCH: read the size again
volatile sig_atomic_t g_suspend = 0;      // SIGTSTP (Ctrl-Z): give the terminal back, then stop

extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

// A crash (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) gives the terminal back before the process
// dies of it: write(2) and tcsetattr(3) are async-signal-safe, and the handler is reset on entry
// (SA_RESETHAND), so re-raising ends the process as the signal would have (core dump included).
termios g_crash_termios{};                 // the terminal's own mode, while the live view holds it
volatile sig_atomic_t g_crash_restore = 0; // 1: the alternate screen is on; 2: and the mode is raw
extern "C" void on_crash_signal(int sig) {
    if (g_crash_restore != 0) {
        static const char kLeave[] = "\x1b[?25h\x1b[?1049l";
        ssize_t ignored = ::write(STDOUT_FILENO, kLeave, sizeof kLeave - 1);
        (void)ignored;
        if (g_crash_restore == 2) ::tcsetattr(STDIN_FILENO, TCSANOW, &g_crash_termios);
    }
    ::raise(sig);
}
extern "C" void on_winch(int) { g_resized = 1; }
extern "C" void on_tstp(int) { g_suspend = 1; }

void write_all(int fd, const std::string &text) {
    size_t done = 0;
    while (done < text.size()) {
        const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;  // the terminal is gone (EIO after a hangup): nothing left to draw on
        done += static_cast<size_t>(n);
    }
}

class LiveTerminal {
public:
    // Installs the handlers, then takes the terminal: alternate screen, hidden cursor, and when
    // stdin is a terminal no echo and no line buffering (signals from keys such as Ctrl-C stay).
    LiveTerminal() {
        struct sigaction sa {};
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = 0;  // no SA_RESTART: poll() returns EINTR and the loop sees the flag at once
        for (size_t i = 0; i < std::size(kHandled); ++i) {
            sa.sa_handler = kHandled[i] == SIGWINCH ? on_winch : kHandled[i] == SIGTSTP ? on_tstp : on_stop_signal;
            ::sigaction(kHandled[i], &sa, &saved_actions_[i]);
        }
        keys_ = ::isatty(STDIN_FILENO) && ::tcgetattr(STDIN_FILENO, &saved_termios_) == 0;
        g_crash_termios = saved_termios_;
        struct sigaction crash {};
        sigemptyset(&crash.sa_mask);
        crash.sa_flags = SA_RESETHAND;
        crash.sa_handler = on_crash_signal;
        for (size_t i = 0; i < std::size(kCrashes); ++i) ::sigaction(kCrashes[i], &crash, &saved_crash_actions_[i]);
        enter();
        read_size();
    }
    ~LiveTerminal() {
        leave();
        for (size_t i = 0; i < std::size(kHandled); ++i) ::sigaction(kHandled[i], &saved_actions_[i], nullptr);
        for (size_t i = 0; i < std::size(kCrashes); ++i) ::sigaction(kCrashes[i], &saved_crash_actions_[i], nullptr);
    }
    LiveTerminal(const LiveTerminal &) = delete;
    LiveTerminal &operator=(const LiveTerminal &) = delete;

    bool keys() const { return keys_; }
    size_t width() const { return width_; }
    size_t height() const { return height_; }

    void read_size() {
        winsize ws{};
        if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 && ws.ws_row > 0) {
            width_ = ws.ws_col;
            height_ = ws.ws_row;
        }
    }

    // Ctrl-Z: give the terminal back, stop as the default action would, take it again on SIGCONT.
    void suspend() {
        leave();
        struct sigaction dfl {}, mine {};
        sigemptyset(&dfl.sa_mask);
        dfl.sa_handler = SIG_DFL;
        ::sigaction(SIGTSTP, &dfl, &mine);
        ::raise(SIGTSTP);  // stops here until SIGCONT
        ::sigaction(SIGTSTP, &mine, nullptr);
        enter();
        read_size();
    }

    void draw(const Frame &frame) {
        std::string out;
        const size_t rows = height_;
        for (size_t row = 1; row <= rows; ++row) {
            std::string text;
            if (row == rows) text = fit(frame.footer, width_ - 1);  // never the last cell: no scroll
            else if (row <= frame.lines.size()) text = fit(frame.lines[row - 1], width_);
            out += "\x1b[" + std::to_string(row) + ";1H" + text + "\x1b[K";
        }
        write_all(STDOUT_FILENO, out);
    }

    // A key, or 0 when none is waiting.
    char read_key() {
        if (!keys_) return 0;
        char buffer[64];
        const ssize_t n = ::read(STDIN_FILENO, buffer, sizeof buffer);
        if (n <= 0) return 0;
        // An escape sequence (arrows, function keys) is one key that means nothing here; its
        // letters must not be read as commands.
        if (buffer[0] == '\x1b') return ' ';
        return buffer[n - 1];
    }

private:
    static constexpr int kHandled[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGWINCH, SIGTSTP};
    static constexpr int kCrashes[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

    void enter() {
        if (entered_) return;
        if (keys_) {
            termios raw = saved_termios_;
            raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
            raw.c_cc[VMIN] = 0;
            raw.c_cc[VTIME] = 0;
            while (::tcsetattr(STDIN_FILENO, TCSANOW, &raw) != 0 && errno == EINTR) {}
        }
        write_all(STDOUT_FILENO, "\x1b[?1049h\x1b[?25l\x1b[H\x1b[2J");
        entered_ = true;
        g_crash_restore = keys_ ? 2 : 1;
    }

    void leave() {
        if (!entered_) return;
        g_crash_restore = 0;
        write_all(STDOUT_FILENO, "\x1b[?25h\x1b[?1049l");
        if (keys_)
            while (::tcsetattr(STDIN_FILENO, TCSADRAIN, &saved_termios_) != 0 && errno == EINTR) {}
        entered_ = false;
    }

    bool keys_ = false, entered_ = false;
    termios saved_termios_{};
    struct sigaction saved_actions_[std::size(kHandled)] {};
    struct sigaction saved_crash_actions_[std::size(kCrashes)] {};
    size_t width_ = 80, height_ = 24;
};

// ---------------------------------------------------------------------------------------------
// The loops.

int run_live(const TopOptions &options, const StatusFetcher &fetch_status) {
    g_stop_signal = 0;
    g_resized = 0;
    g_suspend = 0;
    int stop_signal = 0;
    {
        LiveTerminal term;
        FrameInput in;
        in.live = true;
        in.keys = term.keys();
        in.sort = options.sort;
        in.reversed = options.reversed;
        in.interval_s = options.interval_s;
        in.glyphs = locale_is_utf8() ? kUtf8Glyphs : kAsciiGlyphs;
        std::optional<json> status;
        using Clock = std::chrono::steady_clock;
        const auto interval = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.interval_s));
        auto next_fetch = Clock::now();
        bool quit = false;
        while (!quit && !g_stop_signal) {
            if (Clock::now() >= next_fetch) {
                Fetched f = fetch_quietly(fetch_status);
                status = std::move(f.status);
                if (!status)
                    in.no_status = (f.exit_code == kExitUnreachable ? "malld unreachable: " : "no status: ") + f.why;
                if (status) in.last_answer = epoch_now();
                next_fetch = Clock::now() + interval;
            }
            if (g_suspend) {
                g_suspend = 0;
                term.suspend();
            }
            if (g_resized) {
                g_resized = 0;
                term.read_size();
            }
            if (g_stop_signal) break;
            in.status = status ? &*status : nullptr;
            in.now = epoch_now();
            in.width = term.width();
            in.height = term.height();
            Frame frame;
            try {
                frame = render_frame(in);
            } catch (const std::exception &e) {  // a status this mallctl cannot read: say so, go on
                frame.lines = {header_line(in), std::string("cannot show malld's status: ") + e.what()};
                frame.footer = footer_line(in);
            }
            term.draw(frame);

            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next_fetch - Clock::now());
            pollfd p{STDIN_FILENO, POLLIN, 0};
            const int ready = ::poll(&p, term.keys() ? 1 : 0, static_cast<int>(std::max<long>(0, left.count()) + 1));
            if (ready <= 0 || !(p.revents & (POLLIN | POLLHUP))) continue;  // timeout, or a signal
            const char key = term.read_key();
            if (key == 0) {
                if (p.revents & POLLHUP) quit = true;  // the terminal is gone
                continue;
            }
            const bool was_help = in.keys_help;
            in.keys_help = false;
            switch (key) {
            case 'q': case 'Q': case '\x03': quit = true; break;  // \x03: Ctrl-C without ISIG
            case 's': in.sort = next_sort(in.sort); break;
            case 'r': in.reversed = !in.reversed; break;
            case 'h': case '?': in.keys_help = !was_help; break;
            default: next_fetch = Clock::now(); break;  // any other key: refresh now
            }
        }
        stop_signal = g_stop_signal;
    }  // the terminal is given back here, before anything else is printed or raised
    if (stop_signal != 0 && stop_signal != SIGINT) {
        // SIGTERM, SIGHUP, SIGQUIT: end as the signal would have, now that the terminal is restored.
        ::signal(stop_signal, SIG_DFL);
        ::raise(stop_signal);
    }
    return kExitOk;  // q and Ctrl-C are the ordinary ways out
}

int run_plain(const TopOptions &options, long frames, const StatusFetcher &fetch_status) {
    FrameInput in;
    in.sort = options.sort;
    in.reversed = options.reversed;
    in.interval_s = options.interval_s;
    in.glyphs = locale_is_utf8() ? kUtf8Glyphs : kAsciiGlyphs;
    for (long i = 0; i < frames; ++i) {
        if (i > 0) {
            std::this_thread::sleep_for(std::chrono::duration<double>(options.interval_s));
            std::cout << "\n";
        }
        int rc = kExitOk;
        auto status = fetch_status(&rc);  // says why on stderr when it fails
        if (!status) return rc;
        in.status = &*status;
        in.now = epoch_now();
        for (const std::string &line : render_frame(in).lines) std::cout << line << "\n";
        std::cout.flush();
    }
    return kExitOk;
}

}  // namespace

int cmd_top(const Globals &g, const std::vector<std::string> &args, const UsageError &usage_error) {
    TopOptions options;
    if (auto why = parse_options(args, &options)) return usage_error(*why);
    // A stuck malld holds top's keys (q, Ctrl-C) only as long as one request may wait.
    const StatusFetcher fetch_status = status_fetcher(g, std::chrono::seconds(2));
    if (options.batch > 0) return run_plain(options, options.batch, fetch_status);
    if (options.once || !::isatty(STDOUT_FILENO)) return run_plain(options, 1, fetch_status);
    return run_live(options, fetch_status);
}

}  // namespace mall::tools
