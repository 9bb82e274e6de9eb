// tests/time_scale.h: how much longer a test's work may take in a slow build.
//
// VMMC_TEST_TIME_SCALE (a whole number, default 1) is set for every test of
// the sanitizer builds by tests/sanitizers/sanitizers.cmake: 4 under
// ThreadSanitizer, which runs our code 5-15x slower (CTest's TIMEOUT is
// stretched by it too), 2 under AddressSanitizer (5-10x on our own calls,
// a small part of most tests). A test
// whose deadline bounds work (a stream of gigabytes must end within a
// minute) multiplies that deadline by time_scale(), instead of being left
// out of that build. Deadlines that bound a wait for an event stay as they
// are.
#pragma once

#include <cstdlib>

namespace vmmc::test {

inline int time_scale() {
  static const int scale = [] {
    const char* v = std::getenv("VMMC_TEST_TIME_SCALE");
    int n = v ? std::atoi(v) : 1;
    return n > 0 ? n : 1;
  }();
  return scale;
}

}  // namespace vmmc::test
