# SPDX-License-Identifier: BSD-3-Clause
# package.cmake — the build behind `pip install` (pyproject.toml: scikit-build-core runs CMake with
# MALL_PYTHON_PACKAGE=ON; the top-level CMakeLists.txt includes this file and stops). It builds and
# installs into the wheel only what a training process needs, in the package folder `mall/`:
#  - the Python package (python/mall, ctypes over libmall; no compiled extension);
#  - libmall.so.0, built here (needs a C++20 compiler and nlohmann_json's headers), unless
#    MALL_PYTHON_LIBMALL=system, or AUTO finds an installed libmall of this very version (the
#    Debian package's; the Python package then loads that one, the node's);
#  - libmall_tf_ops.so, when the installing Python's TensorFlow is a supported version
#    (tf_integration/cmake/tensorflow.cmake): compiled against that TensorFlow with its own flags.
#    Without it the rest installs and mall.tensorflow names the command that adds it.
# No daemon, tools, tests, hwloc or Boost: those come from the Debian package or the full build.
find_package(Threads REQUIRED)

set(MALL_PYTHON_LIBMALL AUTO CACHE STRING "libmall for the Python package: AUTO, bundled (build it into the wheel) or system")
set_property(CACHE MALL_PYTHON_LIBMALL PROPERTY STRINGS AUTO bundled system)
set(mall_libmall_mode "${MALL_PYTHON_LIBMALL}")
if(mall_libmall_mode STREQUAL "AUTO" OR mall_libmall_mode STREQUAL "system")
  find_package(mall ${PROJECT_VERSION} EXACT CONFIG QUIET)
  if(mall_FOUND AND TARGET mall::mall)
    get_target_property(mall_system_library mall::mall LOCATION)
    get_filename_component(mall_system_library_dir "${mall_system_library}" DIRECTORY)
    set(mall_libmall_mode system)
  elseif(mall_libmall_mode STREQUAL "system")
    message(FATAL_ERROR "mall: MALL_PYTHON_LIBMALL=system but no installed libmall ${PROJECT_VERSION} was found "
                        "(find_package(mall ${PROJECT_VERSION} EXACT)): install the mall Debian package, or leave MALL_PYTHON_LIBMALL at AUTO")
  else()
    set(mall_libmall_mode bundled)
  endif()
endif()

if(mall_libmall_mode STREQUAL "bundled")
  find_package(nlohmann_json 3.9 QUIET)
  if(NOT nlohmann_json_FOUND)
    message(FATAL_ERROR "mall: building libmall for the Python package needs nlohmann_json's headers (3.9 or later): "
                        "on Debian and Ubuntu `apt-get install nlohmann-json3-dev`, elsewhere set nlohmann_json_DIR; "
                        "or install the mall Debian package first, whose libmall the Python package then uses")
  endif()
  include(${PROJECT_SOURCE_DIR}/libmall/cmake/client_library.cmake)
  # One file, with its soname's name (a wheel keeps no symbolic links).
  install(FILES $<TARGET_FILE:mall> DESTINATION mall RENAME libmall.so.0)
  set(MALL_LIBRARY_DIR_RELATIVE ".")
  set(MALL_LIBRARY_DIR_ABSOLUTE "")
  message(STATUS "mall: Python package with its own libmall.so.0")
else()
  set(MALL_LIBRARY_DIR_RELATIVE "")
  set(MALL_LIBRARY_DIR_ABSOLUTE "${mall_system_library_dir}")
  message(STATUS "mall: Python package using the installed ${mall_system_library}")
endif()

# The op library, against the TensorFlow of the Python that runs the build (pip's: the user's venv).
include(${PROJECT_SOURCE_DIR}/tf_integration/cmake/tensorflow.cmake)
set(MALL_TENSORFLOW_PYTHON "" CACHE FILEPATH "A Python whose TensorFlow the op library is built against (default: the installing Python)")
set(mall_tf_python "${MALL_TENSORFLOW_PYTHON}")
if(NOT mall_tf_python AND DEFINED ENV{MALL_TENSORFLOW_PYTHON})
  set(mall_tf_python "$ENV{MALL_TENSORFLOW_PYTHON}")
endif()
if(NOT mall_tf_python)
  if(Python_EXECUTABLE)
    set(mall_tf_python "${Python_EXECUTABLE}")
  else()
    find_package(Python COMPONENTS Interpreter REQUIRED)
    set(mall_tf_python "${Python_EXECUTABLE}")
  endif()
endif()
mall_probe_tensorflow("${mall_tf_python}")
set(MALL_OP_LIBRARY_STATE "absent")
if(mall_tf_found AND mall_tf_supported)
  mall_add_tf_op_library(mall_tf_ops ${PROJECT_BINARY_DIR}/lib)
  install(TARGETS mall_tf_ops LIBRARY DESTINATION mall)
  install(FILES ${PROJECT_BINARY_DIR}/lib/libmall_tf_ops.tensorflow-version DESTINATION mall)
  set(MALL_OP_LIBRARY_STATE "built for ${mall_tf_distribution} ${mall_tf_version}")
else()
  message(WARNING "mall: installing without the TensorFlow op library (mall.tensorflow and mall.keras need it): "
                  "${mall_tf_why}. Install TensorFlow ${MALL_TENSORFLOW_OLDEST} to ${MALL_TENSORFLOW_NEWEST} "
                  "into this environment, then install mall again (mall.tensorflow prints the command).")
  set(MALL_OP_LIBRARY_STATE "not built: ${mall_tf_why}")
endif()

# Where the package was built from, for mall.tensorflow's words when the op library is missing or
# built for another TensorFlow: the checkout (pip install <folder>); an sdist is unpacked into a
# temporary folder, so for it the Debian package's copy when there is one.
set(MALL_PYTHON_SOURCE "${PROJECT_SOURCE_DIR}")
if(EXISTS "${PROJECT_SOURCE_DIR}/PKG-INFO")
  set(MALL_PYTHON_SOURCE "")
  if(EXISTS "/usr/share/mall/python/mall-${PROJECT_VERSION}.tar.gz")
    set(MALL_PYTHON_SOURCE "/usr/share/mall/python/mall-${PROJECT_VERSION}.tar.gz")
  endif()
endif()
set(MALL_PYTHON_INSTALLER pip)
configure_file(${PROJECT_SOURCE_DIR}/python/mall/_install_paths.py.in ${PROJECT_BINARY_DIR}/_install_paths.py @ONLY)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/mall/ DESTINATION mall
        FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE)
install(FILES ${PROJECT_BINARY_DIR}/_install_paths.py DESTINATION mall)
