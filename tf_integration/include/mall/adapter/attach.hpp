// SPDX-License-Identifier: BSD-3-Clause
// attach.hpp — how every adapter (the Eigen pool's glue, OpenMP, libtorch) ties itself to a mall
// handle: its state is allocated once, registered with mall_on_resize_with_release() so that
// mall_close() frees it, and its callback applies only allocations that carry cpus. Header-only;
// needs only mall/mall.h.
#pragma once

#include <new>

#include <mall/mall.h>

namespace mall::adapter {

// The state an adapter's mall_resize_fn was registered with, or null when the call brings nothing
// to apply: no allocation, no state, or an allocation with no cpus (ncpus <= 0: never attached),
// which leaves the framework as it is.
template <typename State>
inline State* state_to_apply(const mall_alloc_t* alloc, void* arg) {
  if (alloc == nullptr || arg == nullptr || alloc->ncpus <= 0) return nullptr;
  return static_cast<State*>(arg);
}

// Allocates a State (value-initialized), lets init fill it, and registers on_resize with it on m;
// m then owns it and mall_close(m) frees it (libmall cannot remove a callback, so it lives as long
// as the handle). *out (may be null) receives it on success.
// Returns MALL_SUCCESS, MALL_ERR_INVAL (null handle), MALL_ERR_NOMEM, MALL_ERR_FULL (16 callbacks
// already registered on m) or MALL_ERR_SYSTEM (a lock failed); on an error nothing stays allocated
// or registered.
template <typename State, typename Init>
inline int attach_state(mall_t* m, mall_resize_fn on_resize, Init&& init, State** out = nullptr) {
  if (m == nullptr) return MALL_ERR_INVAL;
  auto* state = new (std::nothrow) State{};
  if (state == nullptr) return MALL_ERR_NOMEM;
  init(*state);
  const int rc = mall_on_resize_with_release(
      m, on_resize, state, [](void* arg) { delete static_cast<State*>(arg); });  // freed by mall_close(m)
  if (rc != MALL_SUCCESS) {
    delete state;
    return rc;
  }
  if (out != nullptr) *out = state;
  return MALL_SUCCESS;
}

}  // namespace mall::adapter
