# SPDX-License-Identifier: BSD-3-Clause
# tf_integration/adapters.cmake: the framework adapters that follow mall's allocation at a step
# boundary, as header-only INTERFACE targets: mall_tf_openmp (alias mall::tf_openmp; the OpenMP
# runtime of the stepping thread; include/mall/openmp/) and mall_tf_libtorch (alias
# mall::tf_libtorch; libtorch's intra-op threads; include/mall/libtorch/; built when libtorch is
# found: MALL_WITH_LIBTORCH=AUTO|ON|OFF, cmake/OptionalPart.cmake). What every adapter shares is in
# include/mall/adapter/. Also builds the adapters' probe programs and registers their tests.
# Included at the end of tf_integration/CMakeLists.txt.

# --- OpenMP ------------------------------------------------------------------------------------
find_package(OpenMP COMPONENTS CXX)
if(OpenMP_CXX_FOUND)
  add_library(mall_tf_openmp INTERFACE)
  target_include_directories(mall_tf_openmp INTERFACE
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(mall_tf_openmp INTERFACE mall OpenMP::OpenMP_CXX)
  target_compile_features(mall_tf_openmp INTERFACE cxx_std_20)
  add_library(mall::tf_openmp ALIAS mall_tf_openmp)
  message(STATUS "mall: OpenMP adapter on (OpenMP ${OpenMP_CXX_VERSION}, flags ${OpenMP_CXX_FLAGS})")
else()
  message(STATUS "mall: OpenMP adapter off (the C++ compiler has no OpenMP support; with GCC, install libgomp)")
endif()

# --- libtorch ----------------------------------------------------------------------------------
# Found by hand rather than with find_package(Torch): Debian's TorchConfig.cmake works, but it
# pulls in gflags, glog and protobuf and stops the configure with FATAL_ERROR when one of them is
# missing (even under AUTO), while the adapter needs only ATen's headers, torch_cpu and c10.
# Point MALL_TORCH_INCLUDE_DIR / MALL_TORCH_CPU_LIBRARY / MALL_C10_LIBRARY at another libtorch.
mall_optional_part(MALL_WITH_LIBTORCH "Build the libtorch adapter" _mall_torch_wanted)
set(_mall_torch_found OFF)
set(_mall_torch_missing "")
if(_mall_torch_wanted)
  find_path(MALL_TORCH_INCLUDE_DIR ATen/Parallel.h)
  find_library(MALL_TORCH_CPU_LIBRARY torch_cpu)
  find_library(MALL_C10_LIBRARY c10)
  if(NOT MALL_TORCH_INCLUDE_DIR OR NOT MALL_TORCH_CPU_LIBRARY OR NOT MALL_C10_LIBRARY)
    set(_mall_torch_missing "<ATen/Parallel.h>, libtorch_cpu or libc10 not found; install libtorch-dev or set MALL_TORCH_INCLUDE_DIR / MALL_TORCH_CPU_LIBRARY / MALL_C10_LIBRARY")
  elseif(NOT TARGET mall_tf_openmp)
    set(_mall_torch_missing "it needs the OpenMP adapter, and the compiler has no OpenMP")
  else()
    set(_mall_torch_found ON)
    file(STRINGS ${MALL_TORCH_INCLUDE_DIR}/ATen/Config.h _mall_torch_openmp
         REGEX "^#define AT_PARALLEL_OPENMP 1")
    if(_mall_torch_openmp)
      set(_mall_torch_kind "an OpenMP build: thread count and pinning")
    else()
      set(_mall_torch_kind "not an OpenMP build: thread count only, its own pool is not re-pinned")
    endif()
  endif()
endif()
mall_optional_part_report(MALL_WITH_LIBTORCH "libtorch adapter" MALL_LIBTORCH_ENABLED
  FOUND _mall_torch_found
  ON_DETAIL "MALL_WITH_LIBTORCH=${MALL_WITH_LIBTORCH}, ${MALL_TORCH_CPU_LIBRARY}, ${_mall_torch_kind}"
  OFF_WHY "${_mall_torch_missing}"
  ON_ERROR "${_mall_torch_missing};")
if(MALL_LIBTORCH_ENABLED)
  add_library(mall_tf_libtorch INTERFACE)
  target_include_directories(mall_tf_libtorch SYSTEM INTERFACE ${MALL_TORCH_INCLUDE_DIR})
  target_link_libraries(mall_tf_libtorch INTERFACE
    mall_tf_openmp ${MALL_TORCH_CPU_LIBRARY} ${MALL_C10_LIBRARY})
  add_library(mall::tf_libtorch ALIAS mall_tf_libtorch)
endif()

# --- Probes and tests ----------------------------------------------------------------------------
# The probe programs live in tests/support/*_main.cpp (kept out of the support library by its
# filter) and the tests in tests/integration/tf_test_*.cpp (outside the tests/ globs), because
# they need the targets defined here. mall_test_support is defined later, in tests/.
if(MALL_BUILD_TESTS AND TARGET mall_tf_openmp)
  enable_testing()
  find_package(GTest REQUIRED)

  # The adapter refuses to compile without OpenMP, with a message that says so.
  add_test(NAME unit.tf_openmp_adapter_needs_openmp
           COMMAND ${CMAKE_CXX_COMPILER} -std=c++20 -fsyntax-only -x c++
                   -I${CMAKE_CURRENT_SOURCE_DIR}/include -I${PROJECT_SOURCE_DIR}/libmall/include
                   ${CMAKE_CURRENT_SOURCE_DIR}/include/mall/openmp/adapter.hpp)
  set_tests_properties(unit.tf_openmp_adapter_needs_openmp PROPERTIES
    LABELS unit TIMEOUT 60 PASS_REGULAR_EXPRESSION "mall/openmp/adapter.hpp needs OpenMP: compile with -fopenmp")

  # One probe program (tests/support/<probe>_main.cpp on `adapter`) and the integration test that
  # drives it under malld (tests/integration/<test>.cpp).
  function(mall_add_adapter_test probe adapter test)
    add_executable(mall_${probe} ${PROJECT_SOURCE_DIR}/tests/support/${probe}_main.cpp)
    target_link_libraries(mall_${probe} PRIVATE ${adapter})
    target_include_directories(mall_${probe} PRIVATE ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/examples)
    add_executable(${test} ${PROJECT_SOURCE_DIR}/tests/integration/${test}.cpp)
    mall_test_code(${test})
    target_link_libraries(${test} PRIVATE mall_test_support mall mall_gtest_main)
    add_dependencies(${test} malld mallctl mallrun mall_${probe})
    add_test(NAME integration.${test} COMMAND ${test})
    set_tests_properties(integration.${test} PROPERTIES LABELS integration TIMEOUT 300 RUN_SERIAL TRUE
                         SKIP_RETURN_CODE 77)
  endfunction()

  # Code written against 0.3 (the adapters' mall/tf/ paths and mall::tf names) still builds.
  add_executable(tf_test_adapters_0_3_names ${PROJECT_SOURCE_DIR}/tests/unit/tf_test_adapters_0_3_names.cpp)
  mall_test_code(tf_test_adapters_0_3_names)
  target_link_libraries(tf_test_adapters_0_3_names PRIVATE mall_tf mall_tf_openmp mall_gtest_main)
  if(MALL_LIBTORCH_ENABLED)
    target_link_libraries(tf_test_adapters_0_3_names PRIVATE mall_tf_libtorch)
    target_compile_definitions(tf_test_adapters_0_3_names PRIVATE MALL_TEST_LIBTORCH=1)
  endif()
  add_test(NAME unit.tf_test_adapters_0_3_names COMMAND tf_test_adapters_0_3_names)
  set_tests_properties(unit.tf_test_adapters_0_3_names PROPERTIES LABELS unit TIMEOUT 60)

  mall_add_adapter_test(omp_probe mall_tf_openmp tf_test_openmp_adapter)
  if(MALL_LIBTORCH_ENABLED)
    mall_add_adapter_test(torch_probe mall_tf_libtorch tf_test_libtorch_adapter)
  endif()
endif()
