// SPDX-License-Identifier: BSD-3-Clause
// mallctl_signal.cpp — `mallctl signal PID --threads N|auto --cpus a-b` (see mallctl_signal.hpp).
// Steps: read the options (parse_command; errors in signal's own words), check the arguments and
// encode the request (common/signal_control.hpp); hold the target by a pidfd so that a recycled
// pid is never signalled; read /proc/PID/status and the target's "mall-signal" record (found
// under /proc/PID/fd) and refuse, with words, a process that does not catch the advertised signal
// or whose record says the request cannot apply; queue the signal with its value
// (pidfd_send_signal, else sigqueue); then poll the record until the target decided the request,
// exited or the timeout passed.
#include "tools/mallctl_signal.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <boost/program_options.hpp>

#include "common/cpuset.hpp"
#include "common/signal_control.hpp"
#include "common/text.hpp"
#include "mall/mall.h"
#include "tools/exit_codes.hpp"

namespace mall::tools {

const char *const kSignalSynopsis = "signal PID [--threads N|auto] [--cpus a-b] [--timeout-ms N] [--no-wait]";
const char *const kSignalSummary = "change a process's threads or cpus by signal, without malld";
const char *const kSignalDetails =
    "Control by signal, for a process that is not attached to malld (a workstation without\n"
    "malld, a container without its socket, a process started before malld): mallctl queues a\n"
    "real-time signal (sigqueue) whose value asks for a thread count and/or a cpu range. At its\n"
    "next mall_step() the process applies it through the same resize callbacks and pinning as a\n"
    "change from malld (every one of its threads is pinned to the cpus), writes the outcome into\n"
    "a small record it keeps, and mallctl, which polls that record, reports it.\n"
    "\n"
    "The process must have opted in: started with MALL_SIGNAL_CONTROL=1 (libmall 0.3 or later;\n"
    "or mall_open_ex() with control_signal). It then catches SIGRTMAX-7 (signal 57 on Linux; an\n"
    "other real-time signal with MALL_SIGNAL_CONTROL=SIGRTMAX-N) and keeps the record as the memfd\n"
    "\"mall-signal\", which mallctl finds under /proc/PID/fd. mallctl sends nothing to a process\n"
    "without that record, or whose /proc/PID/status (SigCgt) shows the signal is not caught: the\n"
    "default action of a real-time signal ends the process.\n"
    "\n"
    "Limits: the request fits in the signal's 32-bit value. --threads alone goes up to 1024;\n"
    "--cpus takes ONE range a-b (or a single cpu) below 1024, and with it --threads up to 255.\n"
    "Any other list (\"0,2\", \"0-1,8\") does not fit: use malld (`mallctl set JOB --cpus LIST`).\n"
    "The cpus must lie within those the process had when it opted in; --threads must not exceed\n"
    "the cpus. --cpus without --threads means one thread per cpu.\n"
    "\n"
    "Who wins: a process attached to malld refuses signals, since malld's allocation is the truth,\n"
    "unless the administrator let the job take them (`mallctl set JOB --signal-control on`); it\n"
    "then accepts requests that narrow within the cpus malld gave it, and malld's next change\n"
    "replaces them. Requests are not queued: a newer one replaces one not applied yet.\n"
    "\n"
    "Who may: the kernel's rules (kill(2)): the process's owner or root. The record is readable by\n"
    "the same people only. mallctl holds the process by a pidfd, so a pid reused meanwhile is\n"
    "never signalled.\n"
    "\n"
    "Options:\n"
    "  --threads N|auto   threads to run, 1 to 1024 (255 with --cpus); auto: one per cpu\n"
    "  --cpus a-b         the cpus, one range (or one cpu) within the process's opening cpus\n"
    "  --timeout-ms N     how long to wait for the process to apply it (default 5000, 1 to 600000)\n"
    "  --no-wait          send and return (exit 0) without waiting for the outcome\n"
    "\n"
    "Exit status: 0 applied (or sent, with --no-wait); 1 refused (by mallctl's checks, the kernel\n"
    "or the process; the reason is printed) or replaced by a newer request or by malld's change;\n"
    "2 usage error; 3 no such process, it exited, or it did not apply the request in time (it is\n"
    "still pending: the process applies it at its next mall_step()).\n"
    "\n"
    "Examples:\n"
    "  MALL_SIGNAL_CONTROL=1 mall_train_digits --threads 2 &\n"
    "  mallctl signal $! --threads 1\n"
    "  mallctl signal $! --cpus 0-1 --threads auto\n"
    "  mallctl signal $! --cpus 3 --timeout-ms 20000\n";

namespace {

namespace po = boost::program_options;
namespace sc = mall::signal_control;
using Clock = std::chrono::steady_clock;

constexpr long kMaxPid = 4194304;  // PID_MAX_LIMIT on 64-bit Linux

// signal's options, read by parse_command as leniently as mallctl always read them: long options
// only, spelled out (no abbreviations), each taking the next token as its value whatever it
// looks like (`--threads -1` is refused for its value, not taken for an option), given twice the
// last one counting. Every other token is positional, "-x" and "-1" too, and judged in
// cmd_signal: a negative number is a PID (refused, it would name a process group), any other
// token starting with '-' an unknown option. kPidKey is a name no command line can spell (a long
// option's name ends at its '='), so `--PID 1` stays an unknown option.
constexpr const char *kPidKey = "PID=";

po::variables_map read_options(const std::vector<std::string> &args) {
    po::options_description options;
    options.add_options()("threads", po::value<std::vector<std::string>>(), "")(
        "cpus", po::value<std::vector<std::string>>(), "")("timeout-ms", po::value<std::vector<std::string>>(), "")(
        "no-wait", po::value<std::vector<std::string>>()->zero_tokens(), "")(
        kPidKey, po::value<std::vector<std::string>>(), "");
    po::positional_options_description positional;
    positional.add(kPidKey, -1);
    namespace style = po::command_line_style;
    return parse_command(args, options, positional,
                         style::allow_long | style::long_allow_adjacent | style::long_allow_next);
}

// Each value an option was given, in order (none when absent).
std::vector<std::string> values_of(const po::variables_map &vm, const char *key) {
    return vm.count(key) ? vm[key].as<std::vector<std::string>>() : std::vector<std::string>{};
}

// The value an option was given last, or nullopt.
std::optional<std::string> last_value_of(const po::variables_map &vm, const char *key) {
    const auto values = values_of(vm, key);
    if (values.empty()) return std::nullopt;
    return values.back();
}

// A whole number in [min, max], or nullopt.
std::optional<long> parse_number(const std::string &text, long min, long max) {
    if (text.empty() || text.size() > 12) return std::nullopt;
    errno = 0;
    char *end = nullptr;
    const long value = std::strtol(text.c_str(), &end, 10);
    if (errno != 0 || *end != '\0' || value < min || value > max) return std::nullopt;
    return value;
}

struct ProcStatus {
    std::string name;
    long uid = -1;
    long own_pid = -1;  // its pid in its own pid namespace (NSpid's last field): the record's pid
    uint64_t caught = 0, ignored = 0;  // SigCgt, SigIgn: bit (signal - 1)
};

std::optional<ProcStatus> read_proc_status(long pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    if (!in) return std::nullopt;
    ProcStatus st;
    std::string line;
    while (std::getline(in, line)) {
        const auto colon = line.find(':');
        if (colon == std::string::npos) continue;
        const std::string key = line.substr(0, colon);
        const std::string value = mall::trim(line.substr(colon + 1));
        if (key == "Name") st.name = value;
        if (key == "Uid") st.uid = std::strtol(value.c_str(), nullptr, 10);
        if (key == "NSpid") {
            const auto last = value.find_last_of(" \t");
            st.own_pid = std::strtol(value.c_str() + (last == std::string::npos ? 0 : last + 1), nullptr, 10);
        }
        if (key == "SigCgt") st.caught = std::strtoull(value.c_str(), nullptr, 16);
        if (key == "SigIgn") st.ignored = std::strtoull(value.c_str(), nullptr, 16);
    }
    return st;
}

// The target's record descriptor, opened through /proc/PID/fd. -1 with errno EACCES when the
// folder cannot be read, ENOENT when no record is there.
int open_record(long pid) {
    const std::string folder = "/proc/" + std::to_string(pid) + "/fd";
    DIR *dir = ::opendir(folder.c_str());
    if (dir == nullptr) return -1;
    const std::string wanted = std::string("/memfd:") + sc::kRecordName + " (deleted)";
    int fd = -1;
    int open_errno = ENOENT;
    while (dirent *e = ::readdir(dir)) {
        if (e->d_name[0] == '.') continue;
        const std::string path = folder + "/" + e->d_name;
        char target[256];
        const ssize_t n = ::readlink(path.c_str(), target, sizeof target - 1);
        if (n <= 0) continue;
        target[n] = '\0';
        if (wanted != target) continue;
        fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) open_errno = errno;
        break;
    }
    ::closedir(dir);
    if (fd < 0) errno = open_errno;
    return fd;
}

// A consistent read of the record: two reads in a row that agree and parse (a rewrite is one
// pwrite, but a reader may overtake it; seq/end alone would not catch a torn middle).
std::optional<sc::Record> read_record(int fd) {
    static char first[sc::kRecordSize], second[sc::kRecordSize];
    for (int attempt = 0; attempt < 50; ++attempt) {
        const ssize_t n = ::pread(fd, first, sc::kRecordSize, 0);
        if (n <= 0) return std::nullopt;
        const ssize_t again = ::pread(fd, second, sc::kRecordSize, 0);
        if (again == n && std::memcmp(first, second, static_cast<size_t>(n)) == 0) {
            if (auto record = sc::parse_record(std::string(first, static_cast<size_t>(n)))) return record;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return std::nullopt;
}

// The pid a pidfd holds, from /proc/self/fdinfo (-1 when unknown).
long pidfd_pid(int pidfd) {
    std::ifstream in("/proc/self/fdinfo/" + std::to_string(pidfd));
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("Pid:", 0) == 0) return std::strtol(line.c_str() + 4, nullptr, 10);
    return -1;
}

bool catches(const ProcStatus &st, int sig) {
    const uint64_t bit = uint64_t{1} << (sig - 1);
    return (st.caught & bit) && !(st.ignored & bit);
}

std::string signal_name(int sig) {
    const int from_max = SIGRTMAX - sig;
    if (sig >= SIGRTMIN && from_max >= 0 && from_max <= 15)
        return from_max == 0 ? "SIGRTMAX" : "SIGRTMAX-" + std::to_string(from_max);
    if (sig >= SIGRTMIN && sig <= SIGRTMAX) return "SIGRTMIN+" + std::to_string(sig - SIGRTMIN);
    return "signal " + std::to_string(sig);
}

// The process is gone (no such pid, or it exited meanwhile): says so and returns exit 3.
int gone(const std::string &what) {
    std::cerr << "mallctl signal: " << what << "\n";
    return kExitUnreachable;
}

// True once the process held by pidfd (else named by pid) has exited.
bool has_exited(int pidfd, long pid) {
    if (pidfd >= 0) {
        pollfd p{pidfd, POLLIN, 0};
        return ::poll(&p, 1, 0) > 0;  // a pidfd becomes readable when its process exits
    }
    return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

int refuse(long pid, const std::string &what) {
    std::cerr << "mallctl signal: process " << pid << ": " << what << "\n";
    return kExitRefused;
}

int send_queued(int pidfd, long pid, int sig, uint32_t value) {
    siginfo_t info;
    std::memset(&info, 0, sizeof info);
    info.si_signo = sig;
    info.si_code = SI_QUEUE;
    info.si_pid = ::getpid();
    info.si_uid = ::getuid();
    info.si_value.sival_int = static_cast<int>(value);
    long rc = -1;
    errno = ENOSYS;
#ifdef SYS_pidfd_send_signal
    if (pidfd >= 0) rc = ::syscall(SYS_pidfd_send_signal, pidfd, sig, &info, 0);
#endif
    if (rc != 0 && (errno == ENOSYS || pidfd < 0)) {
        union sigval sv;
        sv.sival_int = static_cast<int>(value);
        rc = ::sigqueue(static_cast<pid_t>(pid), sig, sv);
    }
    return rc == 0 ? 0 : errno;
}

}  // namespace

int cmd_signal(const Globals & /*g: signal talks to the process, not to malld*/, const std::vector<std::string> &args,
               const UsageError &usage_error) {
    po::variables_map vm;
    try {
        vm = read_options(args);
    } catch (const po::unknown_option &e) {  // named as written, "=value" included
        return usage_error("unknown option '" + e.get_option_name() + "'");
    } catch (const po::invalid_command_line_syntax &e) {
        if (e.kind() == po::invalid_command_line_syntax::missing_parameter)
            return usage_error(e.get_option_name() + " needs a value");
        if (e.kind() != po::invalid_command_line_syntax::extra_parameter) throw;  // the dispatch's words
        // `--no-wait=1`: an option unknown as written. Without its name, the error names the token.
        po::invalid_command_line_syntax as_written = e;
        as_written.set_option_name("");
        return usage_error("unknown option '" + as_written.get_option_name() + "'");
    }
    long timeout_ms = 5000;
    for (const std::string &value : values_of(vm, "timeout-ms")) {
        auto t = parse_number(value, 1, 600000);
        if (!t) return usage_error("--timeout-ms takes a whole number of milliseconds from 1 to 600000, not '" + value + "'");
        timeout_ms = *t;
    }
    const bool wait = !vm.count("no-wait");
    const std::optional<std::string> threads_text = last_value_of(vm, "threads");
    const std::optional<std::string> cpus_text = last_value_of(vm, "cpus");
    std::optional<std::string> pid_text;
    for (const std::string &arg : values_of(vm, kPidKey)) {
        if (!arg.empty() && arg[0] == '-' && !parse_number(arg, -kMaxPid, 0))
            return usage_error("unknown option '" + arg + "'");
        if (pid_text) return usage_error("one PID only (got '" + *pid_text + "' and '" + arg + "')");
        pid_text = arg;
    }
    if (!pid_text) return usage_error("name the process: mallctl signal PID --threads N");
    const auto pid = parse_number(*pid_text, 1, kMaxPid);
    if (!pid) {
        return usage_error("PID must be a process id from 1 to " + std::to_string(kMaxPid) + ", not '" + *pid_text +
                           "' (0 and negative numbers would signal process groups: refused)");
    }
    if (*pid == ::getpid()) return usage_error("PID " + *pid_text + " is mallctl itself");
    if (!threads_text && !cpus_text) return usage_error("say what to change: --threads N|auto, --cpus a-b, or both");

    // The request, encoded before anything is looked at.
    int threads = 0;  // auto
    if (threads_text && *threads_text != "auto") {
        auto t = parse_number(*threads_text, 1, sc::kMaxThreadsAlone);
        if (!t) return usage_error("--threads takes a count from 1 to 1024, or auto, not '" + *threads_text + "'");
        threads = static_cast<int>(*t);
    }
    std::optional<mall::CpuSet> cpus;
    std::string why;
    std::optional<uint32_t> value;
    if (cpus_text) {
        std::string error;
        cpus = mall::CpuSet::parse(*cpus_text, &error);
        if (!cpus) return usage_error(error + "\n  example: --cpus 0-3");
        if (cpus->empty()) return usage_error("the cpu list is empty; name one range a-b\n  example: --cpus 0-3");
        if (cpus->count() != cpus->last() - cpus->first() + 1) {
            return usage_error("cpu list " + *cpus_text +
                               " does not fit in a signal's value: give one range a-b (or one cpu); for other lists "
                               "use malld (mallctl set JOB --cpus LIST)");
        }
        value = sc::encode_range(threads, cpus->first(), cpus->count(), &why);
    } else {
        value = sc::encode_threads(threads, &why);
    }
    if (!value) return usage_error(why);

    // Hold the process: from here on it is named by its pidfd, never by a number that may be reused.
    int pidfd = -1;
#ifdef SYS_pidfd_open
    pidfd = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(*pid), 0));
    if (pidfd < 0 && errno == ESRCH) return gone("no process " + std::to_string(*pid));
    if (pidfd < 0 && errno != ENOSYS) {
        // Only a kernel without pidfds (before 5.3) falls back to signalling by number.
        return refuse(*pid, std::string("cannot hold the process by a pidfd (") + std::strerror(errno) +
                                "); nothing was sent");
    }
    if (pidfd >= 0) {
        const long held = pidfd_pid(pidfd);
        if (held != -1 && held != *pid)
            return refuse(*pid, "mallctl's /proc shows another pid namespace than mallctl's own (the pidfd holds pid " +
                                    std::to_string(held) + "); nothing was sent");
    }
#endif
    struct Closer {
        int fd;
        ~Closer() {
            if (fd >= 0) ::close(fd);
        }
    } pidfd_closer{pidfd};
    const auto status = read_proc_status(*pid);
    if (!status) return gone("no process " + std::to_string(*pid));
    const int record_fd = open_record(*pid);
    if (record_fd < 0) {
        if (errno == EACCES || errno == EPERM)
            return refuse(*pid, "(" + status->name + ") belongs to uid " + std::to_string(status->uid) +
                                    ": only its owner or root may control it");
        return refuse(*pid, "(" + status->name + ") has not enabled mall signal control (no mall-signal record): "
                            "start it with MALL_SIGNAL_CONTROL=1 (libmall 0.3 or later); nothing was sent");
    }
    Closer record_closer{record_fd};
    const auto before = read_record(record_fd);
    if (!before) return refuse(*pid, "(" + status->name + ") has a mall-signal record this mallctl cannot read; nothing was sent");
    // A child forked without exec inherits the descriptor but not the opt-in (libmall drops it in
    // the child; this also covers a libmall that could not).
    if (status->own_pid > 0 && before->pid != status->own_pid) {
        return refuse(*pid, "(" + status->name + ") holds the mall-signal record of process " +
                                std::to_string(before->pid) + " (inherited across fork), not its own: it has not "
                                "enabled mall signal control; nothing was sent");
    }
    // Still the same process? (The pidfd says whether the one it holds exited.)
    if (pidfd >= 0 && has_exited(pidfd, *pid)) return gone("process " + std::to_string(*pid) + " exited");
    const int sig = before->signal;
    const std::string name = signal_name(sig);
    if (sig < SIGRTMIN || sig > SIGRTMAX)
        return refuse(*pid, "its record names signal " + std::to_string(sig) + ", not a real-time signal; nothing was sent");
    if (!catches(*status, sig)) {
        return refuse(*pid, "(" + status->name + ") does not catch signal " + std::to_string(sig) + " (" + name +
                                ") (SigCgt in /proc/" + std::to_string(*pid) +
                                "/status): its default action would end it; nothing was sent");
    }
    // The checks the process would make, made here first to say why before sending.
    if (before->mode == "attached" && !before->allowed) {
        return refuse(*pid, "is attached to malld as job " + before->job + ", whose allocation wins: use `mallctl set " +
                                before->job + " --threads N` or `--cpus LIST`, or let it take signals with `mallctl set " +
                                before->job + " --signal-control on`; nothing was sent");
    }
    std::string error;
    const auto bound = mall::CpuSet::parse(before->bound, &error);
    const auto current = mall::CpuSet::parse(before->cpus, &error);
    if (bound && cpus && !bound->contains(*cpus)) {
        return refuse(*pid, "cpus " + cpus->to_string() + " are not all within " + before->bound +
                                ", the cpus it may use; nothing was sent");
    }
    if (!cpus && current && threads > current->count()) {
        return refuse(*pid, std::to_string(threads) + " threads exceed its " + std::to_string(current->count()) +
                                " cpus (" + before->cpus + "); nothing was sent");
    }

    // Look once more right before sending: a process that exec'd or closed its handle since has
    // the signal back at its default. (A window of microseconds stays; the pidfd rules out reuse.)
    const auto again = read_proc_status(*pid);
    if (!again || !catches(*again, sig)) {
        return refuse(*pid, "stopped catching signal " + std::to_string(sig) + " (" + name +
                                ") while mallctl checked it (exec or mall_close?); nothing was sent");
    }
    const auto sent_at = Clock::now();
    if (const int e = send_queued(pidfd, *pid, sig, *value); e != 0) {
        if (e == ESRCH) return gone("process " + std::to_string(*pid) + " exited");
        if (e == EPERM)
            return refuse(*pid, "not permitted to signal it (uid " + std::to_string(status->uid) +
                                    "): only its owner or root may (kill(2))");
        if (e == EAGAIN)
            return refuse(*pid, "its queue of pending signals is full (RLIMIT_SIGPENDING); try again later");
        return refuse(*pid, std::string("cannot queue the signal: ") + std::strerror(e));
    }
    if (!wait) {
        std::cout << "process " << *pid << " (" << status->name << "): sent " << name
                  << "; it applies the request at its next mall_step()\n";
        return kExitOk;
    }
    const auto deadline = sent_at + std::chrono::milliseconds(timeout_ms);
    const long self = ::getpid();
    auto next_handler_check = sent_at + std::chrono::milliseconds(50);
    while (true) {
        const auto now = Clock::now();
        const auto record = read_record(record_fd);
        if (record && record->handled > before->handled && record->last == *value &&
            (record->from == self || record->from == 0)) {
            const double ms = std::chrono::duration<double, std::milli>(now - sent_at).count();
            if (record->result == "applied") {
                char after[32];
                std::snprintf(after, sizeof after, "%.2f", ms);
                std::cout << "process " << *pid << " (" << status->name << "): " << record->threads << " thread"
                          << (record->threads == 1 ? "" : "s") << " on cpus " << record->cpus << " (applied after "
                          << after << " ms)\n";
                return kExitOk;
            }
            return refuse(*pid, record->result + ": " + record->why);
        }
        if (has_exited(pidfd, *pid)) return gone("process " + std::to_string(*pid) + " exited before it applied the request");
        if (now >= next_handler_check) {
            // A process that closed its handle (or exec'd) ignores the request for good.
            next_handler_check = now + std::chrono::milliseconds(50);
            const auto st = read_proc_status(*pid);
            if (st && !catches(*st, sig))
                return refuse(*pid, "turned mall signal control off (mall_close or exec) before applying the request");
        }
        if (now >= deadline) {
            std::cerr << "mallctl signal: process " << *pid << " (" << status->name << ") did not apply the request within "
                      << timeout_ms << " ms: it stays pending and applies at the process's next mall_step()";
            if (record && record->handled > before->handled)
                std::cerr << " (meanwhile it decided another request, from pid " << record->from
                          << ": a newer request replaces one not applied yet)";
            std::cerr << "\n";
            return kExitUnreachable;
        }
        // Fine polling first (a stepping process answers within its step period), then coarser.
        std::this_thread::sleep_for(now - sent_at < std::chrono::milliseconds(200) ? std::chrono::microseconds(100)
                                                                                  : std::chrono::microseconds(2000));
    }
}

}  // namespace mall::tools
