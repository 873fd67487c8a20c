// SPDX-License-Identifier: BSD-3-Clause
// mallctl_steer.hpp — mallctl's steering commands: `set` (pin a job's cpus, its weight, threads,
// signal control), `policy`, `reclaim` and `release` (take cpus out of the pool and give them
// back), and `record` (a Slurm job's figures so far into its AdminComment, now). They need root
// or an admin uid of malld.
// Contract: every argument (job names, cpu lists, numbers) is checked here before anything is
// sent; exit codes are mallctl's: 0 ok, 1 malld refused (its words on stderr), 2 usage, 3 malld
// unreachable.
#pragma once

#include <string>
#include <vector>

#include "tools/mallctl_session.hpp"  // Globals, UsageError

namespace mall::tools {

// The synopsis, one-line summary and body of `mallctl help set|policy|reclaim|release|record`.
// kSetDetails is a std::string: it spells out mall::kWeightRule (rules.hpp).
extern const char *const kSetSynopsis;
extern const char *const kSetSummary;
extern const std::string kSetDetails;
extern const char *const kPolicySynopsis;
extern const char *const kPolicySummary;
extern const char *const kPolicyDetails;
extern const char *const kReclaimSynopsis;
extern const char *const kReclaimSummary;
extern const char *const kReclaimDetails;
extern const char *const kReleaseSynopsis;
extern const char *const kReleaseSummary;
extern const char *const kReleaseDetails;
extern const char *const kRecordSynopsis;
extern const char *const kRecordSummary;
extern const char *const kRecordDetails;

// Run the command on its arguments (after its name); usage_error prints the words, the synopsis
// and where to read more, and returns 2.
int cmd_set(const Globals &g, const std::vector<std::string> &args, const UsageError &usage_error);
int cmd_policy(const Globals &g, const std::vector<std::string> &args, const UsageError &usage_error);
int cmd_reclaim(const Globals &g, const std::vector<std::string> &args, const UsageError &usage_error);
int cmd_release(const Globals &g, const std::vector<std::string> &args, const UsageError &usage_error);
int cmd_record(const Globals &g, const std::vector<std::string> &args, const UsageError &usage_error);

}  // namespace mall::tools
