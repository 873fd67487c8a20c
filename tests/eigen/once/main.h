/* SPDX-License-Identifier: BSD-3-Clause */
/* once/main.h — Eigen's test harness header (test/main.h, from Debian's eigen3 source package) has
 * no include guard; eigen_thread_pool_parked.cpp includes it before Eigen's test file does. This
 * stand-in, first on the include path, lets the real one in once. */
#ifndef MALL_EIGEN_TEST_MAIN_H_ONCE
#define MALL_EIGEN_TEST_MAIN_H_ONCE
#include_next "main.h"
#endif
