// SPDX-License-Identifier: BSD-3-Clause
// error_text.hpp — the words mall_open()/mall_open_ex() leave in the caller's mall_error_t.
// Contract: both accept a null err (the caller asked for no text) and never allocate; set_error
// truncates to mall_error_t's fixed size.
#pragma once

#include <cstdarg>
#include <cstdio>

#include "mall/mall.h"

namespace mall::client {

inline void set_error(mall_error_t *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
inline void set_error(mall_error_t *err, const char *fmt, ...) {
    if (!err) return;
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(err->text, sizeof err->text, fmt, ap);
    va_end(ap);
}

inline void clear_error(mall_error_t *err) {
    if (err) err->text[0] = '\0';
}

}  // namespace mall::client
