// SPDX-License-Identifier: BSD-3-Clause
// state_file.cpp — reads and writes "<dir>/malld.state.json". Writes are atomic (temp file, fsync,
// rename, fsync of the folder), so a crash leaves either the old or the new file. The temp file
// has an unpredictable name and is created O_EXCL|O_NOFOLLOW, mode 0600; the file is read with
// O_NOFOLLOW: nothing planted in the folder is followed. malld works through the descriptor of the
// folder it opened at start (openat, renameat, unlinkat: a folder renamed and replaced later is
// never written into), and refuses a state folder others can write or swap (files.hpp's
// open_private_folder, called by persistence.cpp). Reading checks the format name and schema version and every
// field (a saved cgroup path must be a plain absolute path: no '.', '..' or empty components; the
// backend checks at adoption that it lies under its cgroup mount), and rejects the whole file on
// any error.
#include "state_file.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <set>
#include <vector>
#include <type_traits>
#include <map>

#include "../common/files.hpp"
#include "../common/protocol.hpp"

namespace mall {

namespace {

constexpr const char *kStateFileName = "malld.state.json";
constexpr const char *kFormatName = "mall-malld-state";
constexpr int kSchemaVersion = 1;

std::string state_path(const std::string &dir) { return dir + "/" + kStateFileName; }

// Every field of the file, listed once. The file is written from these lists (state_to_json)
// and the fingerprint is taken from them (state_fingerprint), so the two cannot disagree: a field
// added here is saved and counts as a change. Fields marked Progress change at every progress
// report or ack: they are saved along with any other change but never cause a write of their own.
enum class Field { Saved, Progress };

template <class Visit>
void visit_job_fields(const SavedJob &saved, Visit &&visit) {
    const Job &job = saved.job;
    visit("job", job.spec.id, Field::Saved);
    visit("uid", job.spec.uid, Field::Saved);
    visit("min", job.spec.min, Field::Saved);
    visit("max", job.spec.max, Field::Saved);
    visit("weight", job.spec.weight, Field::Saved);
    visit("guaranteed", job.spec.guaranteed, Field::Saved);
    visit("container", job.spec.container, Field::Saved);
    visit("order", job.order, Field::Saved);
    visit("cpuset", job.cpuset, Field::Saved);
    visit("published", job.published, Field::Saved);
    visit("generation", job.generation, Field::Saved);
    visit("pinned", job.pinned, Field::Saved);
    visit("usage_cap", job.usage_cap, Field::Saved);
    visit("threads", job.threads, Field::Saved);
    visit("published_threads", job.published_threads, Field::Saved);
    visit("signal_control", job.signal_control, Field::Saved);
    visit("published_signal_control", job.published_signal_control, Field::Saved);
    visit("transitions", job.transitions, Field::Saved);
    visit("ack_timeouts", job.ack_timeouts, Field::Saved);
    visit("last_ack_latency_us", job.last_ack_latency_us, Field::Progress);
    visit("work_units", job.work_units, Field::Progress);
    visit("steps", job.steps, Field::Progress);
    visit("ack_latency_seconds", job.ack_latency, Field::Progress);
    visit("core_seconds", job.core_seconds, Field::Progress);
    visit("lent_core_seconds", job.lent_core_seconds, Field::Progress);
    visit("oversubscribed_seconds", job.oversubscribed_seconds, Field::Progress);
    visit("cpu_seconds", job.cpu_seconds, Field::Progress);
    visit("acked_threads", job.acked_threads, Field::Progress);
    visit("registered_at", saved.times.registered_at, Field::Progress);
    visit("accounted_until", saved.times.accounted_until, Field::Progress);
    visit("oversubscribed_since", saved.times.oversubscribed_since, Field::Progress);
    visit("pids", saved.pids, Field::Saved);
    visit("cgroups", saved.cgroups, Field::Saved);
}

template <class Visit>
void visit_state_fields(const SavedState &state, Visit &&visit) {
    visit("pool", state.pool, Field::Saved);
    visit("reclaimed", state.reclaimed, Field::Saved);
    visit("reserved", state.reserved, Field::Saved);
    visit("policy", state.policy, Field::Saved);
    visit("jobs", state.jobs, Field::Saved);
    visit("totals", state.totals, Field::Progress);
}

// --- the file: each field as JSON ---
nlohmann::json to_json_value(const CpuSet &cpus) { return cpus.to_string(); }
nlohmann::json to_json_value(const std::optional<CpuSet> &cpus) {
    return cpus ? nlohmann::json(cpus->to_string()) : nlohmann::json(nullptr);
}
nlohmann::json to_json_value(const std::vector<SavedPid> &pids) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto &p : pids) list.push_back({{"pid", p.pid}, {"start_time", p.start_time}});
    return list;
}
nlohmann::json to_json_value(const std::vector<JobCgroup> &cgroups) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto &c : cgroups)
        list.push_back({{"path", c.path}, {"in_place", c.in_place}, {"original", c.original}});
    return list;
}
nlohmann::json to_json_value(const std::map<std::string, CpuSet> &reserved) {
    nlohmann::json owners = nlohmann::json::object();
    for (const auto &[owner, cpus] : reserved) owners[owner] = cpus.to_string();
    return owners;
}
nlohmann::json to_json_value(const DurationHistogram &histogram) { return histogram.to_json(); }
nlohmann::json to_json_value(const std::optional<double> &seconds) {
    return seconds ? nlohmann::json(*seconds) : nlohmann::json(nullptr);
}
nlohmann::json to_json_value(const NodeTotals &t) { return t.to_json(); }
nlohmann::json to_json_value(const std::vector<SavedJob> &jobs);
template <class T>
nlohmann::json to_json_value(const T &value) {
    return value;
}

nlohmann::json job_to_json(const SavedJob &saved) {
    nlohmann::json j = nlohmann::json::object();
    visit_job_fields(saved, [&](const char *name, const auto &value, Field) { j[name] = to_json_value(value); });
    return j;
}

nlohmann::json to_json_value(const std::vector<SavedJob> &jobs) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto &job : jobs) list.push_back(job_to_json(job));
    return list;
}

// --- the fingerprint: each saved field's bytes, no text formatting (malld takes one after every
// batch of events, so it must cost next to nothing) ---
class Fingerprint {
public:
    void add(const std::string &text) {
        add(text.size());
        out_ += text;
    }
    void add(const CpuSet &cpus) {
        uint64_t mask[MALL_MAX_CPUS / 64];
        cpus.to_mask(mask);
        out_.append(reinterpret_cast<const char *>(mask), sizeof mask);
    }
    void add(const std::optional<CpuSet> &cpus) {
        add(cpus.has_value());
        if (cpus) add(*cpus);
    }
    void add(const std::vector<SavedPid> &pids) {
        add(pids.size());
        for (const auto &p : pids) {
            add(p.pid);
            add(p.start_time);
        }
    }
    void add(const std::vector<JobCgroup> &cgroups) {
        add(cgroups.size());
        for (const auto &c : cgroups) {
            add(c.path);
            add(c.in_place);
            add(c.original);
        }
    }
    void add(const std::map<std::string, CpuSet> &reserved) {
        add(reserved.size());
        for (const auto &[owner, cpus] : reserved) {
            add(owner);
            add(cpus);
        }
    }
    void add(const std::vector<SavedJob> &jobs) {
        add(jobs.size());
        for (const auto &job : jobs)
            visit_job_fields(job, [&](const char *, const auto &value, Field kind) {
                if (kind == Field::Saved) add(value);
            });
    }
    // Progress fields are never fingerprinted; these exist only so the visitors compile.
    void add(const DurationHistogram &) {}
    void add(const std::optional<double> &) {}
    void add(const NodeTotals &) {}
    template <class T, class = std::enable_if_t<std::is_arithmetic_v<T>>>
    void add(T value) {
        out_.append(reinterpret_cast<const char *>(&value), sizeof value);
    }
    std::string take() { return std::move(out_); }

private:
    std::string out_;
};

// Field readers that say which field of which entry is wrong. They throw std::runtime_error,
// caught by state_from_json and turned into its *error.
struct Reader {
    const nlohmann::json &obj;
    std::string where;

    const nlohmann::json &field(const char *name) const {
        auto it = obj.find(name);
        if (it == obj.end()) throw std::runtime_error(where + ": missing field \"" + name + "\"");
        return *it;
    }
    [[noreturn]] void bad(const char *name, const std::string &what) const {
        throw std::runtime_error(where + ": field \"" + name + "\" " + what);
    }
    std::string text(const char *name) const {
        const auto &v = field(name);
        if (!v.is_string()) bad(name, "must be a string");
        return v.get<std::string>();
    }
    uint64_t unsigned_number(const char *name) const {
        const auto &v = field(name);
        if (!v.is_number_unsigned()) bad(name, "must be a non-negative integer");
        return v.get<uint64_t>();
    }
    int64_t integer(const char *name, int64_t min, int64_t max) const {
        const auto &v = field(name);
        if (!v.is_number_integer()) bad(name, "must be an integer");
        int64_t x = v.get<int64_t>();
        if (x < min || x > max)
            bad(name, "is " + std::to_string(x) + ", outside " + std::to_string(min) + ".." +
                          std::to_string(max));
        return x;
    }
    double real(const char *name) const {
        const auto &v = field(name);
        if (!v.is_number()) bad(name, "must be a number");
        return v.get<double>();
    }
    // A field newer files have: `fallback` when absent.
    double optional_real(const char *name, double fallback, double min = 0) const {
        if (!obj.contains(name)) return fallback;
        const double x = real(name);
        if (!(x >= min) || !std::isfinite(x)) bad(name, "must be a finite number of at least " + std::to_string(min));
        return x;
    }
    DurationHistogram histogram(const char *name) const {
        if (!obj.contains(name)) return {};
        auto h = DurationHistogram::from_json(field(name));
        if (!h) bad(name, "must be a histogram {counts: [" + std::to_string(DurationHistogram::kBuckets) +
                              " counts], sum, count}");
        return *h;
    }
    CpuSet cpus(const char *name) const {
        std::string why;
        auto set = CpuSet::parse(text(name), &why);
        if (!set) bad(name, "is not a cpu list: " + why);
        return *set;
    }
};

SavedJob job_from_json(const nlohmann::json &j, size_t index) {
    if (!j.is_object()) throw std::runtime_error("jobs[" + std::to_string(index) + "] is not an object");
    Reader r{j, "jobs[" + std::to_string(index) + "]"};
    SavedJob saved;
    Job &job = saved.job;
    job.spec.id = r.text("job");
    r.where = "job \"" + job.spec.id + "\"";
    if (auto why = proto::invalid_job_name(job.spec.id)) throw std::runtime_error(r.where + ": " + *why);
    job.spec.uid = static_cast<uid_t>(r.integer("uid", 0, proto::kMaxUid));
    job.spec.min = static_cast<int>(r.integer("min", 0, CpuSet::kMaxCpus));
    job.spec.max = static_cast<int>(r.integer("max", 1, CpuSet::kMaxCpus));
    if (job.spec.min > job.spec.max)
        throw std::runtime_error(r.where + ": min " + std::to_string(job.spec.min) +
                                 " is larger than max " + std::to_string(job.spec.max));
    job.spec.weight = r.real("weight");
    // Above 0 and finite; a weight above kMaxWeight, which mallds before 0.2 accepted, is read as it
    // is and brought within the bound when the job is re-adopted (persistence.cpp), so an old file
    // does not cost every job its re-adoption.
    if (!(job.spec.weight > 0) || !std::isfinite(job.spec.weight)) r.bad("weight", "must be a finite number above 0");
    job.spec.guaranteed = r.cpus("guaranteed");
    // Absent in state files of malld before 0.4 (no container jobs then).
    if (r.obj.contains("container")) {
        const auto &container = r.field("container");
        if (!container.is_boolean()) r.bad("container", "must be true or false");
        job.spec.container = container.get<bool>();
    }
    job.order = r.unsigned_number("order");
    job.cpuset = r.cpus("cpuset");
    job.published = r.cpus("published");
    job.generation = r.unsigned_number("generation");
    const auto &pinned = r.field("pinned");
    if (!pinned.is_null()) job.pinned = r.cpus("pinned");
    // Absent in state files of malld 0.1 (no usage caps then).
    if (r.obj.contains("usage_cap")) job.usage_cap = static_cast<int>(r.integer("usage_cap", 0, CpuSet::kMaxCpus));
    // Absent in state files of mallds before API 0.3 (no thread counts then: one per cpu).
    if (r.obj.contains("threads")) job.threads = static_cast<int>(r.integer("threads", 0, CpuSet::kMaxCpus));
    if (r.obj.contains("published_threads"))
        job.published_threads = static_cast<int>(r.integer("published_threads", 0, CpuSet::kMaxCpus));
    // Absent in state files of mallds before signal control (issue 17): off, as then.
    for (auto [name, flag] : {std::pair<const char *, bool *>{"signal_control", &job.signal_control},
                              {"published_signal_control", &job.published_signal_control}}) {
        if (!r.obj.contains(name)) continue;
        const auto &value = r.field(name);
        if (!value.is_boolean()) r.bad(name, "must be true or false");
        *flag = value.get<bool>();
    }
    job.transitions = r.unsigned_number("transitions");
    job.ack_timeouts = r.unsigned_number("ack_timeouts");
    job.last_ack_latency_us = r.real("last_ack_latency_us");
    job.work_units = r.unsigned_number("work_units");
    job.steps = r.unsigned_number("steps");
    // Accounting: absent in state files of mallds before issue 18 (counted from the load then).
    job.ack_latency = r.histogram("ack_latency_seconds");
    job.core_seconds = r.optional_real("core_seconds", 0);
    job.lent_core_seconds = r.optional_real("lent_core_seconds", 0);
    job.oversubscribed_seconds = r.optional_real("oversubscribed_seconds", 0);
    job.cpu_seconds = r.optional_real("cpu_seconds", 0);  // absent before issue 41
    if (r.obj.contains("acked_threads"))
        job.acked_threads = static_cast<int>(r.integer("acked_threads", 0, CpuSet::kMaxCpus));
    saved.has_times = r.obj.contains("registered_at") && r.obj.contains("accounted_until");
    if (saved.has_times) {
        saved.times.registered_at = r.optional_real("registered_at", 0);
        saved.times.accounted_until = r.optional_real("accounted_until", 0);
        if (r.obj.contains("oversubscribed_since") && !r.field("oversubscribed_since").is_null())
            saved.times.oversubscribed_since = r.optional_real("oversubscribed_since", 0);
    }
    const auto &pids = r.field("pids");
    if (!pids.is_array()) r.bad("pids", "must be an array");
    for (size_t i = 0; i < pids.size(); ++i) {
        if (!pids[i].is_object()) r.bad("pids", "must hold objects {pid, start_time}");
        Reader pr{pids[i], r.where + " pids[" + std::to_string(i) + "]"};
        SavedPid p;
        p.pid = static_cast<pid_t>(pr.integer("pid", 1, proto::kMaxPid));
        p.start_time = pr.unsigned_number("start_time");
        saved.pids.push_back(p);
        job.spec.pids.push_back(p.pid);
    }
    // Absent in state files of malld before 0.3 (no enforcement in place then).
    if (r.obj.contains("cgroups")) {
        const auto &cgroups = r.field("cgroups");
        if (!cgroups.is_array()) r.bad("cgroups", "must be an array");
        for (size_t i = 0; i < cgroups.size(); ++i) {
            if (!cgroups[i].is_object()) r.bad("cgroups", "must hold objects {path, in_place, original}");
            Reader cr{cgroups[i], r.where + " cgroups[" + std::to_string(i) + "]"};
            JobCgroup c;
            c.path = cr.text("path");
            if (auto why = absolute_path_problem(c.path); !why.empty())
                cr.bad("path", "must be an absolute cgroup folder without '.', '..' or empty components (it " +
                                   why + ")");
            const auto &in_place = cr.field("in_place");
            if (!in_place.is_boolean()) cr.bad("in_place", "must be true or false");
            c.in_place = in_place.get<bool>();
            c.original = cr.text("original");
            if (!c.original.empty() && !CpuSet::parse(c.original)) cr.bad("original", "is not a cpu list");
            saved.cgroups.push_back(std::move(c));
        }
    }
    return saved;
}

bool fail(std::string *error, const std::string &text) {
    if (error) *error = text;
    return false;
}

bool write_all(int fd, const std::string &data) {
    size_t done = 0;
    while (done < data.size()) {
        ssize_t n = ::write(fd, data.data() + done, data.size() - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        done += static_cast<size_t>(n);
    }
    return true;
}

}  // namespace

nlohmann::json state_to_json(const SavedState &state) {
    nlohmann::json j = {{"format", kFormatName}, {"version", kSchemaVersion}};
    visit_state_fields(state, [&](const char *name, const auto &value, Field) { j[name] = to_json_value(value); });
    return j;
}

std::string state_fingerprint(const SavedState &state) {
    Fingerprint print;
    visit_state_fields(state, [&](const char *, const auto &value, Field kind) {
        if (kind == Field::Saved) print.add(value);
    });
    return print.take();
}

std::optional<SavedState> state_from_json(const nlohmann::json &j, std::string *error) {
    try {
        if (!j.is_object()) throw std::runtime_error("the top level is not a JSON object");
        auto format = j.find("format");
        if (format == j.end() || !format->is_string() || format->get<std::string>() != kFormatName)
            throw std::runtime_error(std::string("not a malld state file (\"format\" is not \"") +
                                     kFormatName + "\")");
        auto version = j.find("version");
        if (version == j.end() || !version->is_number_integer())
            throw std::runtime_error("missing or non-integer schema \"version\"");
        int64_t v = version->get<int64_t>();
        if (v > kSchemaVersion)
            throw std::runtime_error("written by a newer malld (schema version " +
                                     std::to_string(v) + ", this malld reads version " +
                                     std::to_string(kSchemaVersion) + "); upgrade malld");
        if (v < 1) throw std::runtime_error("unknown schema version " + std::to_string(v));
        Reader r{j, "state"};
        SavedState state;
        state.pool = r.text("pool");
        if (!CpuSet::parse(state.pool)) r.bad("pool", "is not a cpu list");
        state.reclaimed = r.cpus("reclaimed");
        // "reserved" came with the Slurm prolog support; older files have none.
        if (auto res = j.find("reserved"); res != j.end()) {
            if (!res->is_object()) r.bad("reserved", "must be an object of owner: cpu list");
            for (const auto &[owner, text] : res->items()) {
                auto cpus = text.is_string() ? CpuSet::parse(text.get<std::string>()) : std::nullopt;
                if (!cpus || !state.reclaimed.contains(*cpus))
                    r.bad("reserved", "holds a bad or unreclaimed cpu list for \"" + owner + "\"");
                state.reserved[owner] = *cpus;
            }
        }
        state.policy = r.text("policy");
        const auto &jobs = r.field("jobs");
        if (!jobs.is_array()) r.bad("jobs", "must be an array");
        std::set<std::string> names;
        for (size_t i = 0; i < jobs.size(); ++i) {
            SavedJob job = job_from_json(jobs[i], i);
            if (!names.insert(job.job.spec.id).second)
                throw std::runtime_error("job \"" + job.job.spec.id + "\" appears twice");
            state.jobs.push_back(std::move(job));
        }
        if (auto totals = j.find("totals"); totals != j.end()) {
            if (!totals->is_object()) r.bad("totals", "must be an object");
            Reader t{*totals, "totals"};
            NodeTotals &n = state.totals;
            n.jobs_ended = t.unsigned_number("jobs_ended");
            n.core_seconds = t.optional_real("core_seconds", 0);
            n.lent_core_seconds = t.optional_real("lent_core_seconds", 0);
            n.oversubscribed_seconds = t.optional_real("oversubscribed_seconds", 0);
            n.cpu_seconds = t.optional_real("cpu_seconds", 0);
            n.resizes = t.unsigned_number("resizes");
            n.ack_timeouts = t.unsigned_number("ack_timeouts");
            n.ack_latency = t.histogram("ack_latency_seconds");
            n.reclaims = t.unsigned_number("reclaims");
            n.reclaim_timeouts = t.unsigned_number("reclaim_timeouts");
            n.reclaim_duration = t.histogram("reclaim_duration_seconds");
        }
        return state;
    } catch (const std::exception &e) {
        if (error) *error = e.what();
        return std::nullopt;
    }
}

bool save_state(int dir_fd, const std::string &dir, const SavedState &state, std::string *error) {
    const std::string path = state_path(dir);
    std::string text = state_to_json(state).dump(2) + "\n";
    std::string temp;
    // Readable by root only: the file names every job's owner, pids and cgroups.
    int fd = create_temp_file_at(dir_fd, kStateFileName, 0600, &temp);
    if (fd < 0)
        return fail(error, "cannot create a temporary file next to " + path + ": " + std::strerror(errno) +
                               "; check that the state folder exists and is writable "
                               "(--state-dir)");
    const std::string temp_path = dir + "/" + temp;
    if (!write_all(fd, text) || ::fsync(fd) != 0) {
        int err = errno;
        ::close(fd);
        ::unlinkat(dir_fd, temp.c_str(), 0);
        return fail(error, "cannot write " + temp_path + ": " + std::strerror(err) +
                               "; check free space on the state folder's file system");
    }
    ::close(fd);
    // renameat() replaces whatever is at the name (a symlink too, never its target), in the folder
    // malld opened at start even if it was renamed since.
    if (::renameat(dir_fd, temp.c_str(), dir_fd, kStateFileName) != 0) {
        int err = errno;
        ::unlinkat(dir_fd, temp.c_str(), 0);
        return fail(error, "cannot rename " + temp_path + " to " + path + ": " + std::strerror(err));
    }
    ::fsync(dir_fd);  // makes the rename itself durable
    return true;
}

namespace {

// The folder `dir` opened for one call (no link followed at its last name), or -1 with *error.
int open_state_folder(const std::string &dir, std::string *error) {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && error)
        *error = "cannot open the state folder " + dir + ": " + std::strerror(errno) +
                 "; check that it exists and is a folder, not a symbolic link (--state-dir)";
    return fd;
}

}  // namespace

bool save_state(const std::string &dir, const SavedState &state, std::string *error) {
    const int fd = open_state_folder(dir, error);
    if (fd < 0) return false;
    const bool ok = save_state(fd, dir, state, error);
    ::close(fd);
    return ok;
}

int remove_stale_state_temp_files(int dir_fd) {
    const int listing = ::openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);  // closedir closes it
    if (listing < 0) return 0;
    DIR *folder = ::fdopendir(listing);
    if (!folder) {
        ::close(listing);
        return 0;
    }
    const std::string prefix = std::string(kStateFileName) + ".tmp";
    int removed = 0;
    while (dirent *entry = ::readdir(folder)) {
        const std::string name = entry->d_name;
        if (name != prefix && name.rfind(prefix + ".", 0) != 0) continue;
        if (::unlinkat(dir_fd, name.c_str(), 0) == 0) ++removed;  // never follows a link
    }
    ::closedir(folder);
    return removed;
}

int remove_stale_state_temp_files(const std::string &dir) {
    const int fd = open_state_folder(dir, nullptr);
    if (fd < 0) return 0;
    const int removed = remove_stale_state_temp_files(fd);
    ::close(fd);
    return removed;
}

std::optional<SavedState> load_state(int dir_fd, const std::string &dir, std::string *error) {
    if (error) error->clear();
    const std::string path = state_path(dir);
    int fd = ::openat(dir_fd, kStateFileName, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        if (errno == ENOENT) return std::nullopt;  // a fresh start
        if (error)
            *error = "cannot open the state file " + path + ": " +
                     (errno == ELOOP ? std::string("it is a symbolic link, which malld does not follow")
                                     : std::string(std::strerror(errno))) +
                     "; fix its permissions or move it away to start without re-adopting jobs";
        return std::nullopt;
    }
    struct stat st{};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        if (error)
            *error = "the state file " + path + " is not a regular file; move it away to start without "
                     "re-adopting jobs";
        return std::nullopt;
    }
    std::string text;
    char buf[65536];
    for (;;) {
        ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            int err = errno;
            ::close(fd);
            if (error) *error = "cannot read the state file " + path + ": " + std::strerror(err);
            return std::nullopt;
        }
        if (n == 0) break;
        text.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    const std::string fix = "; move it away to start without re-adopting running jobs";
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded()) {
        if (error) *error = "the state file " + path + " is not valid JSON (corrupt?)" + fix;
        return std::nullopt;
    }
    std::string why;
    auto state = state_from_json(j, &why);
    if (!state) {
        if (error) *error = "the state file " + path + " is unusable: " + why + fix;
        return std::nullopt;
    }
    return state;
}

std::optional<SavedState> load_state(const std::string &dir, std::string *error) {
    if (error) error->clear();
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return std::nullopt;  // no folder: a fresh start
        open_state_folder(dir, error);
        return std::nullopt;
    }
    auto state = load_state(fd, dir, error);
    ::close(fd);
    return state;
}

}  // namespace mall
