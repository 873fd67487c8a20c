// SPDX-License-Identifier: BSD-3-Clause
// fuzz_state_file.cpp — libFuzzer target for malld's state-file reader, load_state(): the input is
// written as <tmp>/malld.state.json and read back as a restarting malld reads it. Checked besides
// "no crash, leak or sanitizer report": a refusal always says why (the file exists); the answer
// equals state_from_json() over the same text; an accepted state holds what the reader promises
// (valid, distinct job names, min <= max, positive finite weights, reserved cpus among the
// reclaimed, pids in range, cgroup paths plain: absolute, no '.', '..' or empty components, at
// most 4096 bytes; the seeds hold hostile ones, issue 37) and survives state_to_json -> state_from_json unchanged (same JSON,
// same fingerprint). The temporary folder is made once per process and removed at exit.
#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>

#include "common/files.hpp"
#include "common/protocol.hpp"
#include "daemon/state_file.hpp"
#include "fuzz_check.hpp"

namespace {

using mall::fuzz::shown;

std::string state_dir;

void remove_state_dir() {
    if (state_dir.empty()) return;
    ::unlink((state_dir + "/malld.state.json").c_str());
    ::unlink((state_dir + "/malld.state.json.tmp").c_str());
    ::rmdir(state_dir.c_str());
}

// Overwrites the file in place and then cuts it to size: ext4 flushes a file at close when it was
// truncated to zero and rewritten (auto_da_alloc), which made each run wait for the disk.
void write_state_file(std::string_view text) {
    const std::string path = state_dir + "/malld.state.json";
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    MALL_FUZZ_CHECK(fd >= 0, "cannot create " + path);
    size_t done = 0;
    while (done < text.size()) {
        ssize_t n = ::pwrite(fd, text.data() + done, text.size() - done, static_cast<off_t>(done));
        MALL_FUZZ_CHECK(n > 0, "cannot write " + path);
        done += static_cast<size_t>(n);
    }
    MALL_FUZZ_CHECK(::ftruncate(fd, static_cast<off_t>(text.size())) == 0, "cannot truncate " + path);
    ::close(fd);
}

void check_promises(const mall::SavedState &state) {
    MALL_FUZZ_CHECK(mall::CpuSet::parse(state.pool).has_value(), "pool is not a cpu list: " + shown(state.pool));
    for (const auto &[owner, cpus] : state.reserved)
        MALL_FUZZ_CHECK(state.reclaimed.contains(cpus), "reserved cpus of " + shown(owner) + " not reclaimed");
    std::set<std::string> names;
    for (const auto &saved : state.jobs) {
        const mall::JobSpec &spec = saved.job.spec;
        MALL_FUZZ_CHECK(!mall::proto::invalid_job_name(spec.id), "bad job name " + shown(spec.id));
        MALL_FUZZ_CHECK(names.insert(spec.id).second, "job " + spec.id + " twice");
        MALL_FUZZ_CHECK(spec.min >= 0 && spec.min <= spec.max && spec.max >= 1 && spec.max <= mall::CpuSet::kMaxCpus,
                        "job " + spec.id + ": min/max");
        MALL_FUZZ_CHECK(spec.weight > 0 && std::isfinite(spec.weight), "job " + spec.id + ": weight");
        MALL_FUZZ_CHECK(saved.job.usage_cap >= 0 && saved.job.usage_cap <= mall::CpuSet::kMaxCpus,
                        "job " + spec.id + ": usage_cap");
        MALL_FUZZ_CHECK(saved.pids.size() == spec.pids.size(), "job " + spec.id + ": pid lists differ");
        for (const auto &p : saved.pids)
            MALL_FUZZ_CHECK(p.pid >= 1 && p.pid <= mall::proto::kMaxPid, "job " + spec.id + ": pid");
        for (const auto &c : saved.cgroups)
            MALL_FUZZ_CHECK(mall::absolute_path_problem(c.path).empty(),
                            "job " + spec.id + ": cgroup path " + shown(c.path.substr(0, 200)) + " accepted");
    }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    const char *tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/mall-fuzz-state.XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
        std::perror(("fuzz_state_file: mkdtemp " + pattern).c_str());
        std::exit(1);
    }
    state_dir = pattern;
    std::atexit(remove_state_dir);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    std::string_view text(reinterpret_cast<const char *>(data), size);
    write_state_file(text);
    std::string error;
    auto state = mall::load_state(state_dir, &error);

    // The same text through state_from_json, as load_state reads it (nlohmann's parse, no throw).
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    std::string why;
    auto direct = j.is_discarded() ? std::nullopt : mall::state_from_json(j, &why);
    MALL_FUZZ_CHECK(state.has_value() == direct.has_value(), "load_state and state_from_json disagree: " + error + why);
    if (!state) {
        MALL_FUZZ_CHECK(!error.empty(), "a refused state file without words");
        return 0;
    }
    MALL_FUZZ_CHECK(error.empty(), "an accepted state file with an error: " + error);
    check_promises(*state);

    // What malld would write for this state reads back as the same state.
    nlohmann::json written = mall::state_to_json(*state);
    auto reread = mall::state_from_json(written, &why);
    MALL_FUZZ_CHECK(reread.has_value(), "malld cannot read what it writes: " + why + " in " + written.dump());
    MALL_FUZZ_CHECK(mall::state_to_json(*reread) == written, "a state changed in a round trip: " + written.dump());
    MALL_FUZZ_CHECK(mall::state_fingerprint(*reread) == mall::state_fingerprint(*state), "fingerprint changed");
    // And as text (dump(2), as save_state writes it).
    nlohmann::json from_text = nlohmann::json::parse(written.dump(2), nullptr, false);
    MALL_FUZZ_CHECK(!from_text.is_discarded() && from_text == written, "the written text does not parse back");
    return 0;
}
