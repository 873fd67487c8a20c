// SPDX-License-Identifier: BSD-3-Clause
// canary.cpp — the ThreadSanitizer pass's canary (built and run by run-tsan.sh before anything
// else): two threads write one plain int with no synchronisation, on purpose. Contract: under a
// working TSan runtime it ends with a "WARNING: ThreadSanitizer: data race" report (exit 66 with
// halt_on_error=1); anything else (e.g. "FATAL: ThreadSanitizer: unexpected memory mapping") means
// this machine's memory layout needs run-tsan.sh's workaround, or TSan cannot run here at all.
#include <pthread.h>

#include <cstdio>

namespace {

int shared_counter = 0;  // deliberately unprotected

void* bump(void*) {
  for (int i = 0; i < 1000; ++i) shared_counter = shared_counter + 1;
  return nullptr;
}

}  // namespace

int main() {
  pthread_t first, second;
  if (pthread_create(&first, nullptr, bump, nullptr) != 0) return 2;
  if (pthread_create(&second, nullptr, bump, nullptr) != 0) return 2;
  pthread_join(first, nullptr);
  pthread_join(second, nullptr);
  std::printf("canary: counter %d (no race was reported: is this a TSan build?)\n", shared_counter);
  return 0;
}
