# SPDX-License-Identifier: BSD-3-Clause
# tensorflow.cmake — the TensorFlow versions mall's op library supports, the probe of a Python's
# TensorFlow, and the op library itself (libmall_tf_ops.so: mall.tensorflow and mall.keras load it
# into the user's TensorFlow to park its own pools). Included by tf_integration/CMakeLists.txt (the
# developer build, against MALL_TENSORFLOW_PYTHON) and python/package.cmake (`pip install`, against
# the TensorFlow of the installing Python). One definition of each, so both builds agree.

# Supported: TensorFlow 2.16 (the first with Keras 3) to 2.21, the `tensorflow` or `tensorflow-cpu`
# wheel. CI tests the two ends (tests/python_package/).
set(MALL_TENSORFLOW_OLDEST 2.16)
set(MALL_TENSORFLOW_NEWEST 2.21)
get_filename_component(mall_tf_integration_dir "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)

# _mall_tf_probe_field(TEXT FIELD OUT): the value of probe_tensorflow.py's `FIELD=value` line in TEXT
# (empty when there is none).
function(_mall_tf_probe_field text field out)
  string(REGEX MATCH "(^|\n)${field}=[^\n]*" line "${text}")
  string(REGEX REPLACE "^\n?${field}=" "" value "${line}")
  set(${out} "${value}" PARENT_SCOPE)
endfunction()

# mall_probe_tensorflow(PYTHON): asks PYTHON (run with -I, so pip's build isolation does not hide the
# user's site-packages) about its TensorFlow, and sets in the caller's scope:
#   mall_tf_found (TRUE/FALSE), mall_tf_why (when not found or not supported), mall_tf_version,
#   mall_tf_distribution, mall_tf_include_dir, mall_tf_framework_library,
#   mall_tf_compile_definitions (tf.sysconfig's -D flags), mall_tf_supported (TRUE/FALSE).
# Importing TensorFlow takes seconds: the result is cached against the package folder and version,
# which a cheap probe reads without importing.
function(mall_probe_tensorflow python)
  set(probe "${mall_tf_integration_dir}/cmake/probe_tensorflow.py")
  set(mall_tf_found FALSE PARENT_SCOPE)
  set(mall_tf_supported FALSE PARENT_SCOPE)
  execute_process(COMMAND "${python}" -I "${probe}" OUTPUT_VARIABLE cheap RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    set(mall_tf_why "${python} could not run ${probe}: ${err}" PARENT_SCOPE)
    return()
  endif()
  if(NOT cheap MATCHES "found=yes")
    _mall_tf_probe_field("${cheap}" why why)
    set(mall_tf_why "${why}" PARENT_SCOPE)
    return()
  endif()
  # Cache entries hold one line: newlines are kept as "<NL>".
  string(REPLACE "\n" "<NL>" key "${python}<NL>${cheap}")
  if(NOT key STREQUAL "${MALL_TF_PROBE_KEY}")
    execute_process(COMMAND "${python}" -I "${probe}" --flags OUTPUT_VARIABLE full RESULT_VARIABLE rc ERROR_QUIET)
    string(REPLACE "\n" "<NL>" full "${full}")
    set(MALL_TF_PROBE_KEY "${key}" CACHE INTERNAL "what the cached TensorFlow probe was for")
    set(MALL_TF_PROBE_RESULT "${full}" CACHE INTERNAL "the cached TensorFlow probe's output")
  endif()
  string(REPLACE "<NL>" "\n" full "${MALL_TF_PROBE_RESULT}")
  if(NOT full MATCHES "found=yes")
    _mall_tf_probe_field("${full}" why why)
    set(mall_tf_why "${why}" PARENT_SCOPE)
    return()
  endif()
  foreach(field version distribution include_dir framework_library compile_definitions)
    _mall_tf_probe_field("${full}" ${field} value)
    set(mall_tf_${field} "${value}" PARENT_SCOPE)
    set(${field} "${value}")
  endforeach()
  if(NOT include_dir OR NOT EXISTS "${include_dir}/tensorflow/core/framework/op_kernel.h" OR NOT framework_library)
    set(mall_tf_why "TensorFlow ${version} at ${include_dir} lacks its C++ headers or libtensorflow_framework.so.2" PARENT_SCOPE)
    return()
  endif()
  set(mall_tf_found TRUE PARENT_SCOPE)
  string(REGEX MATCH "^[0-9]+\\.[0-9]+" major_minor "${version}")
  # Compared as major.minor: 2.21.3 is 2.21, inside the range.
  if(major_minor VERSION_GREATER_EQUAL MALL_TENSORFLOW_OLDEST AND major_minor VERSION_LESS_EQUAL MALL_TENSORFLOW_NEWEST)
    set(mall_tf_supported TRUE PARENT_SCOPE)
  else()
    set(mall_tf_why "TensorFlow ${version} is outside the versions mall supports (${MALL_TENSORFLOW_OLDEST} to ${MALL_TENSORFLOW_NEWEST}); install one of those (pip install 'tensorflow-cpu==${MALL_TENSORFLOW_NEWEST}.*')" PARENT_SCOPE)
  endif()
endfunction()

# mall_add_tf_op_library(TARGET OUTPUT_DIR): libmall_tf_ops.so in OUTPUT_DIR against the TensorFlow
# mall_probe_tensorflow found, with tf.sysconfig's own definitions (the C++ ABI, Eigen's alignment),
# linked only to libtensorflow_framework (already loaded by the process that loads it); and beside
# it libmall_tf_ops.tensorflow-version with the version it is built for: mall.tensorflow refuses,
# with words, to load it into another TensorFlow. The global property MALL_TF_OPS_BUILT_FOR says
# for which (distribution and version).
function(mall_add_tf_op_library target output_dir)
  add_library(${target} MODULE ${mall_tf_integration_dir}/python_ops/mall_pool_ops.cpp)
  target_include_directories(${target} PRIVATE ${mall_tf_integration_dir}/include)
  target_include_directories(${target} SYSTEM PRIVATE ${mall_tf_include_dir})
  target_compile_definitions(${target} PRIVATE ${mall_tf_compile_definitions})
  target_compile_features(${target} PRIVATE cxx_std_20)
  target_link_libraries(${target} PRIVATE Threads::Threads ${mall_tf_framework_library})
  set_target_properties(${target} PROPERTIES PREFIX "lib" OUTPUT_NAME mall_tf_ops LIBRARY_OUTPUT_DIRECTORY ${output_dir})
  file(WRITE ${output_dir}/libmall_tf_ops.tensorflow-version "${mall_tf_version}\n")
  set_property(GLOBAL PROPERTY MALL_TF_OPS_BUILT_FOR "${mall_tf_distribution} ${mall_tf_version}")
  message(STATUS "mall: TensorFlow op library for Keras/tf.function (libmall_tf_ops.so, ${mall_tf_distribution} ${mall_tf_version})")
endfunction()
