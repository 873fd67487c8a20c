# SPDX-License-Identifier: BSD-3-Clause
# SlurmVersion.cmake — which Slurm release the headers in MALL_SLURM_INCLUDE_DIR belong to.
# mall_slurm_version(<include dir> <prefix>) reads SLURM_VERSION_NUMBER from <dir>/slurm/slurm_version.h
# (libslurm-dev ships it; 0xMMmmuu, e.g. 0x180b05 = 24.11.5) and sets <prefix>_NUMBER (the hex text),
# <prefix>_VERSION ("24.11.5") and <prefix>_RELEASE ("24.11", what a SPANK plugin must match) in the
# caller's scope. A missing header or line stops the configure with words saying what to install.

function(mall_slurm_version include_dir prefix)
  set(header "${include_dir}/slurm/slurm_version.h")
  if(NOT EXISTS "${header}")
    message(FATAL_ERROR "mall: ${header} not found: the Slurm headers in MALL_SLURM_INCLUDE_DIR=${include_dir} "
      "are incomplete. Install libslurm-dev (it ships slurm/slurm_version.h beside slurm/spank.h), or point "
      "-DMALL_SLURM_INCLUDE_DIR at the folder holding slurm/spank.h and slurm/slurm_version.h of the Slurm "
      "the plugin will run in, or pass -DMALL_WITH_SLURM=OFF")
  endif()
  file(STRINGS "${header}" lines REGEX "^#define[ \t]+SLURM_VERSION_NUMBER[ \t]+")
  if(NOT lines MATCHES "SLURM_VERSION_NUMBER[ \t]+0x([0-9a-fA-F][0-9a-fA-F]?)([0-9a-fA-F][0-9a-fA-F])([0-9a-fA-F][0-9a-fA-F])")
    message(FATAL_ERROR "mall: no '#define SLURM_VERSION_NUMBER 0x...' line in ${header}: is it Slurm's own "
      "header? Reinstall libslurm-dev or set -DMALL_SLURM_INCLUDE_DIR to another Slurm's headers")
  endif()
  math(EXPR major "0x${CMAKE_MATCH_1}")
  math(EXPR minor "0x${CMAKE_MATCH_2}")
  math(EXPR micro "0x${CMAKE_MATCH_3}")
  # Slurm writes releases with two-digit months (22.05, 24.11): keep that spelling.
  if(minor LESS 10)
    set(minor "0${minor}")
  endif()
  set(${prefix}_NUMBER "0x${CMAKE_MATCH_1}${CMAKE_MATCH_2}${CMAKE_MATCH_3}" PARENT_SCOPE)
  set(${prefix}_VERSION "${major}.${minor}.${micro}" PARENT_SCOPE)
  set(${prefix}_RELEASE "${major}.${minor}" PARENT_SCOPE)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${header}")
endfunction()
