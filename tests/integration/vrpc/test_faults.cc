// integration.vrpc.faults: RPC calls with checksummed large arguments under
// injected faults (tests/support/fault.h), each run with a stock libtirpc
// TCP client (the oracle) and a vRPC client against the same server:
//   - the server stopped (SIGSTOP) for a second between and during calls:
//     calls with a long timeout all succeed with the right results; a call
//     with a short timeout times out exactly as libtirpc's does, and the
//     next call skips the late reply;
//   - the server killed: each client's next calls fail with the clnt_stat
//     stock libtirpc gives (RPC_CANTRECV / RPC_CANTSEND), never a hang, and
//     raise SIGPIPE where it does.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <optional>
#include <string>
#include <vector>

#include "integration/vrpc/test_service.h"
#include "support/fault.h"

namespace {
using namespace vrpc_test;
using namespace std::chrono_literals;
namespace fault = vmmc::test::fault;
using clock_type = std::chrono::steady_clock;

const timeval long_wait{20, 0};
const timeval short_wait{0, 300000};
constexpr std::size_t argument_bytes = 1 << 20;

enum class client_kind { libtirpc_tcp, vrpc };

std::string kind_name(const testing::TestParamInfo<client_kind>& info) {
  return info.param == client_kind::vrpc ? "vrpc" : "libtirpc_tcp";
}

// A client of the server's vRPC port: stock libtirpc over kernel TCP (the
// port serves plain TCP clients too), or vRPC.
CLIENT* make_client(client_kind kind, const server_process& server) {
  if (kind == client_kind::vrpc)
    return clnt_vmmc_create("127.0.0.1", program, version, server.port().vmmc);
  sockaddr_in address = server.address(server.port().vmmc);
  int socket = RPC_ANYSOCK;
  return clnttcp_create(&address, program, version, &socket, 0, 0);
}

// Echoes `length` bytes of pattern `seed`; the reply is verified byte by
// byte. Returns the call's status, and in *error what was wrong with a
// successful reply ("" if nothing).
clnt_stat checked_echo(CLIENT* c, std::uint64_t seed, std::size_t length, timeval timeout,
                       std::string* error) {
  std::vector<unsigned char> data = fault::pattern(seed, length);
  blob in{static_cast<u_int>(length), reinterpret_cast<char*>(data.data())};
  blob out;
  clnt_stat s = clnt_call(c, proc_echo, proc(xdr_blob), &in, proc(xdr_blob), &out, timeout);
  if (s != RPC_SUCCESS) return s;
  fault::stream_verifier v(seed);
  v.feed(out.data, out.length);
  if (!v.ok())
    *error = v.error();
  else if (out.length != length)
    *error = "reply of " + std::to_string(out.length) + " bytes, sent " + std::to_string(length);
  clnt_freeres(c, proc(xdr_blob), &out);
  return s;
}

class Faults : public testing::TestWithParam<client_kind> {
 protected:
  server_process server_;
};

TEST_P(Faults, CallsWithLargeArgumentsSurviveAStoppedServer) {
  ASSERT_NE(server_.port().vmmc, 0);
  CLIENT* c = make_client(GetParam(), server_);
  ASSERT_TRUE(c) << clnt_spcreateerror("client");
  std::string error;
  for (std::uint64_t call = 0; call < 12; ++call) {
    std::optional<fault::paused_for> stopped;
    if (call == 4 || call == 8) {
      stopped.emplace(server_.pid(), 1000ms);
      ASSERT_TRUE(stopped->ok()) << std::strerror(stopped->error());
    }
    auto start = clock_type::now();
    EXPECT_EQ(checked_echo(c, call + 1, argument_bytes, long_wait, &error), RPC_SUCCESS)
        << "call " << call;
    EXPECT_EQ(error, "") << "call " << call;
    if (stopped) {
      EXPECT_GE(clock_type::now() - start, 900ms) << "call " << call << " beat the stop";
    }
  }
  clnt_destroy(c);
}

TEST_P(Faults, ShortTimeoutWhileTheServerIsStoppedTimesOutLikeLibtirpc) {
  ASSERT_NE(server_.port().vmmc, 0);
  CLIENT* c = make_client(GetParam(), server_);
  ASSERT_TRUE(c) << clnt_spcreateerror("client");
  std::string error;
  ASSERT_EQ(checked_echo(c, 1, argument_bytes, long_wait, &error), RPC_SUCCESS);
  {
    fault::paused_for stopped(server_.pid(), 1500ms);
    ASSERT_TRUE(stopped.ok());
    auto start = clock_type::now();
    EXPECT_EQ(clnt_call(c, proc_null, proc(xdr_void), nullptr, proc(xdr_void), nullptr, short_wait),
              RPC_TIMEDOUT);
    auto took = clock_type::now() - start;
    EXPECT_GE(took, 250ms);
    EXPECT_LT(took, 1000ms);
  }
  // The late reply to the timed-out call is skipped; results stay right.
  for (std::uint64_t call = 2; call < 5; ++call) {
    EXPECT_EQ(checked_echo(c, call, argument_bytes, long_wait, &error), RPC_SUCCESS);
    EXPECT_EQ(error, "");
  }
  clnt_destroy(c);
}

INSTANTIATE_TEST_SUITE_P(vrpc, Faults,
                         testing::Values(client_kind::libtirpc_tcp, client_kind::vrpc), kind_name);

std::atomic<int> sigpipes{0};

// What each client's call got after the server was killed, per round.
struct after_kill {
  clnt_stat libtirpc = RPC_SUCCESS, vrpc = RPC_SUCCESS;
  int libtirpc_sigpipes = 0, vrpc_sigpipes = 0;
  std::chrono::nanoseconds took{};
};

// One server, both clients: a checked call each, then the server is killed
// and each client calls twice more. SIGPIPE is counted, not fatal.
std::vector<after_kill> call_after_the_server_is_killed() {
  struct sigaction count_sigpipe {
  }, old{};
  count_sigpipe.sa_handler = [](int) { sigpipes.fetch_add(1); };
  sigaction(SIGPIPE, &count_sigpipe, &old);
  std::vector<after_kill> rounds;
  server_process server;
  CLIENT* oracle = make_client(client_kind::libtirpc_tcp, server);
  CLIENT* ours = make_client(client_kind::vrpc, server);
  std::string error;
  if (server.port().vmmc == 0 || !oracle || !ours ||
      checked_echo(oracle, 1, argument_bytes, long_wait, &error) != RPC_SUCCESS ||
      checked_echo(ours, 2, argument_bytes, long_wait, &error) != RPC_SUCCESS || !error.empty()) {
    ADD_FAILURE() << "set-up failed: " << error;
  } else {
    server.kill();
    for (int round = 0; round < 2; ++round) {
      after_kill r;
      auto start = clock_type::now();
      int before = sigpipes.load();
      r.libtirpc = checked_echo(oracle, 3, argument_bytes, long_wait, &error);
      r.libtirpc_sigpipes = sigpipes.load() - before;
      before = sigpipes.load();
      r.vrpc = checked_echo(ours, 4, argument_bytes, long_wait, &error);
      r.vrpc_sigpipes = sigpipes.load() - before;
      r.took = clock_type::now() - start;
      rounds.push_back(r);
    }
  }
  if (oracle) clnt_destroy(oracle);
  if (ours) clnt_destroy(ours);
  sigaction(SIGPIPE, &old, nullptr);
  return rounds;
}

TEST(FaultsKilled, ServerKilledGivesTheStatusLibtirpcGives) {
  auto rounds = call_after_the_server_is_killed();
  for (std::size_t i = 0; i < rounds.size(); ++i) {
    const after_kill& r = rounds[i];
    EXPECT_LT(r.took, 10s) << "round " << i;
    EXPECT_TRUE(r.libtirpc == RPC_CANTRECV || r.libtirpc == RPC_CANTSEND)
        << "libtirpc: " << clnt_sperrno(r.libtirpc);
    EXPECT_EQ(r.vrpc, r.libtirpc) << "round " << i << ": vRPC " << clnt_sperrno(r.vrpc)
                                  << ", libtirpc " << clnt_sperrno(r.libtirpc);
  }
}

// Stock libtirpc writes with write(2): a call on a connection the dead
// server's kernel reset raises SIGPIPE (fatal unless the program handles
// it). An unmodified program must see the same under vRPC. Which call sees
// it first is timing: the kernel reports a reset once as ECONNRESET (no
// signal), and EPIPE with SIGPIPE from then on, so a connection whose reset
// arrived before a call's write takes one call longer; over the rounds
// both must raise it.
TEST(FaultsKilled, ServerKilledRaisesSigpipeWhereLibtirpcDoes) {
  auto rounds = call_after_the_server_is_killed();
  int vrpc = 0, libtirpc = 0;
  std::string seen;
  for (std::size_t i = 0; i < rounds.size(); ++i) {
    vrpc += rounds[i].vrpc_sigpipes;
    libtirpc += rounds[i].libtirpc_sigpipes;
    seen += " round " + std::to_string(i) + ": vRPC " + clnt_sperrno(rounds[i].vrpc) + " (" +
            std::to_string(rounds[i].vrpc_sigpipes) + " SIGPIPE), libtirpc " +
            clnt_sperrno(rounds[i].libtirpc) + " (" + std::to_string(rounds[i].libtirpc_sigpipes) +
            " SIGPIPE);";
  }
  EXPECT_EQ(vrpc > 0, libtirpc > 0) << seen;
}

}  // namespace
