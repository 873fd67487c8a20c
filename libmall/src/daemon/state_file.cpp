// state_file.cpp — reads and writes "<dir>/malld.state.json". Writes are atomic (temp file, fsync,
// rename, fsync of the folder), so a crash leaves either the old or the new file. Reading checks
// the format name and schema version and every field, and rejects the whole file on any error.
#include "state_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

#include "../common/protocol.hpp"
#include "../common/rules.hpp"

namespace mall {

namespace {

constexpr const char *kStateFileName = "malld.state.json";
constexpr const char *kFormatName = "mall-malld-state";
constexpr int kSchemaVersion = 1;

std::string state_path(const std::string &dir) { return dir + "/" + kStateFileName; }

// Per-job fields that change at every progress report or ack: saved along with any other change,
// but never worth a disk write of their own (see state_fingerprint).
constexpr const char *kProgressFields[] = {"last_ack_latency_us", "work_units", "steps"};

nlohmann::json job_to_json(const SavedJob &saved) {
    const Job &job = saved.job;
    nlohmann::json pids = nlohmann::json::array();
    for (const auto &p : saved.pids) pids.push_back({{"pid", p.pid}, {"start_time", p.start_time}});
    return {
        {"job", job.spec.id},
        {"uid", job.spec.uid},
        {"min", job.spec.min},
        {"max", job.spec.max},
        {"weight", job.spec.weight},
        {"guaranteed", job.spec.guaranteed.to_string()},
        {"order", job.order},
        {"cpuset", job.cpuset.to_string()},
        {"published", job.published.to_string()},
        {"generation", job.generation},
        {"pinned", job.pinned ? nlohmann::json(job.pinned->to_string()) : nlohmann::json(nullptr)},
        {"usage_cap", job.usage_cap},
        {"transitions", job.transitions},
        {"ack_timeouts", job.ack_timeouts},
        {"last_ack_latency_us", job.last_ack_latency_us},
        {"work_units", job.work_units},
        {"steps", job.steps},
        {"pids", pids},
    };
}

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
    job.spec.uid = static_cast<uid_t>(r.integer("uid", 0, 0xFFFFFFFEll));
    job.spec.min = static_cast<int>(r.integer("min", 0, CpuSet::kMaxCpus));
    job.spec.max = static_cast<int>(r.integer("max", 1, CpuSet::kMaxCpus));
    if (job.spec.min > job.spec.max)
        throw std::runtime_error(r.where + ": min " + std::to_string(job.spec.min) +
                                 " is larger than max " + std::to_string(job.spec.max));
    job.spec.weight = r.real("weight");
    if (!valid_weight(job.spec.weight)) r.bad("weight", std::string("must be ") + kWeightRule);
    job.spec.guaranteed = r.cpus("guaranteed");
    job.order = r.unsigned_number("order");
    job.cpuset = r.cpus("cpuset");
    job.published = r.cpus("published");
    job.generation = r.unsigned_number("generation");
    const auto &pinned = r.field("pinned");
    if (!pinned.is_null()) job.pinned = r.cpus("pinned");
    // Absent in state files of malld 0.1 (no usage caps then).
    if (r.obj.contains("usage_cap")) job.usage_cap = static_cast<int>(r.integer("usage_cap", 0, CpuSet::kMaxCpus));
    job.transitions = r.unsigned_number("transitions");
    job.ack_timeouts = r.unsigned_number("ack_timeouts");
    job.last_ack_latency_us = r.real("last_ack_latency_us");
    job.work_units = r.unsigned_number("work_units");
    job.steps = r.unsigned_number("steps");
    const auto &pids = r.field("pids");
    if (!pids.is_array()) r.bad("pids", "must be an array");
    for (size_t i = 0; i < pids.size(); ++i) {
        if (!pids[i].is_object()) r.bad("pids", "must hold objects {pid, start_time}");
        Reader pr{pids[i], r.where + " pids[" + std::to_string(i) + "]"};
        SavedPid p;
        p.pid = static_cast<pid_t>(pr.integer("pid", 1, 0x7FFFFFFF));
        p.start_time = pr.unsigned_number("start_time");
        saved.pids.push_back(p);
        job.spec.pids.push_back(p.pid);
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
    nlohmann::json jobs = nlohmann::json::array();
    for (const auto &job : state.jobs) jobs.push_back(job_to_json(job));
    nlohmann::json reserved = nlohmann::json::object();
    for (const auto &[owner, cpus] : state.reserved) reserved[owner] = cpus.to_string();
    return {
        {"format", kFormatName},
        {"version", kSchemaVersion},
        {"pool", state.pool},
        {"reclaimed", state.reclaimed.to_string()},
        {"reserved", reserved},
        {"policy", state.policy},
        {"jobs", jobs},
    };
}

std::string state_fingerprint(const SavedState &state) {
    nlohmann::json j = state_to_json(state);
    for (auto &job : j["jobs"])
        for (const char *field : kProgressFields) job.erase(field);
    return j.dump();
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
        return state;
    } catch (const std::exception &e) {
        if (error) *error = e.what();
        return std::nullopt;
    }
}

bool save_state(const std::string &dir, const SavedState &state, std::string *error) {
    const std::string path = state_path(dir);
    const std::string temp = path + ".tmp";
    std::string text = state_to_json(state).dump(2) + "\n";
    int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return fail(error, "cannot create " + temp + ": " + std::strerror(errno) +
                               "; check that the state folder exists and is writable "
                               "(--state-dir)");
    if (!write_all(fd, text) || ::fsync(fd) != 0) {
        int err = errno;
        ::close(fd);
        ::unlink(temp.c_str());
        return fail(error, "cannot write " + temp + ": " + std::strerror(err) +
                               "; check free space on the state folder's file system");
    }
    ::close(fd);
    if (::rename(temp.c_str(), path.c_str()) != 0) {
        int err = errno;
        ::unlink(temp.c_str());
        return fail(error, "cannot rename " + temp + " to " + path + ": " + std::strerror(err));
    }
    // Make the rename itself durable.
    int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        ::fsync(dfd);
        ::close(dfd);
    }
    return true;
}

std::optional<SavedState> load_state(const std::string &dir, std::string *error) {
    if (error) error->clear();
    const std::string path = state_path(dir);
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return std::nullopt;  // a fresh start
        if (error)
            *error = "cannot open the state file " + path + ": " + std::strerror(errno) +
                     "; fix its permissions or move it away to start without re-adopting jobs";
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

}  // namespace mall
