// unit.core.error: the error category and result/status value types.
#include <gtest/gtest.h>

#include <string>

#include "vmmc/core/error.h"

namespace {

TEST(Error, CategoryNamesEveryCode) {
  for (int c = 1; c <= static_cast<int>(vmmc::errc::unreachable); ++c) {
    std::error_code ec = static_cast<vmmc::errc>(c);
    EXPECT_STREQ(ec.category().name(), "vmmc");
    EXPECT_NE(ec.message(), "unknown vmmc error") << c;
  }
}

TEST(Error, ResultCarriesValueOrError) {
  vmmc::result<std::string> good = std::string("x");
  ASSERT_TRUE(good);
  EXPECT_EQ(*good, "x");
  EXPECT_FALSE(good.error());

  vmmc::result<std::string> bad = vmmc::errc::peer_gone;
  ASSERT_FALSE(bad);
  EXPECT_TRUE(bad.is(vmmc::errc::peer_gone));
  EXPECT_EQ(bad.error(), vmmc::errc::peer_gone);
}

TEST(Error, StatusDefaultsToOk) {
  vmmc::status s;
  EXPECT_TRUE(s.ok());
  vmmc::status f = vmmc::errc::out_of_range;
  EXPECT_FALSE(f.ok());
  EXPECT_TRUE(f.is(vmmc::errc::out_of_range));
  EXPECT_TRUE(vmmc::status(vmmc::errc::ok).ok());
}

}  // namespace
