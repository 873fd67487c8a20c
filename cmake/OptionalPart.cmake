# SPDX-License-Identifier: BSD-3-Clause
# OptionalPart.cmake — the one rule for mall's optional parts (Slurm, MPI, libtorch, TensorFlow):
# a cache option MALL_WITH_<PART> set to AUTO (build the part when its dependencies are found), ON
# (require them: a missing one stops the configure with the fix) or OFF (skip it, probe nothing),
# and one configure-time line saying whether the part is on and why. The caller probes in between:
#
#   mall_optional_part(<option> <doc> <wanted-var>)
#     Declares <option> (default AUTO; doc "<doc>: AUTO, ON or OFF") and sets <wanted-var> in the
#     caller's scope: TRUE unless the option is OFF (any CMake false value), i.e. whether to probe.
#
#   mall_optional_part_report(<option> <part> <enabled-var> FOUND <condition>...
#                             [ON_DETAIL <text>] [OFF_WHY <text>] [ON_ERROR <text>] [OFF_NOTE <text>])
#     After the probe: FOUND is an if() condition over the caller's variables (as in
#     cmake_dependent_option). Sets <enabled-var> to ON or OFF in the caller's scope and reports:
#       found:                  STATUS "mall: <part> on (<ON_DETAIL>)"
#       option OFF:             STATUS "mall: <part> off (<option>=<value>[; <OFF_NOTE>])"
#       AUTO, missing:          STATUS "mall: <part> off (<OFF_WHY>[; <OFF_NOTE>])"
#       ON (or true), missing:  FATAL_ERROR "mall: <option>=<value> but <ON_ERROR> or pass -D<option>=AUTO|OFF"
#     ON_ERROR says what is missing and how to fix it, ending where " or pass ..." goes on.

function(mall_optional_part option doc wanted_var)
  set(${option} AUTO CACHE STRING "${doc}: AUTO, ON or OFF")
  set_property(CACHE ${option} PROPERTY STRINGS AUTO ON OFF)
  _mall_optional_part_wanted(${option} wanted)
  set(${wanted_var} ${wanted} PARENT_SCOPE)
endfunction()

function(mall_optional_part_report option part enabled_var)
  cmake_parse_arguments(PARSE_ARGV 3 arg "" "ON_DETAIL;OFF_WHY;ON_ERROR;OFF_NOTE" "FOUND")
  set(note "")
  if(DEFINED arg_OFF_NOTE)
    set(note "; ${arg_OFF_NOTE}")
  endif()
  _mall_optional_part_wanted(${option} wanted)
  set(enabled OFF)
  if(NOT wanted)
    message(STATUS "mall: ${part} off (${option}=${${option}}${note})")
  elseif(${arg_FOUND})
    set(enabled ON)
    message(STATUS "mall: ${part} on (${arg_ON_DETAIL})")
  elseif(${option} STREQUAL "AUTO")
    message(STATUS "mall: ${part} off (${arg_OFF_WHY}${note})")
  else()
    message(FATAL_ERROR "mall: ${option}=${${option}} but ${arg_ON_ERROR} or pass -D${option}=AUTO|OFF")
  endif()
  set(${enabled_var} ${enabled} PARENT_SCOPE)
endfunction()

# AUTO, or any CMake true value (ON, YES, 1): the part is wanted; anything else is OFF.
function(_mall_optional_part_wanted option out_var)
  if(${option} STREQUAL "AUTO" OR ${option})
    set(${out_var} TRUE PARENT_SCOPE)
  else()
    set(${out_var} FALSE PARENT_SCOPE)
  endif()
endfunction()
