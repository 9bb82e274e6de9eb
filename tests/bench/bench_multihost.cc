// tests/bench/bench_multihost.cc: the `multihost` benchmark (see
// bench_multihost.h).
#include "bench_multihost.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>

#include "bench_core.h"
#include "bench_nx.h"
#include "bench_sockets.h"
#include "bench_vrpc.h"

namespace vmmc::bench {
namespace {

void sh(const std::string& command) {
  if (std::system((command + " > /dev/null 2>&1").c_str()) != 0)
    throw std::runtime_error("failed: " + command);
}

// Hosts a, b and c: a network namespace each ("<prefix>-a" ...), at
// <net>.1, .2, .3 on a bridge in a namespace of its own; removed again on
// destruction (also when a measurement throws).
class simulated_hosts {
 public:
  simulated_hosts() : prefix_("vmmc-bench-" + std::to_string(::getpid())) {
    net_ = "10.237." + std::to_string(::getpid() % 200);
    if (std::system(("ip netns add " + prefix_ + "-wire 2> /dev/null").c_str()) != 0)
      throw std::runtime_error("cannot create network namespaces (the benchmark needs root)");
    try {
      sh("ip -n " + prefix_ + "-wire link add br0 type bridge");
      sh("ip -n " + prefix_ + "-wire link set br0 up");
      int i = 0;
      for (const char* h : {"a", "b", "c"}) {
        ++i;
        const std::string ns = name(h);
        sh("ip netns add " + ns);
        sh("ip link add " + std::string(h) + "0 netns " + ns + " type veth peer name w" + h +
           " netns " + prefix_ + "-wire");
        sh("ip -n " + ns + " addr add " + net_ + "." + std::to_string(i) + "/24 dev " + h + "0");
        sh("ip -n " + ns + " link set lo up");
        sh("ip -n " + ns + " link set " + h + "0 up");
        sh("ip -n " + prefix_ + "-wire link set w" + h + " master br0 up");
      }
      // The bridge forwards once its ports have learned: wait until a and
      // b reach c (mpirun's daemons call it back).
      for (const char* h : {"a", "b"})
        sh("for i in $(seq 50); do ip netns exec " + name(h) + " ping -c 1 -W 1 " + address("c") +
           " > /dev/null && exit 0; sleep 0.1; done; exit 1");
    } catch (...) {
      remove();
      throw;
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
  void remove() const {
    for (const char* h : {"a", "b", "c", "wire"})
      (void)std::system(("ip netns del " + prefix_ + "-" + h + " 2> /dev/null").c_str());
  }

  std::string prefix_, net_;
};

// mpirun's rsh agent: "agent HOST COMMAND...", HOST a namespace (what ssh
// is between real hosts), each host with a /tmp of its own for Open MPI's
// session files (the hosts share a host name: two daemons writing one
// topology file crashed in hwloc_shmem_topology_write); all removed on
// destruction.
class rsh_agent {
 public:
  rsh_agent() {
    char dir[] = "/tmp/vmmc-bench-agent-XXXXXX";
    if (!::mkdtemp(dir)) throw std::runtime_error("mkdtemp failed");
    dir_ = dir;
    path_ = dir_ + "/agent";
    std::ofstream(path_) << "#!/bin/sh\nhost=$1\nshift\nmkdir -p " << dir_
                         << "/$host\nexec ip netns exec \"$host\" env OMPI_MCA_orte_tmpdir_base="
                         << dir_ << "/$host sh -c \"$*\"\n";
    ::chmod(path_.c_str(), 0755);
  }
  ~rsh_agent() { (void)std::system(("rm -rf " + dir_).c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string dir_, path_;
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
