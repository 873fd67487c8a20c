# SPDX-License-Identifier: BSD-3-Clause
# sdist.cmake — the Python package's source distribution, mall-<version>.tar.gz, made by the build
# (no network, no pypa `build`) and installed under <datadir>/mall/python/, so that every
# `cmake --install` and the Debian package carry it: on such a node a user runs, in a venv with
# their TensorFlow, `python -m pip install /usr/share/mall/python/mall-<version>.tar.gz`, which
# builds the op library against that TensorFlow and uses the node's libmall (python/package.cmake).
#
# Two modes. Included (python/CMakeLists.txt): the target mall_python_sdist (in ALL) and its install
# rule; MALL_PYTHON_SDIST is the archive's path. Run with `cmake -P` (the target's command, with
# -DSOURCE_DIR -DVERSION -DOUTPUT): writes OUTPUT.
#
# The archive is what scikit-build-core's sdist of the same tree holds (one list, pyproject.toml's):
# a folder mall-<version>/ with every file of the source tree except those that match
# `[tool.scikit-build] sdist.exclude` in pyproject.toml, the top-level .gitignore or
# scikit-build-core's own exclusions (.git, __pycache__/, *.pyc, ...), read with gitignore's rules
# (a pattern without an inner slash matches at any depth; a leading / or an inner slash anchors
# it; a trailing / matches folders; *, ?, **); and a PKG-INFO (Metadata-Version 2.1: Name,
# Version, Summary, License, Requires-Python). A negated pattern (!...) or sdist.include is refused
# with words rather than read differently. Files are stored sorted, with a fixed time and gzip -n,
# so the same tree gives the same bytes. The target depends on the files found at configure time:
# a file added later is in the archive from the next configure on.

# mall_sdist_patterns(SOURCE_DIR OUT_VAR): the exclusion patterns, as regexes over paths relative to
# SOURCE_DIR ("a/b/c"); each entry is "dir|REGEX" (matches folders only) or "any|REGEX".
function(mall_sdist_patterns source_dir out_var)
  file(READ "${source_dir}/pyproject.toml" pyproject)
  if(NOT pyproject MATCHES "\nsdist\\.exclude *= *\\[([^]]*)\\]")
    message(FATAL_ERROR "mall: ${source_dir}/pyproject.toml has no `sdist.exclude = [...]` under [tool.scikit-build]: "
                        "python/sdist.cmake reads the sdist's exclusions from there")
  endif()
  set(list_text "${CMAKE_MATCH_1}")
  if(pyproject MATCHES "\nsdist\\.include *=")
    message(FATAL_ERROR "mall: pyproject.toml sets sdist.include, which python/sdist.cmake does not read: "
                        "keep the sdist's file set in sdist.exclude alone, or teach python/sdist.cmake")
  endif()
  string(REGEX MATCHALL "\"[^\"]*\"" quoted "${list_text}")
  set(lines .git .tox/ .nox/ .egg-info/ __pycache__/ __pypackages__/ *.pyc *.dist-info/)  # scikit-build-core's own
  if(EXISTS "${source_dir}/.gitignore")
    file(STRINGS "${source_dir}/.gitignore" gitignore)
    list(APPEND lines ${gitignore})
  endif()
  foreach(q IN LISTS quoted)
    string(REGEX REPLACE "^\"(.*)\"$" "\\1" q "${q}")
    list(APPEND lines "${q}")
  endforeach()
  set(patterns "")
  foreach(line IN LISTS lines)
    string(STRIP "${line}" line)
    if(line STREQUAL "" OR line MATCHES "^#")
      continue()
    endif()
    if(line MATCHES "^!")
      message(FATAL_ERROR "mall: the sdist exclusion '${line}' is a negation, which python/sdist.cmake does not read")
    endif()
    set(kind any)
    if(line MATCHES "/$")
      set(kind dir)
      string(REGEX REPLACE "/+$" "" line "${line}")
    endif()
    set(anchored FALSE)
    if(line MATCHES "/")
      set(anchored TRUE)
      string(REGEX REPLACE "^/" "" line "${line}")
    endif()
    # The glob as a regex: escape what regexes read, then **/, **, * and ? (placeholders first).
    string(REGEX REPLACE "([][.+^$(){}|\\\\])" "\\\\\\1" re "${line}")
    string(REPLACE "**/" "@ANYDIRS@" re "${re}")
    string(REPLACE "**" "@ANY@" re "${re}")
    string(REPLACE "*" "[^/]*" re "${re}")
    string(REPLACE "?" "[^/]" re "${re}")
    string(REPLACE "@ANYDIRS@" "(.*/)?" re "${re}")
    string(REPLACE "@ANY@" ".*" re "${re}")
    if(anchored)
      list(APPEND patterns "${kind}|^${re}$")
    else()
      list(APPEND patterns "${kind}|(^|/)${re}$")
    endif()
  endforeach()
  set(${out_var} "${patterns}" PARENT_SCOPE)
endfunction()

# mall_sdist_files(SOURCE_DIR OUT_VAR): the files of the sdist, relative to SOURCE_DIR, sorted.
# Walks folder by folder and does not enter an excluded one (build trees, .venv, .git).
function(mall_sdist_files source_dir out_var)
  mall_sdist_patterns("${source_dir}" patterns)
  set(files "")
  set(folders ".")
  while(folders)
    list(POP_FRONT folders folder)
    if(folder STREQUAL ".")
      file(GLOB entries LIST_DIRECTORIES true RELATIVE "${source_dir}" "${source_dir}/*" "${source_dir}/.*")
    else()
      file(GLOB entries LIST_DIRECTORIES true RELATIVE "${source_dir}" "${source_dir}/${folder}/*" "${source_dir}/${folder}/.*")
    endif()
    list(REMOVE_DUPLICATES entries)
    foreach(entry IN LISTS entries)
      if(entry MATCHES "(^|/)\\.\\.?$")
        continue()
      endif()
      set(is_dir FALSE)
      if(IS_DIRECTORY "${source_dir}/${entry}" AND NOT IS_SYMLINK "${source_dir}/${entry}")
        set(is_dir TRUE)
      endif()
      set(excluded FALSE)
      foreach(pattern IN LISTS patterns)
        string(REGEX REPLACE "^(dir|any)\\|" "" re "${pattern}")
        if((is_dir OR pattern MATCHES "^any\\|") AND entry MATCHES "${re}")
          set(excluded TRUE)
          break()
        endif()
      endforeach()
      if(excluded)
        continue()
      endif()
      if(is_dir)
        list(APPEND folders "${entry}")
      else()
        list(APPEND files "${entry}")
      endif()
    endforeach()
  endwhile()
  list(SORT files)
  set(${out_var} "${files}" PARENT_SCOPE)
endfunction()

if(CMAKE_SCRIPT_MODE_FILE)
  cmake_minimum_required(VERSION 3.20)  # the project's; policies as in the build (IN_LIST)
  # --- cmake -DSOURCE_DIR=... -DVERSION=... -DOUTPUT=.../mall-<version>.tar.gz -P sdist.cmake ------
  foreach(var SOURCE_DIR VERSION OUTPUT)
    if(NOT ${var})
      message(FATAL_ERROR "sdist.cmake: -D${var}=... is required")
    endif()
  endforeach()
  mall_sdist_files("${SOURCE_DIR}" files)
  foreach(required pyproject.toml CMakeLists.txt python/package.cmake python/mall/__init__.py)
    if(NOT required IN_LIST files)
      message(FATAL_ERROR "sdist.cmake: ${required} is not in the sdist: pyproject.toml's sdist.exclude or .gitignore leaves it out")
    endif()
  endforeach()
  get_filename_component(out_dir "${OUTPUT}" DIRECTORY)
  set(top "mall-${VERSION}")
  set(stage "${out_dir}/sdist-stage")
  file(REMOVE_RECURSE "${stage}")
  set(members "${top}/PKG-INFO")
  foreach(f IN LISTS files)
    get_filename_component(dir "${f}" DIRECTORY)
    file(COPY "${SOURCE_DIR}/${f}" DESTINATION "${stage}/${top}/${dir}")
    list(APPEND members "${top}/${f}")
  endforeach()
  file(READ "${SOURCE_DIR}/pyproject.toml" pyproject)
  set(summary "")
  if(pyproject MATCHES "\ndescription *= *\"([^\"\n]*)\"")
    set(summary "${CMAKE_MATCH_1}")
  endif()
  set(requires_python "")
  if(pyproject MATCHES "\nrequires-python *= *\"([^\"\n]*)\"")
    set(requires_python "Requires-Python: ${CMAKE_MATCH_1}\n")
  endif()
  file(WRITE "${stage}/${top}/PKG-INFO"
       "Metadata-Version: 2.1\nName: mall\nVersion: ${VERSION}\nSummary: ${summary}\nLicense: BSD-3-Clause\n${requires_python}")
  list(SORT members)
  # The members one a line (a file list, not the command line: ~200 paths).
  string(REPLACE ";" "\n" member_lines "${members}")
  file(WRITE "${stage}/members.txt" "${member_lines}\n")
  execute_process(COMMAND ${CMAKE_COMMAND} -E tar cf "${stage}/sdist.tar" --format=gnutar
                          "--mtime=2020-01-01 00:00:00 UTC" "--files-from=${stage}/members.txt"
                  WORKING_DIRECTORY "${stage}" RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "sdist.cmake: cmake -E tar failed: ${err}")
  endif()
  execute_process(COMMAND gzip -9n -c "${stage}/sdist.tar" OUTPUT_FILE "${OUTPUT}.tmp"
                  RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "sdist.cmake: gzip failed: ${err}")
  endif()
  file(RENAME "${OUTPUT}.tmp" "${OUTPUT}")
  file(REMOVE_RECURSE "${stage}")
  list(LENGTH members count)
  message(STATUS "mall: wrote ${OUTPUT} (${count} files)")
  return()
endif()

# --- included from python/CMakeLists.txt ----------------------------------------------------------
set(MALL_PYTHON_SDIST "${PROJECT_BINARY_DIR}/python-sdist/mall-${PROJECT_VERSION}.tar.gz")
set(MALL_PYTHON_SDIST_INSTALL_DIR "${CMAKE_INSTALL_DATAROOTDIR}/mall/python")
mall_sdist_files("${PROJECT_SOURCE_DIR}" mall_sdist_inputs)
list(TRANSFORM mall_sdist_inputs PREPEND "${PROJECT_SOURCE_DIR}/")
add_custom_command(OUTPUT "${MALL_PYTHON_SDIST}"
  COMMAND ${CMAKE_COMMAND} -E make_directory "${PROJECT_BINARY_DIR}/python-sdist"
  COMMAND ${CMAKE_COMMAND} "-DSOURCE_DIR=${PROJECT_SOURCE_DIR}" "-DVERSION=${PROJECT_VERSION}"
          "-DOUTPUT=${MALL_PYTHON_SDIST}" -P "${CMAKE_CURRENT_LIST_FILE}"
  DEPENDS ${mall_sdist_inputs} "${CMAKE_CURRENT_LIST_FILE}"
  COMMENT "mall: the Python package's sdist mall-${PROJECT_VERSION}.tar.gz" VERBATIM)
add_custom_target(mall_python_sdist ALL DEPENDS "${MALL_PYTHON_SDIST}")
install(FILES "${MALL_PYTHON_SDIST}" DESTINATION "${MALL_PYTHON_SDIST_INSTALL_DIR}")
