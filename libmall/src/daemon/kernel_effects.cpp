// SPDX-License-Identifier: BSD-3-Clause
// kernel_effects.cpp — see kernel_effects.hpp. A page is sealed with kPageSeals (shared_page.hpp:
// no shrink, grow or future write, no more seals) right after malld maps it, so only malld's own
// mapping can ever write it.
#include "kernel_effects.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/shared_page.hpp"
#include "log.hpp"

namespace mall {

namespace {

double epoch_seconds() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

KernelEffects::~KernelEffects() {
    for (auto &[job, page] : pages_)
        if (page.page) ::munmap(page.page, kSharedPageSize);
}

std::vector<pid_t> KernelEffects::pids_of(const std::string &job) const {
    if (const Job *j = manager_ ? manager_->find(job) : nullptr) return j->spec.pids;
    return {};
}

bool KernelEffects::enforce(const std::string &job, const CpuSet &cpus, bool growing, std::string *error) {
    std::string why;
    bool ok = backend_.apply(job, pids_of(job), cpus, growing, &why);
    if (!ok) {
        log_warn("cannot enforce cpus '" + cpus.to_string() + "' on job " + job + ": " + why);
        if (error) *error = why;
    }
    return ok;
}

void KernelEffects::publish(const std::string &job, uint64_t generation, const CpuSet &cpus, int threads,
                            bool signal_control) {
    std::string error;
    JobPage *page = ensure_page(job, &error);
    if (!page) {
        log_error("cannot publish to job " + job + ": " + error);
        return;
    }
    write_page(*page, generation, cpus, threads, signal_control);
    connections_.notify_attached(job, generation);
}

std::optional<CpuTimeSample> KernelEffects::cpu_time(const std::string &job) {
    const unsigned long long now_ticks = boot_time_ticks();
    const std::vector<CpuTimeReading> readings = backend_.cpu_time_readings(job, pids_of(job));
    if (readings.empty()) return std::nullopt;
    CpuTimeAccount &account = cpu_time_[job];
    const double total = account.add_sample(readings, now_ticks);
    return CpuTimeSample{total, account.last_sample_began_a_counter()};
}

void KernelEffects::job_removed(const std::string &job) {
    backend_.remove(job);
    cpu_time_.erase(job);
    auto page = pages_.find(job);
    if (page != pages_.end()) {
        if (page->second.page) ::munmap(page->second.page, kSharedPageSize);
        pages_.erase(page);
    }
    pids_.forget_job(job);
    connections_.hang_up_job(job);
}

void KernelEffects::event(const nlohmann::json &event) {
    nlohmann::json ev = event;
    if (!ev.contains("time")) ev["time"] = epoch_seconds();
    // A job's own usage reports (mall_set_usage, at most one a second: NodeManager) are routine.
    const LogLevel level = ev.value("event", "") == "usage" ? LogLevel::Debug : LogLevel::Info;
    if (log_enabled(level)) log_line(level, "event " + ev.dump());
    connections_.broadcast_event(ev);
    if (end_observer_ && ev.value("event", "") == "end") end_observer_(ev);
}

KernelEffects::JobPage *KernelEffects::ensure_page(const std::string &job, std::string *error) {
    auto it = pages_.find(job);
    if (it != pages_.end()) return &it->second;
    auto fail = [&](const std::string &what) -> JobPage * {
        if (error) *error = what + " for job " + job + "'s page failed: " + std::strerror(errno);
        return nullptr;
    };
    UniqueFd fd(::memfd_create(("mall-page-" + job).c_str(), MFD_ALLOW_SEALING | MFD_CLOEXEC));
    if (!fd) return fail("memfd_create");
    if (::ftruncate(fd.get(), static_cast<off_t>(kSharedPageSize)) != 0) return fail("ftruncate");
    void *map = ::mmap(nullptr, kSharedPageSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (map == MAP_FAILED) return fail("mmap");
    auto *page = static_cast<SharedPage *>(map);
    page_init(page);
    // After this only malld's existing mapping can write: clients can map it read-only only.
    if (::fcntl(fd.get(), F_ADD_SEALS, kPageSeals) != 0) {
        ::munmap(map, kSharedPageSize);
        return fail("sealing (F_ADD_SEALS)");
    }
    JobPage &entry = pages_[job];
    entry.memfd = std::move(fd);
    entry.page = page;
    return &entry;
}

void KernelEffects::write_page(JobPage &page, uint64_t generation, const CpuSet &cpus, int threads,
                               bool signal_control) {
    uint64_t mask[MALL_MAX_CPUS / 64];
    cpus.to_mask(mask);
    page_write(page.page, generation, mask, cpus.count(), cpus.to_string().c_str(), threads,
               signal_control ? kPageFlagSignalControl : 0u);
}

}  // namespace mall
