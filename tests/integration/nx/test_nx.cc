// tests/integration/nx/test_nx.cc: runs nx_cases suites as NX jobs, under
// nxrun and under mpirun (PMIx), and checks how each job ends.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "time_scale.h"

namespace {

// Runs a shell command with a deadline; returns its exit status (124: timed out).
int run(const std::string& command, int seconds = 60) {
  std::string line = "timeout -k 5 " + std::to_string(seconds) + " " + command;
  int status = std::system(line.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

// NX_TEST_NODE_WRAPPER, when set, is what nxrun starts each node through
// (tests/integration/nx/namespaces.sh puts nodes on simulated hosts so).
std::string nxrun(int nodes, const std::string& suite) {
  const char* wrapper = std::getenv("NX_TEST_NODE_WRAPPER");
  return std::string(NXRUN) + " -n " + std::to_string(nodes) + " " +
         (wrapper ? std::string(wrapper) + " " : "") + NX_CASES + " " + suite;
}

std::string mpirun_program(int nodes, const std::string& program) {
  return "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
         "mpirun --oversubscribe -n " +
         std::to_string(nodes) + " " + program;
}

std::string mpirun(int nodes, const std::string& suite) {
  return mpirun_program(nodes, std::string(NX_CASES) + " " + suite);
}

// run() with stdout and stderr kept in `out`.
int run_logged(const std::string& command, int seconds, std::string& out) {
  const std::string log = testing::TempDir() + "nx_run.log";
  int status = run(command + " > " + log + " 2>&1", seconds);
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  out = text.str();
  std::remove(log.c_str());
  return status;
}

// A node that exits in order while others wait for it (integration.nx.exit,
// nx_cases suites ended, ended_plain, send_then_exit), under `launch`.
void node_exits_while_others_wait(const std::function<std::string(int, std::string)>& launch,
                                  int nodes) {
  std::string out;
  // Underscore forms: each wait on it fails with EQBADNODE within 1 s, the
  // others go on, and the job ends normally.
  EXPECT_EQ(run_logged(launch(nodes, "ended"), 30, out), 0) << out;
  EXPECT_NE(out.find("receive from an ended node failed"), std::string::npos) << out;
  // Plain forms: the job ends with an error that names the node.
  int status = run_logged(launch(nodes, "ended_plain"), 30, out);
  EXPECT_NE(status, 0) << out;
  EXPECT_NE(status, 124) << "the job hung: " << out;
  const std::string named = "gsync: node " + std::to_string(nodes - 1) + " ended";
  EXPECT_NE(out.find(named), std::string::npos) << out;
}

// The pids of the nodes of suite "hang" in its log, once `nodes` of them are
// waiting (empty after 30 s, or when the launcher ended first).
std::vector<pid_t> hung_nodes(const std::string& log, pid_t launcher, int nodes) {
  for (int i = 0; i < 300; ++i) {
    std::ifstream in(log);
    std::vector<pid_t> pids;
    for (std::string line; std::getline(in, line);) {
      long node = 0;
      int pid = 0;
      if (std::sscanf(line.c_str(), "nx_cases hang: node %ld pid %d waiting", &node, &pid) == 2)
        pids.push_back(pid);
    }
    if (static_cast<int>(pids.size()) == nodes) return pids;
    if (::waitpid(launcher, nullptr, WNOHANG) == launcher) return {};
    ::usleep(100000);
  }
  return {};
}

// Whether `pid` is still one of our nodes (gone, or a zombie: ended).
bool node_alive(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(in, stat);
  return stat.find("(nx_cases) ") != std::string::npos &&
         stat.find("(nx_cases) Z") == std::string::npos;
}

// Starts `command` (a launcher running suite "hang" on `nodes` nodes), sends
// it `sig` once every node waits, and returns how many nodes outlived it by
// 5 s. The test kills what it started: the launcher, and nodes left behind.
int nodes_left_after_launcher_killed(const std::string& command, int nodes, int sig) {
  const std::string log = testing::TempDir() + "nx_hang.log";
  std::remove(log.c_str());
  pid_t launcher = ::fork();
  if (launcher == 0) {
    ::setpgid(0, 0);  // the launcher alone gets the signal, not the test
    const std::string line = "exec " + command + " > " + log + " 2>&1";
    ::execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  std::vector<pid_t> pids = hung_nodes(log, launcher, nodes);
  EXPECT_EQ(static_cast<int>(pids.size()), nodes) << "the nodes did not start";
  ::kill(launcher, sig);
  for (int i = 0; i < 100 && ::waitpid(launcher, nullptr, WNOHANG) != launcher; ++i)
    ::usleep(100000);
  ::kill(launcher, SIGKILL);
  ::waitpid(launcher, nullptr, 0);
  int left = 0;
  for (int i = 0; i < 50; ++i) {
    left = 0;
    for (pid_t pid : pids) left += node_alive(pid) ? 1 : 0;
    if (left == 0) break;
    ::usleep(100000);
  }
  for (pid_t pid : pids)
    if (node_alive(pid)) ::kill(pid, SIGKILL);
  std::remove(log.c_str());
  return left;
}

// What a node sent just before it exited is delivered, also when it exits
// while its peer is still starting.
// Runs `runs` times, a third as many (at least 10) under TSan, whose time
// scale stretches each run's 0.4 s to 1.5 s (the CI's time budget).
void sent_before_exit_is_delivered(const std::function<std::string(int, std::string)>& launch,
                                   int runs) {
  if (vmmc::test::time_scale() > 1) runs = std::max(std::min(runs, 10), runs / 3);
  for (int i = 0; i < runs; ++i) {
    std::string out;
    ASSERT_EQ(run_logged(launch(2, "send_then_exit"), 30, out), 0) << "run " << i << ": " << out;
  }
}

}  // namespace

TEST(nx_nxrun, point_to_point_2_nodes) {
  EXPECT_EQ(run(nxrun(2, "p2p")), 0);
}
TEST(nx_nxrun, point_to_point_3_nodes) {
  EXPECT_EQ(run(nxrun(3, "p2p")), 0);
}

TEST(nx_nxrun, collectives_1_to_4_nodes) {
  for (int n = 1; n <= 4; ++n) EXPECT_EQ(run(nxrun(n, "collectives")), 0) << n << " nodes";
}

// All nodes confined to one CPU (a CPU set, taskset): they must see that
// they share it and yield instead of spinning.
TEST(nx_nxrun, nodes_sharing_one_cpu_yield_to_each_other) {
  EXPECT_EQ(run("taskset -c 0 " + nxrun(2, "pingpong"), 30), 0);
}

// The same suites over libfabric instead of the mapped path, as between hosts.
TEST(nx_nxrun, over_fabric_shm) {
  const std::string env = "env VMMC_CORE_MAPPED=0 VMMC_CORE_PROVIDERS=shm ";
  EXPECT_EQ(run(env + nxrun(2, "p2p")), 0);
  EXPECT_EQ(run(env + nxrun(3, "collectives")), 0);
}

TEST(nx_nxrun, over_fabric_tcp) {
  const std::string env = "env VMMC_CORE_MAPPED=0 VMMC_CORE_PROVIDERS=tcp ";
  EXPECT_EQ(run(env + nxrun(2, "p2p")), 0);
  EXPECT_EQ(run(env + nxrun(3, "collectives")), 0);
}

// Over libfabric a message larger than the ring is placed straight into the
// posted receive buffer, all but what the ring held when the header was read
// (2 MiB rings, 8 MiB messages: at least half of the bytes). VMMC_NX_STATS=1
// prints the byte counts.
TEST(nx_nxrun, large_messages_are_redirected_over_fabric) {
  const std::string counts =
      " 2>&1 | awk '/node 1 <- node 0:/ { for (i = 2; i <= NF; ++i) {"
      " if ($i == \"copied,\") c = $(i-2) + 0; if ($i == \"redirected,\") r = $(i-1) + 0 } }"
      " END { exit !(r > 0 && r >= c) }'";
  for (const char* provider : {"tcp", "shm"}) {
    const std::string env = std::string("env VMMC_NX_STATS=1 VMMC_CORE_MAPPED=0 ") +
                            "VMMC_CORE_PROVIDERS=" + provider + " ";
    EXPECT_EQ(run(env + nxrun(2, "large") + counts), 0) << provider;
  }
}

TEST(nx_nxrun, plain_form_error_terminates_the_job) {
  EXPECT_EQ(run(nxrun(2, "too_long")), 1);
}

TEST(nx_nxrun, killed_node_ends_the_job_with_an_error) {
  EXPECT_EQ(run(nxrun(3, "killed"), 30), 1);
}

TEST(nx_nxrun, a_node_gone_is_an_error_for_its_waiters) {
  EXPECT_EQ(run(nxrun(3, "vanished"), 30), 0);
}

TEST(nx_nxrun, killproc_ends_the_job_with_an_error) {
  EXPECT_EQ(run(nxrun(2, "killproc"), 30), 1);
}

TEST(nx_nxrun, program_that_cannot_start) {
  EXPECT_NE(run(std::string(NXRUN) + " -n 2 /nonexistent/program"), 0);
}

// ---- Issue 18 (integration.nx.calls): the added calls, NX's error codes
// and return values, from C (nx_calls), under both launchers.

TEST(nx_calls, c_program_under_nxrun_2_and_3_nodes) {
  for (int n : {2, 3})
    EXPECT_EQ(run(std::string(NXRUN) + " -n " + std::to_string(n) + " " + NX_CALLS, 20), 0) << n;
}

TEST(nx_calls, c_program_under_mpirun_3_nodes) {
  EXPECT_EQ(run(mpirun_program(3, NX_CALLS), 30), 0);
}

#ifdef NX_FORTRAN
// integration.nx.fortran: the same Fortran program with gfortran's names
// (libvmmc_nx) and without the underscore (libvmmc_nx_fortran_plain).
TEST(nx_fortran, gfortran_program_under_nxrun) {
  EXPECT_EQ(run(std::string(NXRUN) + " -n 3 " + NX_FORTRAN, 20), 0);
  EXPECT_EQ(run(std::string(NXRUN) + " -n 2 " + NX_FORTRAN_PLAIN, 20), 0);
}

TEST(nx_fortran, gfortran_program_under_mpirun) {
  EXPECT_EQ(run(mpirun_program(3, NX_FORTRAN), 30), 0);
}
#endif

TEST(nx_mpirun, point_to_point_and_collectives_4_nodes) {
  EXPECT_EQ(run(mpirun(4, "p2p")), 0);
  EXPECT_EQ(run(mpirun(4, "collectives")), 0);
  EXPECT_EQ(run(mpirun(3, "collectives")), 0);
}

TEST(nx_mpirun, killed_node_ends_the_job_with_an_error) {
  int status = run(mpirun(3, "killed"), 40);
  EXPECT_NE(status, 0);
  EXPECT_NE(status, 124) << "the job hung";
}

// ---- Faults (integration.nx.faults): checksummed message streams while a
// node is stopped (SIGSTOP) for a second or killed (nx_cases suites
// "stopped" and "killed_mid_stream"; the nodes exchange pids in-band).

TEST(nx_faults, stopped_node_delays_the_stream_but_loses_nothing) {
  EXPECT_EQ(run(nxrun(2, "stopped"), 60), 0);
}

TEST(nx_faults, stopped_node_over_fabric_tcp_and_shm) {
  for (const char* provider : {"tcp", "shm"}) {
    const std::string env =
        std::string("env VMMC_CORE_MAPPED=0 VMMC_CORE_PROVIDERS=") + provider + " ";
    EXPECT_EQ(run(env + nxrun(2, "stopped"), 60), 0) << provider;
  }
}

// Node 0 kills node 1 mid-stream: the job ends with an error (the launcher's
// rule for a node killed by a signal), not a hang; what node 0 received was
// intact; if node 0 got to ask for more before the launcher ended it, NX
// told it EQBADNODE.
TEST(nx_faults, node_killed_mid_stream_is_an_error_not_a_hang) {
  const std::string log = testing::TempDir() + "nx_killed_mid_stream.log";
  int status = run(nxrun(3, "killed_mid_stream") + " > " + log + " 2>&1", 40);
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  const std::string out = text.str();
  EXPECT_EQ(status, 1) << out;
  EXPECT_NE(out.find("node 0: verified"), std::string::npos) << out;
  EXPECT_EQ(out.find("CHECK("), std::string::npos) << out;
  if (out.find("node 0: errno") != std::string::npos) {
    EXPECT_NE(out.find("(EQBADNODE)"), std::string::npos) << out;
  }
  std::printf("[ faults   ] %s", out.c_str());
}

// ---- A node that exits normally (integration.nx.exit): peers waiting for
// it get an error instead of hanging; what it sent before is delivered.

TEST(nx_exit, node_exits_while_others_wait_under_nxrun) {
  for (int n : {2, 3, 4}) node_exits_while_others_wait(nxrun, n);
}

TEST(nx_exit, node_exits_while_others_wait_under_mpirun) {
  node_exits_while_others_wait(mpirun, 3);
}

TEST(nx_exit, sent_before_exit_is_delivered_under_nxrun) {
  sent_before_exit_is_delivered(nxrun, 30);
}

TEST(nx_exit, sent_before_exit_is_delivered_under_mpirun) {
  sent_before_exit_is_delivered(mpirun, 5);
}

// ---- The launcher ends (integration.nx.launcher): no node outlives it,
// whether it is terminated (SIGTERM: it may clean up) or killed (SIGKILL:
// the nodes must notice themselves).

TEST(nx_launcher, nodes_end_with_nxrun) {
  for (int sig : {SIGTERM, SIGKILL})
    EXPECT_EQ(nodes_left_after_launcher_killed(nxrun(3, "hang"), 3, sig), 0) << strsignal(sig);
}

TEST(nx_launcher, nodes_end_with_mpirun) {
  for (int sig : {SIGTERM, SIGKILL})
    EXPECT_EQ(nodes_left_after_launcher_killed(mpirun(3, "hang"), 3, sig), 0) << strsignal(sig);
}

// ---- hrecv handlers run when their message arrives (integration.nx.handlers,
// suite handler_server): while the serving node waits in gsync, while it
// computes with no NX call, and held by masktrap.

TEST(nx_handlers, hrecv_server_answers_while_waiting_or_computing_under_nxrun) {
  for (int n : {2, 3}) EXPECT_EQ(run(nxrun(n, "handler_server"), 40), 0) << n << " nodes";
}

TEST(nx_handlers, hrecv_server_answers_while_waiting_or_computing_under_mpirun) {
  EXPECT_EQ(run(mpirun(3, "handler_server"), 40), 0);
}
