// SPDX-License-Identifier: BSD-3-Clause
// slurm_jobs.cpp — SlurmChecker's thread and queue, and the libslurm query (built only with
// MALL_WITH_SLURM). The thread never touches malld's state: it only turns job ids into verdicts.
#include "slurm_jobs.hpp"

#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <functional>
#include <random>
#include <thread>
#include <unordered_map>
#include <utility>

#include "../common/quiet_thread.hpp"
#include "../common/rules.hpp"

#ifdef MALL_WITH_SLURM
#include <dlfcn.h>

#include <cerrno>

extern "C" {
#include <slurm/slurm.h>
#include <slurm/slurm_errno.h>
#include <slurm/slurm_version.h>
}
#endif

namespace mall {

std::string slurm_job_name(uint32_t job_id) { return std::string(kSlurmJobPrefix) + std::to_string(job_id); }

std::optional<uint32_t> slurm_job_id_of(const std::string &job_name) {
    const std::string_view prefix = kSlurmJobPrefix;  // common/rules.hpp
    if (job_name.size() <= prefix.size() || job_name.compare(0, prefix.size(), prefix) != 0)
        return std::nullopt;
    uint64_t id = 0;
    for (size_t i = prefix.size(); i < job_name.size(); ++i) {
        const char c = job_name[i];
        if (c < '0' || c > '9') return std::nullopt;
        id = id * 10 + static_cast<uint64_t>(c - '0');
        if (id > 0xFFFFFFFFull) return std::nullopt;
    }
    if (id == 0) return std::nullopt;
    return static_cast<uint32_t>(id);
}

SlurmChecker::SlurmChecker(std::unique_ptr<SlurmQuery> query)
    : query_(std::move(query)), event_fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    // The thread must not take malld's signals (they arrive through the loop's signalfd): it
    // blocks them all, whatever its creator's mask (quiet_thread.hpp).
    thread_ = start_quiet_thread([this] { loop(); });
}

SlurmChecker::~SlurmChecker() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
}

std::string merge_admin_comment(const std::string &existing, const std::string &node, const std::string &figures) {
    const std::string mine = "mall:" + node + ":";
    std::string merged;
    size_t start = 0;
    while (start <= existing.size()) {
        size_t end = existing.find(';', start);
        if (end == std::string::npos) end = existing.size();
        const std::string segment = existing.substr(start, end - start);
        if (!segment.empty() && segment.rfind(mine, 0) != 0) merged += segment + ";";
        start = end + 1;
    }
    return merged + mine + figures;
}

std::string admin_comment_merge_request(const std::string &node, const std::string &figures) {
    return std::string(kMergeRequestMark) + "mall:" + node + ":" + figures;
}

std::string job_submit_lua_problem(const std::string &job_submit_plugins) {
    // A comma-separated list; each entry "lua" or "job_submit/lua" (Slurm takes both).
    size_t start = 0;
    while (start <= job_submit_plugins.size()) {
        size_t end = job_submit_plugins.find(',', start);
        if (end == std::string::npos) end = job_submit_plugins.size();
        const std::string_view entry(job_submit_plugins.data() + start, end - start);
        if (entry == "lua" || entry == "job_submit/lua") return "";
        start = end + 1;
    }
    return "slurm.conf's JobSubmitPlugins is " +
           (job_submit_plugins.empty() ? std::string("not set") : "'" + job_submit_plugins + "'") +
           ", without lua: add lua to it and install mall's job_submit.lua beside slurm.conf (or call its "
           "mall_merge_admin_comment from your own slurm_job_modify), then restart slurmctld; or leave "
           "--slurm-comment-merge at malld";
}

std::string admin_comment_figures(const nlohmann::json &end_event) {
    auto real = [&](const char *field) {
        char buffer[64];
        std::snprintf(buffer, sizeof buffer, "%.1f", end_event.value(field, 0.0));
        return std::string(buffer);
    };
    auto count = [&](const char *field) { return std::to_string(end_event.value(field, uint64_t{0})); };
    std::string figures = "lent_core_s=" + real("lent_core_seconds") + ",core_s=" + real("core_seconds") +
                          ",resizes=" + count("resizes") + ",ack_timeouts=" + count("ack_timeouts") +
                          ",oversub_s=" + real("oversubscribed_seconds");
    if (const auto time = end_event.find("time"); time != end_event.end() && time->is_number()) {
        char buffer[64];
        std::snprintf(buffer, sizeof buffer, "%.3f", time->get<double>());
        figures += std::string(kEndedAtKey) + buffer;
    }
    return figures;
}

std::chrono::milliseconds admin_comment_turn(uint32_t nodes) {
    // 50 ms a node: its read and write are 2 RPC round trips, and a job's nodes end some 10-30 ms
    // apart (a node that reads before the nodes ahead of it wrote reads again). The whole job
    // within 1.5 s: its nodes' task-exits wait for their updates (kAnnotationWait, 2 s).
    if (nodes < 2) return std::chrono::milliseconds(0);
    return std::chrono::milliseconds(std::clamp<uint32_t>(1500 / nodes, 2, 50));
}

namespace {

// The nodes whose last figures `comment` holds, each with its ended_at (0 when it has none, as an
// older malld's segments): one pass over the field, whatever the job's size.
std::unordered_map<std::string, double> last_figures_by_node(const std::string &comment) {
    std::unordered_map<std::string, double> nodes;
    constexpr std::string_view kSegmentPrefix = "mall:";
    size_t start = 0;
    while (start <= comment.size()) {
        size_t end = comment.find(';', start);
        if (end == std::string::npos) end = comment.size();
        const std::string_view segment(comment.data() + start, end - start);
        start = end + 1;
        if (segment.substr(0, kSegmentPrefix.size()) != kSegmentPrefix ||
            segment.find(kRunningFiguresMark) != std::string_view::npos)
            continue;
        const size_t colon = segment.find(':', kSegmentPrefix.size());
        if (colon == std::string_view::npos) continue;
        double ended_at = 0;
        if (const size_t at = segment.find(kEndedAtKey); at != std::string_view::npos) {
            const std::string value(segment.substr(at + kEndedAtKey.size()));
            char *parsed_to = nullptr;
            ended_at = std::strtod(value.c_str(), &parsed_to);
            if (parsed_to == value.c_str()) ended_at = 0;
        }
        nodes[std::string(segment.substr(kSegmentPrefix.size(), colon - kSegmentPrefix.size()))] = ended_at;
    }
    return nodes;
}

bool ended_since(const std::unordered_map<std::string, double> &last, const std::string &node, double since) {
    const auto it = last.find(node);
    return it != last.end() && (since <= 0 || (it->second > 0 && it->second >= since));
}

}  // namespace

bool holds_last_figures(const std::string &comment, const std::string &node, double since) {
    return ended_since(last_figures_by_node(comment), node, since);
}

namespace {

// A multi-node job's ended node, in its chain (see update_admin_comment): Kept or Failed once it
// wrote, Wait while the nodes after it in the list have not all written, nullopt when it should
// go on with the read-back loop instead (given up, broken chain, or this node not in the list).
std::optional<CommentUpdate> write_in_turn(const LoadedComment &comment, std::chrono::nanoseconds round_trip,
                                           const std::function<bool(const std::string &)> &store,
                                           const std::string &node, const std::string &figures,
                                           CommentChain &chain) {
    // The chain runs from the list's last node to its first: the first is the batch host, whose
    // job ends last (its batch script outlives the steps on the other nodes).
    const std::vector<std::string> order(comment.node_names.rbegin(), comment.node_names.rend());
    const auto me = std::find(order.begin(), order.end(), node);
    if (me == order.end()) return std::nullopt;
    // In an unbroken chain the nodes that wrote come first in that order. One that wrote after a
    // node missing before it (this one included) gave up waiting and goes on the read-back way,
    // and may write again at any moment: so does this one.
    const auto last = last_figures_by_node(comment.text);
    size_t missing = 0;
    bool broken = false;
    for (auto it = order.begin(); it != order.end() && !broken; ++it) {
        const bool wrote = it != me && ended_since(last, *it, chain.part_began_at);
        if (wrote && (missing > 0 || it > me)) broken = true;
        if (!wrote && it < me) ++missing;
    }
    if (broken) return std::nullopt;
    if (missing == 0)
        return store(merge_admin_comment(comment.text, node, figures)) ? CommentUpdate::Kept : CommentUpdate::Failed;
    const auto now = std::chrono::steady_clock::now();
    if (chain.missing == SIZE_MAX) chain.give_up_at = now + kChainWait;
    chain.stalled_reads = missing < chain.missing ? 0 : chain.stalled_reads + 1;
    chain.missing = missing;
    if (chain.stalled_reads >= kChainStalledReads || now >= chain.give_up_at) return std::nullopt;
    // Each missing node is due a turn after the next (admin_comment_turn), or, when slurmctld is
    // slower, a read and a write after it: wait that long for them, twice as long after each read
    // that showed none of them, at most 200 ms and never past the give-up time.
    using std::chrono::milliseconds;
    const auto per_node = std::max<std::chrono::nanoseconds>(
        {2 * round_trip, admin_comment_turn(comment.nodes), milliseconds(5)});
    const auto pause = std::min<std::chrono::nanoseconds>(
        {per_node * static_cast<int64_t>(std::min<size_t>(missing, 40)) * (int64_t{1} << chain.stalled_reads),
         milliseconds(200), chain.give_up_at - now});
    chain.retry_in = std::max(milliseconds(1), std::chrono::ceil<milliseconds>(pause));
    return CommentUpdate::Wait;
}

}  // namespace

CommentUpdate update_admin_comment(const std::function<bool(LoadedComment *)> &load,
                                   const std::function<bool(const std::string &)> &store, const std::string &node,
                                   const std::string &figures, CommentChain *chain, int attempts) {
    const std::string segment = "mall:" + node + ":" + figures;
    LoadedComment comment;
    const auto asked = std::chrono::steady_clock::now();
    if (!load(&comment)) return CommentUpdate::Failed;
    const auto round_trip = std::chrono::steady_clock::now() - asked;
    // A job on one node: no other node of it writes.
    if (comment.nodes == 1)
        return store(merge_admin_comment(comment.text, node, figures)) ? CommentUpdate::Kept : CommentUpdate::Failed;
    if (chain != nullptr && figures.find(kRunningFiguresMark) == std::string::npos)
        if (auto in_turn = write_in_turn(comment, round_trip, store, node, figures, *chain)) return *in_turn;

    std::minstd_rand jitter(static_cast<unsigned>(::getpid()) ^
                            static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
    for (int attempt = 0; attempt < attempts; ++attempt) {
        // Another node wrote between our read and write: try again a little later, at a random
        // moment in a window that grows with the job's nodes (all of them may be retrying).
        if (attempt > 0) {
            std::this_thread::sleep_for(std::chrono::milliseconds(
                20 + jitter() % (100 + 10 * std::min<uint32_t>(comment.nodes, 1000))));
            if (!load(&comment)) return CommentUpdate::Failed;
        }
        if (!store(merge_admin_comment(comment.text, node, figures))) return CommentUpdate::Failed;
        if (!load(&comment)) return CommentUpdate::Failed;
        // Kept when the field, read back, holds our segment whole (as a ';'-separated part).
        const std::string padded = ";" + comment.text + ";";
        if (padded.find(";" + segment + ";") != std::string::npos) return CommentUpdate::Kept;
    }
    return CommentUpdate::Lost;
}

uint64_t SlurmChecker::annotate(uint32_t job_id, std::string figures, bool running, bool behind_in_flight,
                                std::chrono::milliseconds delay, double part_began_at) {
    uint64_t ticket = 0;
    {
        std::lock_guard<std::mutex> lock(mu_);
        ticket = ++last_ticket_;
        if (running) {
            for (auto &queued : running_annotations_)
                if (queued.job_id == job_id) {  // newer figures, same place in the queue
                    queued.figures = std::move(figures);
                    queued.ticket = ticket;
                    return ticket;
                }
            // In flight, or its end is being recorded (an explicit request waits only for the former).
            if (annotating_.count(job_id) != 0 && (!behind_in_flight || ending_.count(job_id) != 0)) return 0;
            running_annotations_.push_back({job_id, std::move(figures), ticket, {}, {}});
        } else {
            // A running update sent after this one would overwrite the job's last figures.
            for (auto it = running_annotations_.begin(); it != running_annotations_.end();) {
                if (it->job_id != job_id) {
                    ++it;
                    continue;
                }
                annotating_.erase(annotating_.find(job_id));
                it = running_annotations_.erase(it);
            }
            CommentChain chain;
            chain.part_began_at = part_began_at;
            annotations_.push_back({job_id, std::move(figures), ticket, std::chrono::steady_clock::now() + delay, chain});
            ending_.insert(job_id);
        }
        annotating_.insert(job_id);
    }
    wake_.notify_one();
    return ticket;
}

bool SlurmChecker::annotating(uint32_t job_id) const {
    std::lock_guard<std::mutex> lock(mu_);
    return ending_.count(job_id) != 0;
}

std::vector<SlurmAnnotation> SlurmChecker::take_annotations() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<SlurmAnnotation> taken = std::exchange(annotated_, {});
    drain_fd_if_nothing_waits();
    return taken;
}

// Under mu_ (the lock the thread signals under): the fd stays readable exactly while results or
// finished updates wait. Draining it whenever either is taken lost the other's wake-up: an update
// finished between a caller's take_annotations() and take_results() waited for the next event.
void SlurmChecker::drain_fd_if_nothing_waits() {
    if (!annotated_.empty() || !results_.empty()) return;
    uint64_t count = 0;
    while (::read(event_fd_.get(), &count, sizeof count) > 0) {
    }
}

void SlurmChecker::check(const std::set<uint32_t> &job_ids) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        for (uint32_t id : job_ids)
            if (queued_.insert(id).second) pending_.push_back(id);
    }
    wake_.notify_one();
}

std::vector<SlurmJobState> SlurmChecker::take_results() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<SlurmJobState> taken = std::exchange(results_, {});
    drain_fd_if_nothing_waits();
    return taken;
}

void SlurmChecker::loop() {
    for (;;) {
        uint32_t id = 0;
        {
            std::unique_lock<std::mutex> lock(mu_);
            // An ended job's figures come first once their time has come (its stepd waits on
            // them), then queries, then a running job's figures so far.
            auto ready_end = annotations_.end();
            for (;;) {
                if (stop_) return;
                const auto now = std::chrono::steady_clock::now();
                auto earliest = std::chrono::steady_clock::time_point::max();
                ready_end = annotations_.end();
                for (auto it = annotations_.begin(); it != annotations_.end(); ++it) {
                    if (it->not_before <= now) {
                        ready_end = it;
                        break;
                    }
                    earliest = std::min(earliest, it->not_before);
                }
                if (ready_end != annotations_.end() || !pending_.empty() || !running_annotations_.empty()) break;
                if (annotations_.empty())
                    wake_.wait(lock);
                else
                    wake_.wait_until(lock, earliest);
            }
            const bool ended = ready_end != annotations_.end();
            if (ended || pending_.empty()) {
                QueuedAnnotation next;
                if (ended) {
                    next = std::move(*ready_end);
                    annotations_.erase(ready_end);
                } else {
                    next = std::move(running_annotations_.front());
                    running_annotations_.pop_front();
                }
                lock.unlock();
                SlurmAnnotation done;
                done.job_id = next.job_id;
                done.running = !ended;
                done.ticket = next.ticket;
                std::chrono::milliseconds retry_in{0};
                try {
                    const SlurmQuery::Annotated outcome =
                        query_->annotate(next.job_id, next.figures, ended ? &next.chain : nullptr);
                    done.error = outcome.error;
                    done.finished = outcome.finished;
                    retry_in = outcome.error.empty() ? outcome.retry_in : std::chrono::milliseconds(0);
                } catch (const std::exception &e) {
                    done.error = e.what();
                }
                lock.lock();
                // The nodes before this one in the job's list have not all written: back in the
                // queue, still counted as annotating (its Deregister keeps waiting), other work
                // going on meanwhile.
                if (ended && retry_in.count() > 0) {
                    next.not_before = std::chrono::steady_clock::now() + retry_in;
                    annotations_.push_back(std::move(next));
                    continue;
                }
                const uint32_t job_id = next.job_id;
                done.figures = std::move(next.figures);
                annotating_.erase(annotating_.find(job_id));
                if (ended) ending_.erase(ending_.find(job_id));
                annotated_.push_back(std::move(done));
                const uint64_t one = 1;
                ssize_t ignored = ::write(event_fd_.get(), &one, sizeof one);
                (void)ignored;
                continue;
            }
            id = pending_.front();
            pending_.pop_front();
            queued_.erase(id);
        }
        SlurmJobState state;
        try {
            state = query_->query(id);
        } catch (const std::exception &e) {
            state.kind = SlurmJobState::Kind::Unreachable;
            state.detail = e.what();
        }
        state.job_id = id;
        std::lock_guard<std::mutex> lock(mu_);
        results_.push_back(std::move(state));
        const uint64_t one = 1;
        ssize_t ignored = ::write(event_fd_.get(), &one, sizeof one);
        (void)ignored;
    }
}

#ifdef MALL_WITH_SLURM

namespace {

// libslurm 22.05 keeps its own state names private; these are the base states of enum job_states.
const char *base_state_name(uint32_t state) {
    switch (state & JOB_STATE_BASE) {
        case JOB_PENDING: return "PENDING";
        case JOB_RUNNING: return "RUNNING";
        case JOB_SUSPENDED: return "SUSPENDED";
        case JOB_COMPLETE: return "COMPLETED";
        case JOB_CANCELLED: return "CANCELLED";
        case JOB_FAILED: return "FAILED";
        case JOB_TIMEOUT: return "TIMEOUT";
        case JOB_NODE_FAIL: return "NODE_FAIL";
        case JOB_PREEMPTED: return "PREEMPTED";
        case JOB_BOOT_FAIL: return "BOOT_FAIL";
        case JOB_DEADLINE: return "DEADLINE";
        case JOB_OOM: return "OUT_OF_MEMORY";
        default: return "UNKNOWN";
    }
}

// A Slurm node list ("n[1-3],m7") as names in Slurm's order (the order of the job's node ids);
// empty when libslurm cannot parse it.
std::vector<std::string> expand_node_list(const char *list) {
    std::vector<std::string> names;
    auto hosts = slurm_hostlist_create(list);  // hostlist_t in 22.05, hostlist_t * in 24.11
    if (hosts == nullptr) return names;
    while (char *name = slurm_hostlist_shift(hosts)) {
        names.emplace_back(name);
        std::free(name);  // slurm_hostlist_shift's strings are malloc'd
    }
    slurm_hostlist_destroy(hosts);
    return names;
}

// One job, with its resources, from this cluster's slurmctld: SHOW_LOCAL keeps slurm_load_job from
// first asking slurmctld for the federation (REQUEST_FED_INFO), one RPC instead of two.
constexpr uint16_t kLoadOneJob = SHOW_DETAIL | SHOW_LOCAL;

// How long Slurm's description of this node is reused before it is asked again (it changes only
// when slurmctld is reconfigured).
constexpr std::chrono::minutes kNodeShapeMaxAge{5};

class LibSlurmQuery final : public SlurmQuery {
public:
    LibSlurmQuery(std::string node, CommentMerge merge) : node_(std::move(node)), merge_(merge) { slurm_init(nullptr); }

    // libslurm up to 22.05 exports slurm_job_cpus_allocated_str_on_node (the job's abstract core
    // ids on a node); 24.11's neither declares nor exports it. Looked up at run time so one source
    // builds against both; without it a Running job has no slurm_cores and the prolog's lookup is
    // refused, and the Slurm plugin's Reclaim at each step's start (S_JOB_ALLOC_CORES) does the work.
    using CoresOnNode = int (*)(char *, size_t, job_resources_t *, const char *);
    static CoresOnNode cores_on_node() {
        static const auto fn = reinterpret_cast<CoresOnNode>(::dlsym(RTLD_DEFAULT, "slurm_job_cpus_allocated_str_on_node"));
        return fn;
    }
    ~LibSlurmQuery() override { slurm_fini(); }

    SlurmJobState query(uint32_t job_id) override {
        SlurmJobState out;
        job_info_msg_t *info = nullptr;
        if (slurm_load_job(&info, job_id, kLoadOneJob) != SLURM_SUCCESS) {
            const int err = errno;
            if (err == ESLURM_INVALID_JOB_ID) {
                out.kind = SlurmJobState::Kind::NotRunning;
                out.detail = "unknown to slurmctld";
            } else {
                out.kind = SlurmJobState::Kind::Unreachable;
                out.detail = slurm_strerror(err);
            }
            return out;
        }
        if (info == nullptr || info->record_count == 0) {
            out.kind = SlurmJobState::Kind::NotRunning;
            out.detail = "unknown to slurmctld";
        } else {
            const slurm_job_info_t &job = info->job_array[0];
            const uint32_t base = job.job_state & JOB_STATE_BASE;
            out.detail = base_state_name(job.job_state);
            out.uid = job.user_id;
            if (base == JOB_RUNNING) {
                out.kind = SlurmJobState::Kind::Running;
                // slurm_job_cpus_allocated_str_on_node (22.05, src/api/job_info.c) lists each core
                // of the job on the node as `threads` ids, with threads read from a node table that
                // libslurm loads only inside slurm_sprint_job_info (and indexes there by the job's
                // node index, not the cluster's). malld never prints job info, so threads is 1 and
                // the list holds Slurm's abstract core ids, as S_JOB_ALLOC_CORES does. Do not call
                // slurm_sprint_job_info or slurm_print_job_info in malld.
                char cores[4096] = {};
                if (job.job_resrcs != nullptr && cores_on_node() != nullptr &&
                    cores_on_node()(cores, sizeof cores, job.job_resrcs, node_.c_str()) == 0) {
                    if (auto set = CpuSet::parse(cores)) out.slurm_cores = *set;
                } else if (cores_on_node() == nullptr) {
                    out.detail += " (this Slurm's libslurm cannot list a job's cores on a node: the "
                                  "plugin reclaims them at each step's start instead)";
                }
                out.slurm_node = node_shape();
            } else {
                out.kind = SlurmJobState::Kind::NotRunning;
            }
        }
        slurm_free_job_info_msg(info);
        return out;
    }

    // AdminComment is what Slurm keeps for administrators: only SlurmUser, root or an operator
    // may set it, users cannot change it (as they can Comment), and slurmdbd stores it with the
    // job (sacct -o AdminComment). slurmctld refuses updates once the job has finished, so malld
    // sends it as the job's last process ends (the Slurm plugin's task-exit waits for it).
    Annotated annotate(uint32_t job_id, const std::string &figures, CommentChain *chain) override {
        auto failed = [](const char *what) {
            const int err = errno;
            Annotated out;
            out.finished = err == ESLURM_JOB_FINISHED || err == ESLURM_ALREADY_DONE || err == ESLURM_INVALID_JOB_ID;
            out.error = std::string(what) + slurm_strerror(err);
            if (err == ESLURM_ACCESS_DENIED || err == ESLURM_USER_ID_MISSING)
                out.error += " (only root, SlurmUser or an operator may set AdminComment: run malld as root)";
            return out;
        };
        Annotated out;
        auto load = [&](LoadedComment *comment) {
            job_info_msg_t *info = nullptr;
            if (slurm_load_job(&info, job_id, kLoadOneJob) != SLURM_SUCCESS) {
                out = failed("cannot load the job: ");
                return false;
            }
            *comment = LoadedComment{};
            if (info != nullptr && info->record_count > 0) {
                const slurm_job_info_t &job = info->job_array[0];
                if (job.admin_comment != nullptr) comment->text = job.admin_comment;
                comment->nodes = job.num_nodes;
                if (comment->nodes > 1 && job.nodes != nullptr) comment->node_names = expand_node_list(job.nodes);
            }
            if (info != nullptr) slurm_free_job_info_msg(info);
            return true;
        };
        auto store = [&](const std::string &comment) {
            std::string text = comment;
            job_desc_msg_t update;
            slurm_init_job_desc_msg(&update);
            update.job_id = job_id;
            update.admin_comment = text.data();
            if (slurm_update_job(&update) == SLURM_SUCCESS) return true;
            out = failed("cannot set its AdminComment: ");
            return false;
        };
        // slurmctld merges (job_submit.lua): one write, whatever the job's nodes; nothing to read.
        if (merge_ == CommentMerge::Slurmctld) return store(admin_comment_merge_request(node_, figures)) ? Annotated{} : out;
        CommentChain *const in_turn = chain;
        switch (update_admin_comment(load, store, node_, figures, in_turn)) {
            case CommentUpdate::Kept: return {};
            case CommentUpdate::Wait: return {{}, false, in_turn->retry_in};
            case CommentUpdate::Failed: return out;
            case CommentUpdate::Lost:
                return {"other nodes kept replacing the AdminComment (each try read it, added this node's "
                        "segment and wrote it back); the figures are in malld's history", false};
        }
        return out;
    }

    // libslurm's parsed slurm.conf (slurm_init read it, or fetched it once, configless): the
    // global `slurm_conf` (src/common/read_config.h), not declared in slurm.h; looked up at run
    // time, so a libslurm that does not export it leaves the spool unknown instead of failing to
    // link (malld then says so and asks slurmctld). Its layout is the slurm_conf_t of the
    // slurm.h this file is built against, the libslurm malld links.
    static const slurm_conf_t *loaded_conf() {
        static const auto *conf = static_cast<const slurm_conf_t *>(::dlsym(RTLD_DEFAULT, "slurm_conf"));
        return conf;
    }
    std::string slurmd_spool_pattern() const override {
        const slurm_conf_t *conf = loaded_conf();
        return conf != nullptr && conf->slurmd_spooldir != nullptr ? conf->slurmd_spooldir : "";
    }
    uid_t slurmd_uid() const override {
        const slurm_conf_t *conf = loaded_conf();
        return conf != nullptr ? static_cast<uid_t>(conf->slurmd_user_id) : 0;
    }
    bool lists_cores() const override { return cores_on_node() != nullptr; }
    std::string job_submit_plugins() const override {
        const slurm_conf_t *conf = loaded_conf();
        return conf != nullptr && conf->job_submit_plugins != nullptr ? conf->job_submit_plugins : "";
    }
    bool merges_in_slurmctld() const override { return merge_ == CommentMerge::Slurmctld; }

private:
    // Slurm's sockets, cores per socket and threads per core of this node (unknown on failure).
    SlurmNodeShape node_shape() {
        const auto now = std::chrono::steady_clock::now();
        if (shape_.known() && now - shape_asked_ < kNodeShapeMaxAge) return shape_;
        shape_ = SlurmNodeShape{};
        node_info_msg_t *nodes = nullptr;
        if (slurm_load_node_single(&nodes, const_cast<char *>(node_.c_str()), SHOW_ALL) == SLURM_SUCCESS &&
            nodes != nullptr && nodes->record_count > 0) {
            const node_info_t &n = nodes->node_array[0];
            shape_ = SlurmNodeShape{n.sockets, n.cores, n.threads};
            shape_asked_ = now;
        }
        if (nodes != nullptr) slurm_free_node_info_msg(nodes);
        return shape_;
    }

    std::string node_;
    CommentMerge merge_;
    SlurmNodeShape shape_;  // only the checker's thread calls query(): no lock
    std::chrono::steady_clock::time_point shape_asked_{};
};

}  // namespace

std::unique_ptr<SlurmQuery> make_libslurm_query(const std::string &node_name, std::string *why, CommentMerge merge) {
    if (why) {
        *why = "libslurm " + std::to_string(SLURM_VERSION_MAJOR(SLURM_VERSION_NUMBER)) + "." +
               std::to_string(SLURM_VERSION_MINOR(SLURM_VERSION_NUMBER)) + ", node " + node_name;
    }
    return std::make_unique<LibSlurmQuery>(node_name, merge);
}

#else

std::unique_ptr<SlurmQuery> make_libslurm_query(const std::string &, std::string *why, CommentMerge) {
    if (why) {
        *why = "this malld was built without libslurm (install libslurm-dev and reconfigure with "
               "-DMALL_WITH_SLURM=ON)";
    }
    return nullptr;
}

#endif

}  // namespace mall
