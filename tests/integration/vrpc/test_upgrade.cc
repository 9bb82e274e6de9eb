// tests/integration/vrpc/test_upgrade.cc: the key-value example under
// rpcbind. An rpcgen client binary built only against libtirpc is upgraded
// to VMMC by libvrpc_preload.so without relinking, and falls back to TCP
// against a plain server; rpcinfo sees the service.
//
// The test runs in network and mount namespaces of its own: its rpcbind
// (with lo up and a private /run for rpcbind's socket and lock) never meets
// the host's, and everything it starts is killed at the end.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace {
using namespace std::chrono_literals;

pid_t start(const std::vector<std::string>& argv, int stdout_fd = -1) {
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (stdout_fd >= 0) dup2(stdout_fd, 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

void stop(pid_t& pid) {
  if (pid <= 0) return;
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  pid = -1;
}

// Runs a shell command with a time limit; returns its standard output.
std::string run(const std::string& command) {
  std::string out;
  FILE* f = popen(("timeout 20 " + command + " 2>&1").c_str(), "r");
  if (!f) return out;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), f)) > 0) out.append(buffer.data(), n);
  pclose(f);
  return out;
}

// A kv server (plain: libtirpc's TCP transport) registered with rpcbind;
// returns once it printed its ports.
pid_t start_kv_server(bool plain) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  std::vector<std::string> argv = {KV_SERVER};
  if (plain) argv.push_back("-p");
  pid_t pid = start(argv, fds[1]);
  close(fds[1]);
  char line[256] = {};
  FILE* f = fdopen(fds[0], "r");
  bool ok = fgets(line, sizeof line, f) != nullptr;
  fclose(f);
  if (!ok) stop(pid);
  return pid;
}

std::string client(const std::string& args, bool preload) {
  return run(std::string(preload ? "env LD_PRELOAD=" PRELOAD " " : "") + KV_CLIENT + " 127.0.0.1 " +
             args);
}

// A case of preload_cases (plain libtirpc) under the interposer against the
// kv program; its output, ending "status <exit status>".
std::string preloaded_case(const std::string& role_and_args) {
  return run("env LD_PRELOAD=" PRELOAD " " PRELOAD_CASES " " + role_and_args +
             " 127.0.0.1 536897126 1; echo status $?");
}

class vrpc_upgrade : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_EQ(unshare(CLONE_NEWNET | CLONE_NEWNS), 0) << "needs root";
    ASSERT_EQ(mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr), 0);
    ASSERT_EQ(mount("tmpfs", "/run", "tmpfs", 0, nullptr), 0);
    ASSERT_EQ(system("ip link set lo up"), 0);
    rpcbind_ = start({"/usr/sbin/rpcbind", "-f", "-w"});
    struct stat st;
    for (int i = 0; i < 500 && stat("/run/rpcbind.sock", &st) != 0; ++i)
      std::this_thread::sleep_for(10ms);
    ASSERT_EQ(stat("/run/rpcbind.sock", &st), 0) << "rpcbind did not start";
  }
  static void TearDownTestSuite() { stop(rpcbind_); }
  void TearDown() override { stop(server_); }

  static pid_t rpcbind_;
  pid_t server_ = -1;
};
pid_t vrpc_upgrade::rpcbind_ = -1;

TEST_F(vrpc_upgrade, rpcinfo_sees_the_service_and_plain_clients_reach_it) {
  server_ = start_kv_server(false);
  ASSERT_GT(server_, 0);
  std::string list = run("rpcinfo -p 127.0.0.1");
  EXPECT_NE(list.find("536897126    1   tcp"), std::string::npos) << list;
  EXPECT_NE(list.find("536897126    1   udp"), std::string::npos) << list;
  // rpcinfo's own null calls: over TCP to the vRPC transport, and over UDP.
  EXPECT_NE(run("rpcinfo -t 127.0.0.1 536897126 1").find("ready and waiting"), std::string::npos);
  EXPECT_NE(run("rpcinfo -u 127.0.0.1 536897126 1").find("ready and waiting"), std::string::npos);
  EXPECT_EQ(client("tcp transport", false), "tcp\n");
  EXPECT_EQ(client("udp transport", false), "udp\n");
}

TEST_F(vrpc_upgrade, an_unmodified_rpcgen_client_is_upgraded_without_relinking) {
  server_ = start_kv_server(false);
  ASSERT_GT(server_, 0);
  // The first call of a fresh client may still travel over TCP while the
  // connection upgrades in-band (no probe call does it first any more).
  EXPECT_EQ(client("tcp put colour blue", true), "");
  EXPECT_EQ(client("tcp get colour", true), "blue\n");
  EXPECT_EQ(client("tcp get colour", false), "blue\n");  // the same service, over TCP
  std::string bench = client("tcp bench 2000 100000", true);
  EXPECT_NE(bench.find("2000 puts of 100000 bytes"), std::string::npos) << bench;
  EXPECT_NE(bench.find("over mapped"), std::string::npos) << bench;
  EXPECT_NE(client("tcp bench 10 10", false).find("over tcp"), std::string::npos);
  // UDP clients are left alone.
  EXPECT_EQ(client("udp transport", true), "udp\n");
}

// An upgraded client's children (popen, system, fork + exec) inherit no
// descriptor of the stack: libfabric opened its sockets and epoll sets
// without FD_CLOEXEC (issue 14, item 3).
TEST_F(vrpc_upgrade, the_children_of_an_upgraded_client_inherit_nothing_of_the_stack) {
  server_ = start_kv_server(false);
  ASSERT_GT(server_, 0);
  std::string out = preloaded_case("rpc-inheritance");
  EXPECT_NE(out.find("status 0"), std::string::npos) << out;
}

// Every way libtirpc makes a TCP client is upgraded, invisibly: no probe
// call, no extra connection, clnt_geterr untouched (issue 14, item 6).
TEST_F(vrpc_upgrade, every_tcp_client_creation_is_upgraded_invisibly) {
  server_ = start_kv_server(false);
  ASSERT_GT(server_, 0);
  std::string out = preloaded_case("rpc-create-variants mapped");
  EXPECT_NE(out.find("status 0"), std::string::npos) << out;
}

TEST_F(vrpc_upgrade, every_tcp_client_creation_works_against_a_plain_server) {
  server_ = start_kv_server(true);
  ASSERT_GT(server_, 0);
  std::string out = preloaded_case("rpc-create-variants tcp");
  EXPECT_NE(out.find("status 0"), std::string::npos) << out;
}

TEST_F(vrpc_upgrade, the_preloaded_client_falls_back_to_tcp_against_a_plain_server) {
  server_ = start_kv_server(true);
  ASSERT_GT(server_, 0);
  EXPECT_EQ(client("tcp transport", true), "tcp\n");
  EXPECT_EQ(client("tcp put shape round", true), "");
  EXPECT_EQ(client("tcp get shape", true), "round\n");
}

}  // namespace
