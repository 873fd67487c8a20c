# SPDX-License-Identifier: BSD-3-Clause
# Packaging.cmake — `cpack -G DEB` makes one Debian package, mall_<version>_<arch>.deb: the programs,
# libmall, its headers and CMake package, the SPANK plugin, cli_filter.lua and job_submit.lua, malld's systemd unit and
# its options file (/etc/default/malld, a conffile), the man pages, the Python module, the copyright
# file and the changelog, the Python package's sdist (/usr/share/mall/python/mall-<version>.tar.gz,
# python/sdist.cmake: a node's Keras users pip-install it into their own TensorFlow venv, which
# builds the op library against that TensorFlow and uses this package's libmall), i.e. every install
# rule except the components tensorflow (the Session adapter names a PyPI wheel's files; the op
# library is built for one TensorFlow, while users bring their own; mall.tensorflow and mall.keras
# are in the package and name the pip command) and mpi (libmall_mpi would tie every node to
# Debian's Open MPI). Depends come from dpkg-shlibdeps (dpkg-dev); what it cannot see is named below.
# Files go under /usr whatever the tree's CMAKE_INSTALL_PREFIX; for Debian's layout (lib/<multiarch>,
# /usr/lib/python3/dist-packages, Slurm's plugin folder) configure with -DCMAKE_INSTALL_PREFIX=/usr
# (docs/admin-slurm.md "Install from a Debian package"; tests/package/test_deb_install.sh builds it that way).
# A tree configured for another prefix still gives a working package (libmall in /usr/lib, the
# module in /usr/lib/python3.X/dist-packages, the plugin in /usr/lib/slurm).
set(MALL_PACKAGE_MAINTAINER "mall maintainers <mall@example.org>" CACHE STRING
    "The Maintainer field of the Debian package: \"Name <email>\" of whoever builds and ships it")

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME mall)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "${MALL_PACKAGE_MAINTAINER}")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION "malleable training jobs on shared HPC nodes
mall lends a node's idle cores to running training jobs and takes them back,
enforcing each job's share with cgroup cpusets: malld (the node manager, with
its systemd unit), mallctl, mallrun, mallsim and mall-oci-hook; libmall (C API,
C++ wrapper, CMake package: find_package(mall)) and the header-only adapters
that park workers of a framework's own thread pool; the Slurm SPANK plugin
--malleable, cli_filter.lua and job_submit.lua; the Python module mall, and its source
(/usr/share/mall/python) for users to pip-install into their own TensorFlow.")
# Depends: dpkg-shlibdeps on the ELF files (libc6, libstdc++6, libhwloc, libboost-program-options,
# libslurm for malld's Slurm checks); a shlibs file ("libmall 0 mall (>= VERSION)", so packages built
# against it depend on it) and the ldconfig call for libmall.so.0.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
# Not needed to run malld or mallrun, so neither Depends nor Recommends (apt installs Recommends):
# slurmd loads the SPANK plugin, podman or docker run containers through mall-oci-hook, python3
# runs the module, libeigen3-dev builds against mall::tf.
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "slurmd, podman | docker.io, python3, libeigen3-dev")
# The SPANK plugin runs only in the Slurm release it was built for (major.minor: Slurm's loader
# refuses any other, before the plugin can say anything): apt refuses the package beside another
# release of slurmd instead (cmake/SlurmVersion.cmake sets MALL_SLURM_RELEASE).
if(MALL_SLURM_RELEASE)
  set(CPACK_DEBIAN_PACKAGE_BREAKS "slurmd (<< ${MALL_SLURM_RELEASE}~), slurmd (>> ${MALL_SLURM_RELEASE}.99)")
endif()

# /usr/share/doc/mall: the copyright file (machine-readable, cmake/debian/copyright; LICENSE's terms)
# and changelog.gz (Debian's format, this version and maintainer; gzip -9n, without a name or time
# stamp, so the package builds the same twice).
configure_file(${PROJECT_SOURCE_DIR}/cmake/debian/changelog.in ${PROJECT_BINARY_DIR}/debian/changelog @ONLY)
add_custom_command(OUTPUT ${PROJECT_BINARY_DIR}/debian/changelog.gz
  COMMAND sh -c "gzip -9n -c '${PROJECT_BINARY_DIR}/debian/changelog' > '${PROJECT_BINARY_DIR}/debian/changelog.gz'"
  DEPENDS ${PROJECT_BINARY_DIR}/debian/changelog VERBATIM)
add_custom_target(mall_package_changelog ALL DEPENDS ${PROJECT_BINARY_DIR}/debian/changelog.gz)
install(FILES ${PROJECT_SOURCE_DIR}/cmake/debian/copyright ${PROJECT_BINARY_DIR}/debian/changelog.gz
        DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/mall)

# prerm: python3 writes bytecode beside the module (mall/__pycache__) when root imports it; dpkg does
# not know those files, and without this a removal would leave the module's folder behind.
if(IS_ABSOLUTE "${MALL_PYTHON_INSTALL_DIR}")
  set(mall_package_python_dir "${MALL_PYTHON_INSTALL_DIR}/mall")
else()
  set(mall_package_python_dir "${CPACK_PACKAGING_INSTALL_PREFIX}/${MALL_PYTHON_INSTALL_DIR}/mall")
endif()
file(WRITE ${PROJECT_BINARY_DIR}/debian/prerm "#!/bin/sh
# prerm (cmake/Packaging.cmake): removes the bytecode python3 wrote beside the mall module.
set -e
rm -rf '${mall_package_python_dir}/__pycache__'
")
# conffiles: dpkg keeps an admin's edits of the node's malld options across upgrades.
if(IS_ABSOLUTE "${MALL_DEFAULTS_DIR}")  # libmall/CMakeLists.txt
  file(WRITE ${PROJECT_BINARY_DIR}/debian/conffiles "${MALL_DEFAULTS_DIR}/malld\n")
else()
  file(WRITE ${PROJECT_BINARY_DIR}/debian/conffiles "${CPACK_PACKAGING_INSTALL_PREFIX}/${MALL_DEFAULTS_DIR}/malld\n")
endif()
# triggers: ldconfig runs once after dpkg's run (Debian's way; cpack's own maintainer scripts also
# call it, which lintian warns about).
file(WRITE ${PROJECT_BINARY_DIR}/debian/triggers "activate-noawait ldconfig\n")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${PROJECT_BINARY_DIR}/debian/prerm ${PROJECT_BINARY_DIR}/debian/conffiles
    ${PROJECT_BINARY_DIR}/debian/triggers)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

# One package of every component but tensorflow and mpi (cpack reads the list at its run; the man
# pages and any later install rule are in it as long as this file is included last).
get_cmake_property(mall_package_components COMPONENTS)
list(REMOVE_ITEM mall_package_components tensorflow mpi)
set(CPACK_COMPONENTS_ALL ${mall_package_components})
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_GROUPING ALL_COMPONENTS_IN_ONE)

include(CPack)
if(NOT CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  message(STATUS "mall: cpack -G DEB packages into /usr; for Debian's layout configure with -DCMAKE_INSTALL_PREFIX=/usr (now ${CMAKE_INSTALL_PREFIX})")
endif()
