// policy.cpp — the co-scheduling policies as pure functions, in two steps: how many cpus each job
// gets (prepare(), then count_into(): static, equal and weighted here, throughput through
// throughput_policy.hpp), then which ones (placement: keep what a job holds, grow along the hwloc
// tree). compute_allocation and compute_counts share the counting, so the tests of counts test
// what malld runs. Guarantees as policy.hpp states; when the pool cannot cover every job's min,
// jobs registered earlier get their min first and later ones get what is left (possibly 0 cpus).
#include "policy.hpp"

#include <algorithm>

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

// Greedy growth: adds `need` cpus from `candidates` (in walk order) to `chosen`, each time the
// candidate whose deepest shared ancestor with a cpu already chosen is deepest; ties go to the
// earliest in walk order. With `chosen` empty the first candidate seeds the set.
void grow_nearest(const Topology &topology, const std::vector<int> &candidates, int need,
                  CpuSet &chosen) {
    if (need <= 0 || candidates.empty()) return;
    std::vector<int> best(candidates.size(), -2);  // -2: not yet compared; -3: taken
    std::vector<int> chosen_list = chosen.to_vector();
    for (size_t i = 0; i < candidates.size(); ++i) {
        if (chosen.contains(candidates[i])) {
            best[i] = -3;
            continue;
        }
        for (int c : chosen_list) best[i] = std::max(best[i], topology.shared_depth(candidates[i], c));
    }
    for (int added = 0; added < need; ++added) {
        int pick = -1;
        for (size_t i = 0; i < candidates.size(); ++i) {
            if (best[i] == -3) continue;
            if (pick < 0 || best[i] > best[pick]) pick = static_cast<int>(i);
        }
        if (pick < 0) return;
        const int cpu = candidates[pick];
        chosen.add(cpu);
        best[pick] = -3;
        for (size_t i = 0; i < candidates.size(); ++i) {
            if (best[i] == -3) continue;
            best[i] = std::max(best[i], topology.shared_depth(candidates[i], cpu));
        }
    }
}

// Keeps `keep` of the cpus a job holds now. With guaranteed cpus as the anchor, the nearest ones;
// otherwise the run of `keep` consecutive held cpus (in tree order) inside the deepest subtree,
// the earliest such run on a tie.
CpuSet choose_kept(const Topology &topology, const std::vector<int> &held, int keep,
                   const CpuSet &anchor) {
    CpuSet kept = anchor;
    if (keep <= 0 || held.empty()) return kept;
    if (static_cast<int>(held.size()) <= keep) {
        for (int cpu : held) kept.add(cpu);
        return kept;
    }
    if (!anchor.empty()) {
        grow_nearest(topology, held, keep, kept);
        return kept;
    }
    size_t best_start = 0;
    int best_depth = -2;
    for (size_t start = 0; start + keep <= held.size(); ++start) {
        const int depth = topology.shared_depth(held[start], held[start + keep - 1]);
        if (depth > best_depth) {
            best_depth = depth;
            best_start = start;
        }
    }
    for (size_t i = best_start; i < best_start + keep; ++i) kept.add(held[i]);
    return kept;
}

// Where a job that holds nothing should start. A subtree is a run of the walk order whose
// neighbours share an ancestor at least that deep (hwloc's logical order is depth-first, so a
// subtree is contiguous). Best fit: take the deepest level where one subtree has room for the
// whole need; among the free cpus whose subtree there has room, prefer the tightest subtree, then
// the tightest enclosing subtree one level up, and so on to the root (so small jobs fill partly
// used regions and leave whole free ones to larger jobs), then the earliest cpu.
int choose_seed(const Topology &topology, const std::vector<int> &order, const CpuSet &free,
                int need) {
    const size_t n = order.size();
    if (n == 0 || free.empty()) return -1;
    std::vector<int> link(n - 1);  // depth shared by order[i] and order[i+1]
    int deepest = 0;
    for (size_t i = 0; i + 1 < n; ++i) {
        link[i] = topology.shared_depth(order[i], order[i + 1]);
        deepest = std::max(deepest, link[i]);
    }
    // room[level][i]: free cpus in the subtree of order[i] at depth (deepest + 1 - level).
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
            for (size_t i = start; i <= end; ++i) free_here += free.contains(order[i]) ? 1 : 0;
            for (size_t i = start; i <= end; ++i) room[level][i] = free_here;
            if (free_here >= need && fit_level < 0) fit_level = level;
            start = end + 1;
        }
    }
    const bool fits = fit_level >= 0;
    if (!fits) fit_level = levels - 1;  // nothing has room for all of it: only the root counts
    int best = -1;
    for (size_t i = 0; i < n; ++i) {
        if (!free.contains(order[i])) continue;
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
    return best < 0 ? free.first() : order[best];
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
    std::vector<CpuSet> target(prepared.size());

    // 1. Pinned cpus and guarantees are fixed.
    CpuSet taken;
    for (size_t j = 0; j < prepared.size(); ++j) {
        target[j] = prepared[j].pinned ? *prepared[j].pinned : prepared[j].guaranteed;
        taken |= target[j];
    }
    // 2. Each job keeps as many of the cpus it holds now as it may.
    for (size_t j = 0; j < prepared.size(); ++j) {
        const Prepared &p = prepared[j];
        if (p.pinned) continue;
        const int keep = p.count - target[j].count();
        std::vector<int> held;
        for (int cpu : order) {
            if (p.job->current.contains(cpu) && !taken.contains(cpu)) held.push_back(cpu);
        }
        target[j] = choose_kept(topology, held, keep, target[j]);
        taken |= target[j];
    }
    // 3. Free cpus go to jobs that need more: first jobs that already hold some (they grow next
    //    to what they have), then new jobs, largest need first (they pick whole subtrees first).
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
    for (size_t j : growers) {
        const int need = prepared[j].count - target[j].count();
        CpuSet free = pool - taken;
        if (target[j].empty()) {
            const int seed = choose_seed(topology, order, free, need);
            if (seed < 0) continue;
            target[j].add(seed);
            free.remove(seed);
            taken.add(seed);
        }
        std::vector<int> candidates;
        for (int cpu : order) {
            if (free.contains(cpu)) candidates.push_back(cpu);
        }
        grow_nearest(topology, candidates, prepared[j].count - target[j].count(), target[j]);
        taken |= target[j];
    }

    std::map<std::string, CpuSet> result;
    for (size_t j = 0; j < prepared.size(); ++j) result[prepared[j].job->id] = target[j];
    return result;
}

}  // namespace mall
