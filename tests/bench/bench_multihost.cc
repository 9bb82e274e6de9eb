// tests/bench/bench_multihost.cc: the `multihost` benchmark (see
// bench_multihost.h).
#include "bench_multihost.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>

#include "bench_core.h"
#include "bench_nx.h"
#include "bench_sockets.h"
#include "bench_vrpc.h"

namespace vmmc::bench {
namespace {

// The tests' own scripts (tests/support) make the hosts and enter them.
const std::string support = std::string(VMMC_SOURCE_DIR) + "/tests/support/";

// Runs `script` after sourcing tests/support/bridged_hosts.sh.
int with_bridged_hosts(const std::string& script) {
  return std::system(
      ("bash -c 'set -e; . " + support + "bridged_hosts.sh; " + script + "'").c_str());
}

// Hosts a, b and c: a network namespace each ("<prefix>-a" ...), at
// <net>.1, .2, .3 on a bridge (bridged_hosts.sh); removed again on
// destruction (also when a measurement throws).
class simulated_hosts {
 public:
  simulated_hosts() : prefix_("vmmc-bench-" + std::to_string(::getpid())) {
    net_ = "10.237." + std::to_string(::getpid() % 200);
    const int made = with_bridged_hosts("bridged_hosts " + prefix_ + " " + net_ + " a b c");
    if (made != 0) {
      remove();
      throw std::runtime_error("cannot create network namespaces (the benchmark needs root)");
    }
    // mpirun's daemons call it back from a and b as they start.
    if (with_bridged_hosts("hosts_reach " + prefix_ + " " + address("c") + " a b") != 0) {
      remove();
      throw std::runtime_error("the simulated hosts a and b do not reach host c");
    }
  }
  ~simulated_hosts() { remove(); }
  simulated_hosts(const simulated_hosts&) = delete;
  simulated_hosts& operator=(const simulated_hosts&) = delete;

  std::string name(const std::string& host) const { return prefix_ + "-" + host; }
  std::string address(const std::string& host) const {
    return net_ + "." + std::to_string(host[0] - 'a' + 1);
  }
  // Moves the calling process (single-threaded) into `host`'s network.
  void enter(const std::string& host) const {
    const int fd = ::open(("/run/netns/" + name(host)).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0)
      throw std::runtime_error("cannot enter network namespace " + name(host));
    ::close(fd);
  }

 private:
  void remove() const { (void)with_bridged_hosts("remove_bridged_hosts " + prefix_ + " a b c"); }

  std::string prefix_, net_;
};

// mpirun's rsh agent (tests/support/netns_rsh_agent) and the directory it
// gives each host for Open MPI's session files (VMMC_AGENT_TMPDIR, in the
// environment mpirun passes it); removed on destruction.
class rsh_agent {
 public:
  rsh_agent() {
    char dir[] = "/tmp/vmmc-bench-agent-XXXXXX";
    if (!::mkdtemp(dir)) throw std::runtime_error("mkdtemp failed");
    dir_ = dir;
    ::setenv("VMMC_AGENT_TMPDIR", dir_.c_str(), 1);
  }
  ~rsh_agent() { (void)std::system(("rm -rf " + dir_).c_str()); }
  std::string path() const { return support + "netns_rsh_agent"; }

 private:
  std::string dir_;
};

}  // namespace

void run_multihost_benchmark(const options& opts, std::vector<result_row>& rows) {
  const simulated_hosts hosts;
  // This process (the client of every pair) on host a, each pair's child
  // (the server) on host b, listening at b's address.
  hosts.enter("a");
  placement().parent_address = hosts.address("a");
  placement().child_address = hosts.address("b");
  placement().enter_child_host = [&hosts] { hosts.enter("b"); };
  std::cout << "# hosts: a " << hosts.address("a") << ", b " << hosts.address("b")
            << " (network namespaces on a bridge); every process with vmmc's default settings\n";

  measure_sockets_rows(opts.quick, "", "hosts/sockets/", rows);
  std::cerr << "measuring vrpc and libtirpc\n";
  measure_vrpc_rows(opts.quick, "hosts/vrpc/", rows);

  // NX: mpirun on host c starts one node on a and one on b, as between real
  // hosts; Open MPI over its TCP transport, ours with no setting.
  const rsh_agent agent;
  const std::string mpirun = "ip netns exec " + hosts.name("c") +
                             " env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                             "mpirun --host " +
                             hosts.name("a") + "," + hosts.name("b") + " --mca plm_rsh_agent " +
                             agent.path() + " --bind-to none -n ";
  measure_nx_rows(
      opts.quick, "hosts/nx/", {2}, [&](int nodes) { return mpirun + std::to_string(nodes) + " "; },
      [&](int nodes) {
        return mpirun + std::to_string(nodes) + " --mca pml ob1 --mca btl tcp,self ";
      },
      rows);

  measure_core_latency_rows(opts.quick, "tcp", "hosts/core-tcp/", rows);
}

}  // namespace vmmc::bench
