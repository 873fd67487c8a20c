// SPDX-License-Identifier: BSD-3-Clause
// placeholder.cpp — keeps mall_test_support a valid library before any helper sources exist.
namespace mall::test {
int support_library_anchor = 0;
}
