// unit.core.settings: environment names, typed parsing and the listing.
#include <gtest/gtest.h>

#include <cstdlib>

#include "vmmc/core/settings.h"

namespace {
using namespace vmmc::core;

TEST(Settings, EnvironmentNameIsUpperCase) {
  EXPECT_EQ(environment_name(settings::utlb_limit), "VMMC_CORE_UTLB_LIMIT");
}

TEST(Settings, BytesAcceptSuffixes) {
  setenv("VMMC_CORE_UTLB_LIMIT", "64k", 1);
  EXPECT_EQ(setting_integer(settings::utlb_limit), 64 * 1024);
  setenv("VMMC_CORE_UTLB_LIMIT", "3m", 1);
  EXPECT_EQ(setting_integer(settings::utlb_limit), 3 * 1024 * 1024);
  setenv("VMMC_CORE_UTLB_LIMIT", "banana", 1);  // malformed: default (1g)
  EXPECT_EQ(setting_integer(settings::utlb_limit), 1LL << 30);
  unsetenv("VMMC_CORE_UTLB_LIMIT");
  EXPECT_EQ(setting_integer(settings::utlb_limit), 1LL << 30);
}

// Integers may be negative (VMMC_NX_FD's default, -1, is "none"); byte
// counts may not.
TEST(Settings, NegativeIntegersButNotBytes) {
  const setting fd{"test", "fd", setting_type::integer, "-1", "help"};
  EXPECT_EQ(setting_integer(fd), -1);
  setenv("VMMC_TEST_FD", "-7", 1);
  EXPECT_EQ(setting_integer(fd), -7);
  unsetenv("VMMC_TEST_FD");
  setenv("VMMC_CORE_UTLB_LIMIT", "-1k", 1);  // malformed: default (1g)
  EXPECT_EQ(setting_integer(settings::utlb_limit), 1LL << 30);
  unsetenv("VMMC_CORE_UTLB_LIMIT");
}

TEST(Settings, Booleans) {
  setenv("VMMC_CORE_MAPPED", "off", 1);
  EXPECT_FALSE(setting_bool(settings::mapped_path));
  setenv("VMMC_CORE_MAPPED", "yes", 1);
  EXPECT_TRUE(setting_bool(settings::mapped_path));
  unsetenv("VMMC_CORE_MAPPED");
  EXPECT_TRUE(setting_bool(settings::mapped_path));
}

// Given: the environment names a value, even the default one; the layers
// above ask so to tell the user's choice from the default.
TEST(Settings, GivenOnlyWhenTheEnvironmentSetsIt) {
  unsetenv("VMMC_CORE_PROVIDERS");
  EXPECT_FALSE(setting_given(settings::providers));
  setenv("VMMC_CORE_PROVIDERS", "shm,tcp", 1);
  EXPECT_TRUE(setting_given(settings::providers));
  unsetenv("VMMC_CORE_PROVIDERS");
}

TEST(Settings, CoreTableIsListed) {
  bool found = false;
  for (const setting& s : list_settings()) found |= (s.name == "utlb_limit");
  EXPECT_TRUE(found);
}

}  // namespace
