// SPDX-License-Identifier: BSD-3-Clause
// Proves that code written against 0.3 still builds and means the same: the adapters' old include
// paths (mall/tf/openmp_adapter.hpp, libtorch_adapter.hpp, allocation_cpus.hpp) forward to
// mall/openmp/, mall/libtorch/ and mall/adapter/, and their old mall::tf names are the new ones.
#define EIGEN_USE_THREADS
#include <mall/tf/allocation_cpus.hpp>
#include <mall/tf/mall_pool_glue.hpp>
#include <mall/tf/openmp_adapter.hpp>
#include <mall/tf/pool_parking.hpp>
#if MALL_TEST_LIBTORCH
#include <mall/tf/libtorch_adapter.hpp>
#endif

#include <gtest/gtest.h>

#include <type_traits>

#include <unsupported/Eigen/CXX11/ThreadPool>

#include <mall/mall.h>

TEST(Adapters03Names, OldOpenMPNamesAreTheNewOnes) {
  static_assert(std::is_same_v<mall::tf::OpenMPAttachment, mall::openmp::OpenMPAttachment>);
  static_assert(std::is_same_v<mall::tf::OpenMPResizeResult, mall::openmp::OpenMPResizeResult>);
  static_assert(std::is_same_v<mall::tf::OpenMPAdapterOptions, mall::openmp::OpenMPAdapterOptions>);
  EXPECT_EQ(&mall::tf::attach_openmp, &mall::openmp::attach_openmp);
  EXPECT_EQ(&mall::tf::apply_allocation_to_openmp_callback, &mall::openmp::apply_allocation_to_openmp_callback);
  mall::tf::OpenMPAttachment* attachment = nullptr;
  EXPECT_EQ(mall::tf::attach_openmp(nullptr, &attachment), MALL_ERR_INVAL);
  EXPECT_EQ(attachment, nullptr);
}

TEST(Adapters03Names, OldCpuConversionIsTheSharedOne) {
  EXPECT_EQ(&mall::tf::cpu_set_from_allocation, &mall::adapter::cpu_set_from_allocation);
  mall_alloc_t alloc{};
  alloc.mask[0] = 0b101;
  const cpu_set_t cpus = mall::tf::cpu_set_from_allocation(alloc);
  EXPECT_EQ(CPU_COUNT(&cpus), 2);
  EXPECT_TRUE(CPU_ISSET(0, &cpus));
  EXPECT_TRUE(CPU_ISSET(2, &cpus));
}

TEST(Adapters03Names, PoolGlueRefusesANullHandle) {
  Eigen::ThreadPool pool(2);
  mall::tf::PoolParking parking(pool);
  EXPECT_EQ(mall::tf::attach_pool(nullptr, parking), MALL_ERR_INVAL);
}

#if MALL_TEST_LIBTORCH
TEST(Adapters03Names, OldLibtorchNamesAreTheNewOnes) {
  static_assert(std::is_same_v<mall::tf::LibtorchAttachment, mall::libtorch::LibtorchAttachment>);
  static_assert(std::is_same_v<mall::tf::LibtorchResizeResult, mall::libtorch::LibtorchResizeResult>);
  EXPECT_EQ(&mall::tf::attach_libtorch, &mall::libtorch::attach_libtorch);
  mall::tf::LibtorchAttachment* attachment = nullptr;
  EXPECT_EQ(mall::tf::attach_libtorch(nullptr, &attachment), MALL_ERR_INVAL);
  EXPECT_EQ(attachment, nullptr);
}
#endif
