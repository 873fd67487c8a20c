// SPDX-License-Identifier: BSD-3-Clause
// slurm_release.hpp — does the Slurm this plugin runs in belong to the release it was built for?
// (pure logic, no Slurm). Slurm's own loader already refuses a SPANK plugin of another release
// before any plugin code runs: 22.05.8 and 24.11.5 compare plugin_version's major.minor for type
// "spank" (the exact version for other types), and the admin reads
//   srun: plugin_load_from_file: Incompatible Slurm plugin PATH version (22.05.8)
//   srun: error: spank: PATH: Incompatible plugin version
//   srun: unrecognized option '--malleable=1:2'
// (checked: a 24.11 build in the host's 22.05, a 22.05 build in the site guest's 24.11). Older
// loaders skipped that check for spank (Slurm's source once had `&& xstrcmp(type, "spank")`), and
// the structs the plugin reads through libslurm (node_info_t) differ between releases, so the
// plugin checks again itself: it compares its build-time SLURM_VERSION_NUMBER with
// spank_get_item's S_SLURM_VERSION_MAJOR/MINOR and disables itself with this text on a mismatch.
#pragma once

#include <optional>
#include <string>

namespace mall::slurm {

// "24.11" for 0x180b05 (Slurm writes releases with a two-digit minor).
std::string release_of_version_number(unsigned version_number);

// nullopt when `running_major`.`running_minor` is the release of `built_version_number`;
// otherwise the line an admin reads (slurmd's log, the step's log, the user's srun/sbatch stderr):
// which release it was built for, which one runs, that the plugin is off, and how to rebuild.
// `running_full` (S_SLURM_VERSION, may be null) only adds detail. A null or unparsable major/minor
// counts as a mismatch: the plugin cannot tell that it is safe.
std::optional<std::string> release_mismatch(unsigned built_version_number, const char *running_major,
                                            const char *running_minor, const char *running_full);

}  // namespace mall::slurm
