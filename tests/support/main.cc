// The main() of every gradwire test binary (linked from the support library).
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // gradwire tests start threads (pools, ranks as threads); the default "fast" death
  // test style forks a copy of a threaded process, which GoogleTest warns is unsafe.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  return RUN_ALL_TESTS();
}
