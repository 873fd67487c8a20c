// SPDX-License-Identifier: BSD-3-Clause
// policy.cpp — the co-scheduling policies as pure functions, in two steps: how many cpus each job
// gets (prepare(), then count_into(): static, equal and weighted here, throughput through
// throughput_policy.hpp), then which ones (placement: keep what a job holds, whole cores first,
// grow by whole cores along the hwloc tree, odd PUs last). compute_allocation and compute_counts
// share the counting, so the tests of counts test what malld runs. Guarantees as policy.hpp
// states; when the pool cannot cover every job's min, jobs registered earlier get their min first
// and later ones get what is left (possibly 0 cpus).
#include "policy.hpp"

#include <algorithm>
#include <array>

#include "registration_order.hpp"

namespace mall {

namespace {

// A job as counting and placement see it: guaranteed and pinned already cut to the pool and made
// disjoint, and its limits adjusted so that its guaranteed cpus always fit.
struct Prepared {
    const PolicyJob *job = nullptr;
    CpuSet guaranteed;
    std::optional<CpuSet> pinned;
    int min = 0;
    int max = 0;
    int count = 0;
    int held = 0;  // cpus of the pool it holds now: breaks ties
};

// The counting core. `prepared` is in registration order. Pinned jobs take exactly their pinned
// cpus; every other job first gets its guaranteed cpus (they are physically its own), then jobs
// are raised to their min in registration order while the pool lasts. `static` stops there;
// `throughput` divides the rest by measured speedup (compute_throughput_counts); `equal` and
// `weighted` lend it one cpu at a time, as the comment in the loop below says.
void count_into(PolicyKind kind, int pool_size, std::vector<Prepared> &prepared) {
    int left = pool_size;
    for (auto &p : prepared) {
        p.count = p.pinned ? p.pinned->count() : p.guaranteed.count();
        left -= p.count;
    }
    if (left < 0) left = 0;
    for (auto &p : prepared) {
        if (p.pinned) continue;
        const int want = std::max(0, std::min(p.min, p.max) - p.count);
        const int grant = std::min(want, left);
        p.count += grant;
        left -= grant;
    }
    if (kind == PolicyKind::Static) return;
    if (kind == PolicyKind::Throughput) {
        // Every unpinned job already holds its guaranteed cpus and its min: those are the
        // throughput core's floors; it divides what is left by measured speedup.
        std::vector<ThroughputJob> input;
        int share = left;
        for (const auto &p : prepared) {
            if (p.pinned) continue;
            ThroughputJob t;
            t.id = p.job->id;
            t.min = p.count;
            t.max = std::max(p.count, p.max);
            t.order = p.job->order;
            t.current = p.held;
            t.in_dwell = p.job->in_dwell;
            t.samples = p.job->samples;
            input.push_back(std::move(t));
            share += p.count;
        }
        const auto counts = compute_throughput_counts(share, input);
        for (auto &p : prepared) {
            if (auto it = counts.find(p.job->id); !p.pinned && it != counts.end()) p.count = it->second;
        }
        return;
    }
    // equal: the job with the fewest cpus gets the next one. weighted: the job whose weight per
    // cpu after the grant is largest (weight / (count + 1), the divisor method of Jefferson and
    // D'Hondt), so cpus end in proportion to the weights as nearly as whole cpus allow; equal is
    // weighted with every weight 1. Ties: the job that holds more now (saves moves), then the
    // earlier job.
    auto claim = [kind](const Prepared &p) {
        const double weight = kind == PolicyKind::Weighted ? p.job->weight : 1.0;
        return weight / (p.count + 1);
    };
    while (left > 0) {
        Prepared *best = nullptr;
        for (auto &p : prepared) {
            if (p.pinned || p.count >= p.max) continue;
            if (best == nullptr || claim(p) > claim(*best) ||
                (claim(p) == claim(*best) && p.held > best->held)) {
                best = &p;  // prepared is in order, so a full tie keeps the earlier job
            }
        }
        if (best == nullptr) break;
        ++best->count;
        --left;
    }
}

std::vector<Prepared> prepare(const CpuSet &pool, const std::vector<PolicyJob> &jobs) {
    std::vector<Prepared> prepared;
    prepared.reserve(jobs.size());
    CpuSet guaranteed_so_far;
    for (size_t i : registration_order(jobs)) {
        Prepared p;
        p.job = &jobs[i];
        // Guaranteed cpus outside the pool are not ours to give; an overlap with an earlier job's
        // guarantee (which validation should have refused) goes to the earlier job.
        p.guaranteed = (jobs[i].guaranteed & pool) - guaranteed_so_far;
        guaranteed_so_far |= p.guaranteed;
        p.max = std::max(jobs[i].max, p.guaranteed.count());
        p.min = std::max(jobs[i].min, 0);
        p.held = (jobs[i].current & pool).count();
        prepared.push_back(std::move(p));
    }
    // Pinned sets yield to every other job's guarantee and to earlier pins.
    CpuSet pinned_so_far;
    for (auto &p : prepared) {
        if (!p.job->pinned) continue;
        CpuSet others_guaranteed = guaranteed_so_far - p.guaranteed;
        p.pinned = ((*p.job->pinned & pool) - others_guaranteed) - pinned_so_far;
        pinned_so_far |= *p.pinned;
        p.guaranteed &= *p.pinned;
    }
    return prepared;
}

// How many cpus each job gets from `pool`: the one counting path of compute_allocation and
// compute_counts.
std::vector<Prepared> counted(PolicyKind kind, const CpuSet &pool, const std::vector<PolicyJob> &jobs) {
    std::vector<Prepared> prepared = prepare(pool, jobs);
    count_into(kind, pool.count(), prepared);
    return prepared;
}

// Cpus of the pool in the order placement walks: tree order, then cpus the topology does not
// know (kept last, so they are used only when nothing else is left).
std::vector<int> walk_order(const Topology &topology, const CpuSet &pool) {
    std::vector<int> order;
    for (int cpu : topology.cpus_in_tree_order()) {
        if (pool.contains(cpu)) order.push_back(cpu);
    }
    for (int cpu : pool.to_vector()) {
        if (topology.tree_index(cpu) < 0) order.push_back(cpu);
    }
    return order;
}

// The cores placement hands out: each cpu's core (Topology::cores(); a cpu of the pool the topology
// does not know is a core of its own), each core's PUs in the topology and in the pool.
class CoreMap {
public:
    CoreMap(const Topology &topology, const CpuSet &pool) : core_of_(CpuSet::kMaxCpus, -1) {
        for (const auto &pus : topology.cores()) {
            const int core = static_cast<int>(size_.size());
            size_.push_back(static_cast<int>(pus.size()));
            in_pool_.push_back(0);
            for (int cpu : pus) core_of_[cpu] = core;
        }
        for (int cpu : pool.to_vector()) {
            if (core_of_[cpu] < 0) {
                core_of_[cpu] = static_cast<int>(size_.size());
                size_.push_back(1);
                in_pool_.push_back(0);
            }
            ++in_pool_[core_of_[cpu]];
        }
    }
    int core_of(int cpu) const { return cpu >= 0 && cpu < CpuSet::kMaxCpus ? core_of_[cpu] : -1; }
    int size(int core) const { return size_[core]; }         // PUs of the core
    int in_pool(int core) const { return in_pool_[core]; }   // of which in the pool
    int count() const { return static_cast<int>(size_.size()); }

private:
    std::vector<int> core_of_;
    std::vector<int> size_;
    std::vector<int> in_pool_;
};

// One job's view of the cores while its set grows from `candidates` (or, when it shrinks, while
// it picks which of its cpus to keep): per core, the PUs it has chosen, the candidates left, and
// whether another job is on it (`others`: cpus of other jobs, pins and guarantees).
class CoreTally {
public:
    CoreTally(const CoreMap &cores, const std::vector<int> &candidates, const CpuSet &chosen,
              const CpuSet &others)
        : cores_(cores), own_(cores.count(), 0), left_(cores.count(), 0), other_(cores.count(), 0) {
        for (int cpu : chosen.to_vector()) {
            if (cores.core_of(cpu) >= 0) ++own_[cores.core_of(cpu)];
        }
        for (int cpu : candidates) {
            if (!chosen.contains(cpu) && cores.core_of(cpu) >= 0) ++left_[cores.core_of(cpu)];
        }
        for (int cpu : others.to_vector()) {
            if (cores.core_of(cpu) >= 0) ++other_[cores.core_of(cpu)];
        }
    }
    bool own(int cpu) const { return own_[core(cpu)] > 0; }
    bool clean(int cpu) const { return other_[core(cpu)] == 0; }
    // The job can hold every PU of the core (what it has there plus the candidates left).
    bool whole(int cpu) const {
        const int c = core(cpu);
        return own_[c] + left_[c] == cores_.size(c);
    }
    // Taking the cpu splits nothing: the job is on the core already, or takes every candidate PU
    // of it within `need`. Growing (`may_join_others` false) also wants no other job there.
    bool splits_nothing(int cpu, int need, bool may_join_others) const {
        const int c = core(cpu);
        return (may_join_others || other_[c] == 0) && (own_[c] > 0 || left_[c] <= need);
    }
    // Which cpu to take first, before locality: the job's own core, then (with 2 or more to go in
    // the first pass) a core it can hold whole, then a core no other job is on.
    std::array<int, 3> rank(int cpu, int need, bool first_pass) const {
        const bool whole_core_wanted = first_pass && need >= 2 && whole(cpu);
        return {own(cpu) ? 1 : 0, whole_core_wanted ? 1 : 0, clean(cpu) ? 1 : 0};
    }
    void take(int cpu) {
        ++own_[core(cpu)];
        --left_[core(cpu)];
    }

private:
    int core(int cpu) const { return cores_.core_of(cpu); }
    const CoreMap &cores_;
    std::vector<int> own_;
    std::vector<int> left_;
    std::vector<int> other_;
};

// Greedy growth: adds up to `need` cpus from `candidates` (in walk order) to `chosen`, each time
// the best by CoreTally::rank, then the one whose deepest shared ancestor with a cpu already
// chosen is deepest, then the earliest in walk order. The first pass takes only cpus that split
// no core (CoreTally::splits_nothing), so whole cores go first; the second pass takes the rest.
// With one PU per core every cpu ranks alike and this is plain nearest-first growth. Returns how
// many cpus it added.
int grow(const Topology &topology, const CoreMap &cores, const std::vector<int> &candidates,
         int need, const CpuSet &others, bool first_pass, bool may_join_others, CpuSet &chosen) {
    if (need <= 0 || candidates.empty()) return 0;
    CoreTally tally(cores, candidates, chosen, others);
    std::vector<int> best(candidates.size(), -2);  // -2: not yet compared; -3: taken
    const std::vector<int> chosen_list = chosen.to_vector();
    for (size_t i = 0; i < candidates.size(); ++i) {
        if (chosen.contains(candidates[i])) {
            best[i] = -3;
            continue;
        }
        for (int c : chosen_list) best[i] = std::max(best[i], topology.shared_depth(candidates[i], c));
    }
    int added = 0;
    for (; added < need; ++added) {
        const int left = need - added;
        int pick = -1;
        std::array<int, 3> pick_rank{};
        for (size_t i = 0; i < candidates.size(); ++i) {
            if (best[i] == -3) continue;
            const int cpu = candidates[i];
            if (first_pass && !tally.splits_nothing(cpu, left, may_join_others)) continue;
            const auto rank = tally.rank(cpu, left, first_pass);
            if (pick < 0 || rank > pick_rank || (rank == pick_rank && best[i] > best[pick])) {
                pick = static_cast<int>(i);
                pick_rank = rank;
            }
        }
        if (pick < 0) break;
        const int cpu = candidates[pick];
        chosen.add(cpu);
        tally.take(cpu);
        best[pick] = -3;
        for (size_t i = 0; i < candidates.size(); ++i) {
            if (best[i] == -3) continue;
            best[i] = std::max(best[i], topology.shared_depth(candidates[i], cpu));
        }
    }
    return added;
}

// Where a shrinking job without guaranteed cpus starts the set it keeps: the first cpu of the run
// of `keep` consecutive held cpus (in tree order) that splits the fewest of its cores, then holds
// the fewest half cores, then shares the fewest cores with other jobs, then lies in the deepest
// subtree, the earliest such run on a tie. With one PU per core: the run in the deepest subtree.
int kept_seed(const Topology &topology, const CoreMap &cores, const std::vector<int> &held,
              int keep, const CpuSet &others) {
    std::vector<int> held_on(cores.count(), 0);
    for (int cpu : held) ++held_on[cores.core_of(cpu)];
    std::vector<int> others_on(cores.count(), 0);
    for (int cpu : others.to_vector()) {
        if (cores.core_of(cpu) >= 0) ++others_on[cores.core_of(cpu)];
    }
    std::vector<int> in_run(cores.count(), 0);
    std::array<int, 5> best_score{};
    size_t best_start = 0;
    for (size_t start = 0; start + keep <= held.size(); ++start) {
        std::vector<int> touched;
        for (size_t i = start; i < start + keep; ++i) {
            const int c = cores.core_of(held[i]);
            if (in_run[c]++ == 0) touched.push_back(c);
        }
        int splits = 0;
        int halves = 0;
        int shared = 0;
        for (int c : touched) {
            splits += in_run[c] < held_on[c] ? 1 : 0;
            halves += in_run[c] < cores.in_pool(c) ? 1 : 0;
            shared += others_on[c] > 0 ? 1 : 0;
            in_run[c] = 0;
        }
        const int depth = topology.shared_depth(held[start], held[start + keep - 1]);
        const std::array<int, 5> score{splits, halves, shared, -depth, static_cast<int>(start)};
        if (start == 0 || score < best_score) {
            best_score = score;
            best_start = start;
        }
    }
    return held[best_start];
}

// Keeps `keep` of the cpus a job holds now (`held`, in walk order) next to `anchor` (its
// guaranteed cpus). Whole cores first: it gives back the cores it holds half of (those shared
// with another job first) before whole ones, and splits a core it holds whole only for the odd
// PU of an odd `keep`; then the cpus nearest the anchor, or (no anchor) nearest kept_seed().
CpuSet choose_kept(const Topology &topology, const CoreMap &cores, const std::vector<int> &held,
                   int keep, const CpuSet &anchor, const CpuSet &others) {
    CpuSet kept = anchor;
    if (keep <= 0 || held.empty()) return kept;
    if (static_cast<int>(held.size()) <= keep) {
        for (int cpu : held) kept.add(cpu);
        return kept;
    }
    int need = keep;
    if (anchor.empty()) {
        kept.add(kept_seed(topology, cores, held, keep, others));
        --need;
    }
    need -= grow(topology, cores, held, need, others, true, true, kept);
    grow(topology, cores, held, need, others, false, true, kept);
    return kept;
}

// Where a job that holds nothing should start. A subtree is a run of the walk order whose
// neighbours share an ancestor at least that deep (hwloc's logical order is depth-first, so a
// subtree is contiguous). Best fit, counting the cpus of `room` in each subtree: take the deepest
// level where a subtree holding a cpu of `allowed` has room for the whole need; among the cpus of
// `allowed` whose subtree there has room, prefer the tightest subtree, then the tightest enclosing
// subtree one level up, and so on to the root (so small jobs fill partly used regions and leave
// whole free ones to larger jobs), then the earliest cpu.
int choose_seed(const Topology &topology, const std::vector<int> &order, const CpuSet &room_cpus,
                const CpuSet &allowed, int need) {
    const size_t n = order.size();
    if (n == 0 || allowed.empty()) return -1;
    std::vector<int> link(n - 1);  // depth shared by order[i] and order[i+1]
    int deepest = 0;
    for (size_t i = 0; i + 1 < n; ++i) {
        link[i] = topology.shared_depth(order[i], order[i + 1]);
        deepest = std::max(deepest, link[i]);
    }
    // room[level][i]: cpus of room_cpus in the subtree of order[i] at depth (deepest + 1 - level).
    const int levels = deepest + 3;  // depths deepest+1 (single cpus) down to -1 (everything)
    std::vector<std::vector<int>> room(levels, std::vector<int>(n, 0));
    int fit_level = -1;
    for (int level = 0; level < levels; ++level) {
        const int depth = deepest + 1 - level;
        size_t start = 0;
        while (start < n) {
            size_t end = start;  // inclusive
            while (end + 1 < n && link[end] >= depth) ++end;
            int free_here = 0;
            bool has_allowed = false;
            for (size_t i = start; i <= end; ++i) {
                free_here += room_cpus.contains(order[i]) ? 1 : 0;
                has_allowed = has_allowed || allowed.contains(order[i]);
            }
            for (size_t i = start; i <= end; ++i) room[level][i] = free_here;
            if (free_here >= need && has_allowed && fit_level < 0) fit_level = level;
            start = end + 1;
        }
    }
    const bool fits = fit_level >= 0;
    if (!fits) fit_level = levels - 1;  // nothing has room for all of it: only the root counts
    int best = -1;
    for (size_t i = 0; i < n; ++i) {
        if (!allowed.contains(order[i])) continue;
        if (fits && room[fit_level][i] < need) continue;
        if (best < 0) {
            best = static_cast<int>(i);
            continue;
        }
        for (int level = fit_level; level < levels; ++level) {
            if (room[level][i] != room[level][best]) {
                if (room[level][i] < room[level][best]) best = static_cast<int>(i);
                break;
            }
        }
    }
    return best < 0 ? allowed.first() : order[best];
}

// The first cpu of a job that holds nothing, from `candidates` (the free cpus in walk order):
// among the cpus grow() would take first in this pass (a whole free core when it needs 2 or
// more, a lone PU whose core is partly outside the pool in the first pass otherwise, a core no
// other job is on in the second), the best fit of choose_seed(), counting as room the free cpus
// on cores no other job is on. -1 when the pass has nothing for it.
int seed_new_job(const Topology &topology, const CoreMap &cores, const std::vector<int> &order,
                 const std::vector<int> &candidates, const CpuSet &others, int need,
                 bool first_pass) {
    const CoreTally tally(cores, candidates, CpuSet(), others);
    std::array<int, 3> top{};
    bool any = false;
    for (int cpu : candidates) {
        if (first_pass && !tally.splits_nothing(cpu, need, false)) continue;
        const auto rank = tally.rank(cpu, need, first_pass);
        top = any ? std::max(top, rank) : rank;
        any = true;
    }
    if (!any) return -1;
    CpuSet allowed;
    CpuSet clean;
    CpuSet free;
    for (int cpu : candidates) {
        free.add(cpu);
        if (tally.clean(cpu)) clean.add(cpu);
        if (first_pass && !tally.splits_nothing(cpu, need, false)) continue;
        if (tally.rank(cpu, need, first_pass) == top) allowed.add(cpu);
    }
    return choose_seed(topology, order, clean.empty() ? free : clean, allowed, need);
}

}  // namespace

std::optional<PolicyKind> parse_policy(const std::string &name) {
    if (name == "static") return PolicyKind::Static;
    if (name == "equal") return PolicyKind::Equal;
    if (name == "weighted") return PolicyKind::Weighted;
    if (name == "throughput") return PolicyKind::Throughput;
    return std::nullopt;
}

const char *policy_name(PolicyKind kind) {
    switch (kind) {
        case PolicyKind::Static: return "static";
        case PolicyKind::Equal: return "equal";
        case PolicyKind::Weighted: return "weighted";
        case PolicyKind::Throughput: return "throughput";
    }
    return "unknown";
}

std::vector<std::string> policy_names() { return {"equal", "static", "throughput", "weighted"}; }

std::map<std::string, int> compute_counts(PolicyKind kind, const CpuSet &pool,
                                          const std::vector<PolicyJob> &jobs) {
    std::map<std::string, int> counts;
    for (const auto &p : counted(kind, pool, jobs)) counts[p.job->id] = p.count;
    return counts;
}

std::map<std::string, CpuSet> compute_allocation(PolicyKind kind, const Topology &topology,
                                                 const CpuSet &pool,
                                                 const std::vector<PolicyJob> &jobs) {
    const std::vector<Prepared> prepared = counted(kind, pool, jobs);

    const std::vector<int> order = walk_order(topology, pool);
    const CoreMap cores(topology, pool);
    std::vector<CpuSet> target(prepared.size());

    // 1. Pinned cpus and guarantees are fixed.
    CpuSet taken;
    for (size_t j = 0; j < prepared.size(); ++j) {
        target[j] = prepared[j].pinned ? *prepared[j].pinned : prepared[j].guaranteed;
        taken |= target[j];
    }
    // 2. Each job keeps as many of the cpus it holds now as it may, whole cores first. Whether
    //    another job is on a core is judged from what the others hold now.
    std::vector<CpuSet> holding(prepared.size());
    for (size_t j = 0; j < prepared.size(); ++j) holding[j] = prepared[j].job->current & pool;
    for (size_t j = 0; j < prepared.size(); ++j) {
        const Prepared &p = prepared[j];
        if (p.pinned) continue;
        const int keep = p.count - target[j].count();
        std::vector<int> held;
        CpuSet held_set;
        for (int cpu : order) {
            if (holding[j].contains(cpu) && !taken.contains(cpu)) {
                held.push_back(cpu);
                held_set.add(cpu);
            }
        }
        CpuSet others = taken;
        for (size_t k = 0; k < prepared.size(); ++k) {
            if (k != j) others |= holding[k];
        }
        others -= held_set;
        others -= target[j];
        target[j] = choose_kept(topology, cores, held, keep, target[j], others);
        taken |= target[j];
    }
    // 3. Free cpus go to jobs that need more: first jobs that already hold some (they grow next
    //    to what they have), then new jobs, largest need first (they pick whole subtrees first).
    //    Two passes: in the first every job takes only what splits no core (whole cores, its own
    //    cores' free PUs, lone PUs whose core is partly outside the pool); in the second the
    //    odd PUs left split a free core, and only when none is left share another job's core.
    std::vector<size_t> growers;
    for (size_t j = 0; j < prepared.size(); ++j) {
        if (!prepared[j].pinned && target[j].count() < prepared[j].count) growers.push_back(j);
    }
    std::stable_sort(growers.begin(), growers.end(), [&](size_t a, size_t b) {
        const bool a_new = target[a].empty();
        const bool b_new = target[b].empty();
        if (a_new != b_new) return !a_new;
        if (a_new) return prepared[a].count > prepared[b].count;
        return false;
    });
    for (bool first_pass : {true, false}) {
        for (size_t j : growers) {
            int need = prepared[j].count - target[j].count();
            if (need <= 0) continue;
            std::vector<int> candidates;
            for (int cpu : order) {
                if (!taken.contains(cpu)) candidates.push_back(cpu);
            }
            const CpuSet others = taken - target[j];
            if (target[j].empty()) {
                const int seed = seed_new_job(topology, cores, order, candidates, others, need,
                                              first_pass);
                if (seed < 0) continue;
                target[j].add(seed);
                --need;
            }
            grow(topology, cores, candidates, need, others, first_pass, false, target[j]);
            taken |= target[j];
        }
    }

    std::map<std::string, CpuSet> result;
    for (size_t j = 0; j < prepared.size(); ++j) result[prepared[j].job->id] = target[j];
    return result;
}

}  // namespace mall
