// slurm_release.hpp — does the Slurm this plugin runs in belong to the release it was built for?
// (pure logic, no Slurm). Slurm 22.05's loader refuses a plugin whose plugin_version is another
// release's ("plugin_load_from_file: Incompatible Slurm plugin PATH version (24.11.5)", then
// "unrecognized option '--malleable'"), before any plugin code runs; 24.11's skips that check for
// type "spank" (libslurmfull's _verify_syms: xstrcmp(type, "spank")), so there a mall_spank.so
// built against another release's headers loads silently, and the structs it reads through
// libslurm (node_info_t) differ between releases. The
// plugin therefore compares its build-time SLURM_VERSION_NUMBER with what spank_get_item's
// S_SLURM_VERSION_MAJOR/MINOR say at run time, and disables itself with this text on a mismatch.
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
