// Unit tests of add_to_environment (core/src/environment.cc, compiled in: it
// is internal): what libfabric's first use puts into the environment.
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "environment.h"

using vmmc::core::detail::add_to_environment;

namespace {

std::string value_of(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "(unset)";
}

TEST(environment, adds_what_is_missing_and_keeps_what_the_user_set) {
  ::setenv("VMMC_TEST_ENV_MINE", "user", 1);
  ::unsetenv("VMMC_TEST_ENV_NEW");
  add_to_environment({"VMMC_TEST_ENV_MINE=ours", "VMMC_TEST_ENV_NEW=ours", "no equals sign"});
  EXPECT_EQ(value_of("VMMC_TEST_ENV_MINE"), "user");
  EXPECT_EQ(value_of("VMMC_TEST_ENV_NEW"), "ours");
  EXPECT_EQ(value_of("no equals sign"), "(unset)");
}

// A getenv() in another thread may hold the array being replaced: it stays
// as it was (setenv() may free it).
TEST(environment, the_array_a_reader_holds_stays_whole) {
  ::setenv("VMMC_TEST_ENV_OLD", "kept", 1);
  char** const held = environ;
  std::size_t count = 0;
  while (held[count]) ++count;
  ::unsetenv("VMMC_TEST_ENV_ADDED");
  add_to_environment({"VMMC_TEST_ENV_ADDED=1"});
  EXPECT_NE(environ, held);
  std::size_t still = 0;
  bool old_there = false;
  while (held[still]) old_there |= std::string(held[still++]) == "VMMC_TEST_ENV_OLD=kept";
  EXPECT_EQ(still, count);
  EXPECT_TRUE(old_there);
  EXPECT_EQ(value_of("VMMC_TEST_ENV_ADDED"), "1");
  EXPECT_EQ(value_of("VMMC_TEST_ENV_OLD"), "kept");
  // The program's own setenv() and unsetenv() go on working after it.
  ::setenv("VMMC_TEST_ENV_LATER", "2", 1);
  ::unsetenv("VMMC_TEST_ENV_ADDED");
  EXPECT_EQ(value_of("VMMC_TEST_ENV_LATER"), "2");
  EXPECT_EQ(value_of("VMMC_TEST_ENV_ADDED"), "(unset)");
}

TEST(environment, nothing_missing_changes_nothing) {
  ::setenv("VMMC_TEST_ENV_SET", "x", 1);
  char** const before = environ;
  add_to_environment({"VMMC_TEST_ENV_SET=y"});
  EXPECT_EQ(environ, before);
  EXPECT_EQ(value_of("VMMC_TEST_ENV_SET"), "x");
}

}  // namespace
