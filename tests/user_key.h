// tests/user_key.h: a user key of the test's own. Core contexts prove and
// check "same user" across hosts with the user key, made on first use at
// ~/.vmmc/user-key (VMMC_CORE_USER_KEY); a test that meets a peer over TCP
// would leave that file in the home of whoever runs it. This environment
// points the setting at a temporary folder (forked children inherit it)
// and removes it at the end.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace vmmc::test {

class temporary_user_key : public testing::Environment {
 public:
  void SetUp() override {
    char folder[] = "/tmp/vmmc-user-key.XXXXXX";
    if (::mkdtemp(folder)) {
      folder_ = folder;
      ::setenv("VMMC_CORE_USER_KEY", (folder_ + "/user-key").c_str(), 1);
    }
  }
  void TearDown() override {
    if (!folder_.empty()) std::filesystem::remove_all(folder_);
  }

 private:
  std::string folder_;
};

// In one source file of the test: registers the environment before main().
#define VMMC_TEST_TEMPORARY_USER_KEY                                            \
  [[maybe_unused]] static testing::Environment* const vmmc_temporary_user_key = \
      testing::AddGlobalTestEnvironment(new ::vmmc::test::temporary_user_key)

}  // namespace vmmc::test
