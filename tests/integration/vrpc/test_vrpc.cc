// tests/integration/vrpc/test_vrpc.cc: vRPC clients and servers against each
// other and against libtirpc's own UDP and TCP transports, with one server
// process running an unmodified svc_run().
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "integration/vrpc/test_service.h"
#include "vmmc/sockets/socket.h"

namespace {
using namespace vrpc_test;
using namespace std::chrono_literals;

const timeval long_wait{20, 0};
const timeval no_wait{0, 0};
const timeval short_wait{0, 300000};

std::string whoami(CLIENT* c) {
  char* text = nullptr;
  clnt_stat s =
      clnt_call(c, proc_whoami, proc(xdr_void), nullptr, proc(xdr_wrapstring), &text, long_wait);
  if (s != RPC_SUCCESS) return std::string("error: ") + clnt_sperrno(s);
  std::string out = text;
  clnt_freeres(c, proc(xdr_wrapstring), &text);
  return out;
}

bool echo_round_trip(CLIENT* c, const std::string& data) {
  blob in{static_cast<u_int>(data.size()), const_cast<char*>(data.data())};
  blob out;
  if (clnt_call(c, proc_echo, proc(xdr_blob), &in, proc(xdr_blob), &out, long_wait) != RPC_SUCCESS)
    return false;
  bool same = out.length == data.size() && std::memcmp(out.data, data.data(), data.size()) == 0;
  clnt_freeres(c, proc(xdr_blob), &out);
  return same;
}

// The VMMC path the vRPC connections should take: "mapped" by default; the
// CTest entry over libfabric tcp sets it to "fabric:tcp".
std::string expected_path() {
  const char* p = std::getenv("VRPC_TEST_EXPECT_PATH");
  return p ? p : "mapped";
}

bool starts_with(const char* text, const std::string& prefix) {
  return text && std::string(text).rfind(prefix, 0) == 0;
}

class vrpc : public ::testing::Test {
 protected:
  server_process server_;
};

TEST_F(vrpc, one_svc_run_serves_udp_tcp_and_vmmc_clients_at_once) {
  sockaddr_in udp_address = server_.address(server_.port().udp);
  sockaddr_in tcp_address = server_.address(server_.port().tcp);
  int udp_socket = RPC_ANYSOCK, tcp_socket = RPC_ANYSOCK;
  const timeval retry{1, 0};
  CLIENT* udp = clntudp_create(&udp_address, program, version, retry, &udp_socket);
  CLIENT* tcp = clnttcp_create(&tcp_address, program, version, &tcp_socket, 0, 0);
  CLIENT* ours = clnt_vmmc_create("127.0.0.1", program, version, server_.port().vmmc);
  ASSERT_TRUE(udp) << clnt_spcreateerror("udp");
  ASSERT_TRUE(tcp) << clnt_spcreateerror("tcp");
  ASSERT_TRUE(ours) << clnt_spcreateerror("vmmc");

  std::atomic<int> failures{0};
  auto hammer = [&](CLIENT* c, int rounds, std::size_t size) {
    std::string data(size, 'x');
    for (int i = 0; i < rounds; ++i) {
      data[i % size] = static_cast<char>(i);
      if (!echo_round_trip(c, data)) ++failures;
    }
  };
  std::thread a(hammer, udp, 300, 1000), b(hammer, tcp, 300, 5000), d(hammer, ours, 300, 70000);
  a.join(), b.join(), d.join();
  EXPECT_EQ(failures.load(), 0);

  EXPECT_NE(whoami(udp).find("path=udp"), std::string::npos) << whoami(udp);
  EXPECT_NE(whoami(tcp).find("path=tcp"), std::string::npos) << whoami(tcp);
  EXPECT_NE(whoami(ours).find("path=" + expected_path()), std::string::npos) << whoami(ours);
  EXPECT_TRUE(starts_with(clnt_vmmc_path(ours), expected_path())) << clnt_vmmc_path(ours);
  EXPECT_EQ(clnt_vmmc_path(tcp), nullptr);

  // A plain libtirpc TCP client of the vRPC port: served, over kernel TCP.
  sockaddr_in vmmc_address = server_.address(server_.port().vmmc);
  int plain_socket = RPC_ANYSOCK;
  CLIENT* plain = clnttcp_create(&vmmc_address, program, version, &plain_socket, 0, 0);
  ASSERT_TRUE(plain);
  EXPECT_TRUE(echo_round_trip(plain, std::string(100000, 'p')));
  EXPECT_NE(whoami(plain).find("path=tcp"), std::string::npos) << whoami(plain);
  for (CLIENT* c : {udp, tcp, ours, plain}) clnt_destroy(c);
}

// A client on this host wakes a connection that went back to svc_run with
// an eventfd write that svc_run polls, not a TCP segment each way (on a
// crowded machine, where every call sleeps, that doorbell made a null call
// slower than libtirpc's UDP: 12 us against 11). Across hosts (the fabric
// path) the doorbell stays. Each call is answered at once: a wake-up svc_run
// did not see would wait for the 100 ms sweeper.
TEST_F(vrpc, a_client_wakes_an_idle_server_connection_without_a_tcp_segment) {
  CLIENT* ours = clnt_vmmc_create("127.0.0.1", program, version, server_.port().vmmc);
  ASSERT_TRUE(ours) << clnt_spcreateerror("vmmc");
  // Calls until the connection is upgraded (on use, after a while), and one
  // more: the switch's doorbell is not counted.
  for (int i = 0; i < 500 && whoami(ours).find("path=" + expected_path()) == std::string::npos; ++i)
    std::this_thread::sleep_for(2ms);
  ASSERT_TRUE(echo_round_trip(ours, "upgraded"));
  auto doorbells = [&] {
    const std::string who = whoami(ours), key = " doorbells_in=";
    const auto at = who.find(key);
    return at == std::string::npos ? -1L : std::atol(who.c_str() + at + key.size());
  };
  const long before = doorbells();
  ASSERT_GE(before, 0);
  std::vector<double> ms;
  for (int i = 0; i < 20; ++i) {
    std::this_thread::sleep_for(20ms);  // the server's watch ends: it sleeps in svc_run
    const auto start = std::chrono::steady_clock::now();
    ASSERT_TRUE(echo_round_trip(ours, "call " + std::to_string(i)));
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
  }
  std::sort(ms.begin(), ms.end());
  EXPECT_LT(ms[ms.size() / 2], 50.0) << "median call after an idle pause, ms";
  if (expected_path() == "mapped") {
    EXPECT_EQ(doorbells(), before) << "TCP doorbells for 20 calls to an idle connection";
  }
  clnt_destroy(ours);
}

TEST_F(vrpc, auth_sys_credentials_and_caller_reach_the_service) {
  CLIENT* c = clnt_vmmc_create("127.0.0.1", program, version, server_.port().vmmc);
  ASSERT_TRUE(c);
  EXPECT_NE(whoami(c).find("flavor=0"), std::string::npos);
  auth_destroy(c->cl_auth);
  c->cl_auth = authunix_create(const_cast<char*>("vrpc-host"), 4321, 8765, 0, nullptr);
  std::string who = whoami(c);
  EXPECT_NE(who.find("flavor=1 uid=4321 gid=8765 machine=vrpc-host"), std::string::npos) << who;
  EXPECT_NE(who.find("caller=127.0.0.1"), std::string::npos) << who;
  EXPECT_NE(who.find("rpccaller_len=16"), std::string::npos) << who;
  auth_destroy(c->cl_auth);
  clnt_destroy(c);
}

TEST_F(vrpc, clnt_control_and_geterr) {
  CLIENT* c = clnt_vmmc_create("127.0.0.1", program, version, server_.port().vmmc);
  ASSERT_TRUE(c);
  int fd = -1;
  ASSERT_TRUE(clnt_control(c, CLGET_FD, &fd));
  EXPECT_TRUE(vmmc::sockets::describe(fd).has_value());
  sockaddr_in server{};
  ASSERT_TRUE(clnt_control(c, CLGET_SERVER_ADDR, &server));
  EXPECT_EQ(ntohs(server.sin_port), server_.port().vmmc);
  netbuf svc{};
  ASSERT_TRUE(clnt_control(c, CLGET_SVC_ADDR, &svc));
  EXPECT_EQ(svc.len, sizeof(sockaddr_in));
  u_int32_t word = 0;
  ASSERT_TRUE(clnt_control(c, CLGET_PROG, &word));
  EXPECT_EQ(word, program);
  ASSERT_TRUE(clnt_control(c, CLGET_VERS, &word));
  EXPECT_EQ(word, version);

  u_int32_t xid = 777000;
  ASSERT_TRUE(clnt_control(c, CLSET_XID, &xid));
  ASSERT_EQ(clnt_call(c, proc_null, proc(xdr_void), nullptr, proc(xdr_void), nullptr, long_wait),
            RPC_SUCCESS);
  ASSERT_TRUE(clnt_control(c, CLGET_XID, &word));
  EXPECT_EQ(word, xid);

  timeval tv{3, 0}, got{};
  ASSERT_TRUE(clnt_control(c, CLSET_TIMEOUT, &tv));
  ASSERT_TRUE(clnt_control(c, CLGET_TIMEOUT, &got));
  EXPECT_EQ(got.tv_sec, 3);

  // A procedure the program lacks, and a version it lacks: the server's verdicts.
  EXPECT_EQ(clnt_call(c, 99, proc(xdr_void), nullptr, proc(xdr_void), nullptr, long_wait),
            RPC_PROCUNAVAIL);
  rpc_err e{};
  clnt_geterr(c, &e);
  EXPECT_EQ(e.re_status, RPC_PROCUNAVAIL);
  word = version + 5;
  ASSERT_TRUE(clnt_control(c, CLSET_VERS, &word));
  EXPECT_EQ(clnt_call(c, proc_null, proc(xdr_void), nullptr, proc(xdr_void), nullptr, long_wait),
            RPC_PROGVERSMISMATCH);
  clnt_destroy(c);
}

TEST_F(vrpc, timeouts_and_one_way_calls) {
  CLIENT* c = clnt_vmmc_create("127.0.0.1", program, version, server_.port().vmmc);
  ASSERT_TRUE(c);
  u_int ms = 1500;
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(clnt_call(c, proc_sleep, proc(xdr_u_int), &ms, proc(xdr_void), nullptr, short_wait),
            RPC_TIMEDOUT);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1400ms);
  // The late reply is skipped by the next call.
  EXPECT_EQ(clnt_call(c, proc_null, proc(xdr_void), nullptr, proc(xdr_void), nullptr, long_wait),
            RPC_SUCCESS);

  for (int i = 0; i < 200; ++i)
    EXPECT_EQ(clnt_call(c, proc_oneway, proc(xdr_void), nullptr, nullptr, nullptr, no_wait),
              RPC_TIMEDOUT);
  u_int count = 0;
  EXPECT_EQ(clnt_call(c, proc_count, proc(xdr_void), nullptr, proc(xdr_u_int), &count, long_wait),
            RPC_SUCCESS);
  EXPECT_EQ(count, 200u);
  clnt_destroy(c);
}

TEST_F(vrpc, sixty_four_mib_arguments_and_results_round_trip_intact) {
  CLIENT* c = clnt_vmmc_create("127.0.0.1", program, version, server_.port().vmmc);
  ASSERT_TRUE(c);
  std::string data(64 << 20, '\0');
  std::mt19937_64 random(42);
  for (std::size_t i = 0; i + 8 <= data.size(); i += 8) {
    std::uint64_t v = random();
    std::memcpy(&data[i], &v, 8);
  }
  EXPECT_TRUE(echo_round_trip(c, data));
  // Into a buffer the application supplies.
  std::string into(data.size(), '\0');
  blob in{static_cast<u_int>(data.size()), data.data()},
      out{static_cast<u_int>(into.size()), into.data()};
  ASSERT_EQ(clnt_call(c, proc_echo, proc(xdr_blob), &in, proc(xdr_blob), &out, long_wait),
            RPC_SUCCESS);
  EXPECT_EQ(out.data, into.data());
  EXPECT_TRUE(into == data);
  EXPECT_TRUE(starts_with(clnt_vmmc_path(c), expected_path())) << clnt_vmmc_path(c);
  clnt_destroy(c);
}

TEST_F(vrpc, server_killed_mid_call_gives_cantrecv_not_a_hang) {
  // The later call writes to a reset connection: SIGPIPE, as with libtirpc
  // (see test_faults.cc), which a client that outlives its server ignores.
  struct sigaction ignore {
  }, old{};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ignore, &old);
  CLIENT* c = clnt_vmmc_create("127.0.0.1", program, version, server_.port().vmmc);
  ASSERT_TRUE(c);
  ASSERT_EQ(clnt_call(c, proc_null, proc(xdr_void), nullptr, proc(xdr_void), nullptr, long_wait),
            RPC_SUCCESS);
  std::thread killer([&] {
    std::this_thread::sleep_for(300ms);
    server_.kill();
  });
  u_int ms = 15000;
  auto start = std::chrono::steady_clock::now();
  clnt_stat s = clnt_call(c, proc_sleep, proc(xdr_u_int), &ms, proc(xdr_void), nullptr, long_wait);
  killer.join();
  EXPECT_EQ(s, RPC_CANTRECV) << clnt_sperrno(s);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  // Later calls fail at once too.
  s = clnt_call(c, proc_null, proc(xdr_void), nullptr, proc(xdr_void), nullptr, long_wait);
  EXPECT_TRUE(s == RPC_CANTSEND || s == RPC_CANTRECV) << clnt_sperrno(s);
  clnt_destroy(c);
  sigaction(SIGPIPE, &old, nullptr);
}

// A process linked with vRPC (no interposer) forks; the child calls through
// the client it inherited and exits; the parent's client still works, as
// with libtirpc. The sockets layer's fork handlers were installed only by
// libvmmc_preload.so: without them the parent's next call timed out, then
// every call failed with a reset (issue 14, item 6a).
TEST_F(vrpc, a_forked_child_that_calls_leaves_the_parents_client_working) {
  CLIENT* c = clnt_vmmc_create("127.0.0.1", program, version, server_.port().vmmc);
  ASSERT_TRUE(c);
  ASSERT_TRUE(echo_round_trip(c, "before the fork"));
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    bool ok = true;
    for (int i = 0; i < 3; ++i)
      ok = ok && echo_round_trip(c, "from the child " + std::to_string(i));
    std::exit(ok ? 0 : 1);  // exit handlers run
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(echo_round_trip(c, "from the parent " + std::to_string(i))) << i;
  clnt_destroy(c);
}

// A reply must end in a fragment that carries data, as libtirpc's own
// servers send it. One that ended in an empty last fragment (after a large
// value sent as its own fragment) broke plain libtirpc clients that fork: the
// client reads that trailing header only at its next call, so a child that
// called first took it off the shared connection, and the parent then took
// the first fragment of its next reply for the end of the old record,
// skipped the reply and timed out (the apps matrix's vrpc_fork, server only).
TEST_F(vrpc, replies_to_plain_clients_end_in_a_fragment_with_data) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(server_.port().vmmc);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  timeval limit{20, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  for (std::size_t size : {std::size_t{100}, std::size_t{64} << 10, std::size_t{1} << 20}) {
    // The call, encoded by libtirpc itself (AUTH_NONE).
    std::string value(size, 'v');
    blob in{static_cast<u_int>(size), value.data()};
    std::vector<char> call(size + 1024);
    XDR x;
    xdrmem_create(&x, call.data() + 4, static_cast<u_int>(call.size() - 4), XDR_ENCODE);
    rpc_msg m{};
    m.rm_xid = static_cast<u_int32_t>(size);
    m.rm_direction = CALL;
    m.rm_call.cb_rpcvers = RPC_MSG_VERSION;
    m.rm_call.cb_prog = program;
    m.rm_call.cb_vers = version;
    m.rm_call.cb_proc = proc_echo;
    m.rm_call.cb_cred = _null_auth;
    m.rm_call.cb_verf = _null_auth;
    ASSERT_TRUE(xdr_callmsg(&x, &m) && xdr_blob(&x, &in));
    const u_int body = xdr_getpos(&x);
    std::uint32_t header = htonl(body | 0x80000000u);
    std::memcpy(call.data(), &header, 4);
    ASSERT_EQ(::write(fd, call.data(), body + 4), static_cast<ssize_t>(body + 4));
    // The reply, fragment by fragment.
    auto read_exactly = [&](void* p, std::size_t n) {
      for (std::size_t done = 0; done < n;) {
        ssize_t r = ::read(fd, static_cast<char*>(p) + done, n - done);
        if (r <= 0) return false;
        done += static_cast<std::size_t>(r);
      }
      return true;
    };
    std::vector<std::uint32_t> fragments;
    std::vector<char> reply;
    for (bool last = false; !last;) {
      ASSERT_TRUE(read_exactly(&header, 4)) << size;
      header = ntohl(header);
      last = header & 0x80000000u;
      fragments.push_back(header & ~0x80000000u);
      reply.resize(reply.size() + fragments.back());
      ASSERT_TRUE(read_exactly(reply.data() + reply.size() - fragments.back(), fragments.back()));
    }
    EXPECT_GT(fragments.back(), 0u)
        << size << " B: the record ended in an empty fragment (of " << fragments.size() << ")";
    // It is the echo, and nothing of it is left on the connection.
    xdrmem_create(&x, reply.data(), static_cast<u_int>(reply.size()), XDR_DECODE);
    rpc_msg r{};
    blob out;
    r.acpted_rply.ar_verf = _null_auth;
    r.acpted_rply.ar_results.where = nullptr;
    r.acpted_rply.ar_results.proc = proc(xdr_void);
    ASSERT_TRUE(xdr_replymsg(&x, &r) && xdr_blob(&x, &out)) << size;
    EXPECT_EQ(r.rm_xid, static_cast<u_int32_t>(size));
    EXPECT_EQ(std::string(out.data, out.length), value) << size;
    xdr_free(proc(xdr_blob), reinterpret_cast<char*>(&out));
    char extra;
    EXPECT_EQ(::recv(fd, &extra, 1, MSG_DONTWAIT), -1) << size << " B: bytes after the record";
  }
  ::close(fd);
}

// A plain libtirpc client that forks, as in the apps matrix: the child calls
// on the inherited CLIENT, then the parent goes on with it.
TEST_F(vrpc, a_plain_clients_forked_child_leaves_the_parents_client_working) {
  for (int round = 0; round < 10; ++round) {
    CLIENT* c = clnt_create("127.0.0.1", program, version, "tcp");
    if (!c) {  // the port through rpcbind; without rpcbind, the port directly
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(server_.port().vmmc);
      int sock = RPC_ANYSOCK;
      c = clnttcp_create(&a, program, version, &sock, 0, 0);
    }
    ASSERT_TRUE(c);
    const std::string big(64 << 10, 'p');  // a reply with a fragment of its own
    ASSERT_TRUE(echo_round_trip(c, big));
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) _exit(echo_round_trip(c, big) && echo_round_trip(c, "small") ? 0 : 1);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    timeval quick{3, 0};
    clnt_control(c, CLSET_TIMEOUT, reinterpret_cast<char*>(&quick));
    EXPECT_TRUE(echo_round_trip(c, big)) << "round " << round;
    clnt_destroy(c);
  }
}

// Sends raw bytes on a connection to the vRPC port (through vmmc::sockets
// when `upgraded`, so the garbage travels over VMMC), then closes it or not.
void send_raw(unsigned short port, const std::string& bytes, bool upgraded) {
  auto sock = upgraded ? vmmc::sockets::socket : ::socket;
  auto connect = upgraded ? vmmc::sockets::connect : ::connect;
  int fd = sock(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  if (upgraded)
    vmmc::sockets::write(fd, bytes.data(), bytes.size());
  else
    ASSERT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  std::this_thread::sleep_for(50ms);
  upgraded ? vmmc::sockets::close(fd) : ::close(fd);
}

std::string record(const std::string& body, bool last = true) {
  std::uint32_t h = htonl(static_cast<std::uint32_t>(body.size()) | (last ? 0x80000000u : 0));
  return std::string(reinterpret_cast<char*>(&h), 4) + body;
}

TEST_F(vrpc, malformed_calls_are_rejected_and_others_still_served) {
  CLIENT* c = clnt_vmmc_create("127.0.0.1", program, version, server_.port().vmmc);
  ASSERT_TRUE(c);
  ASSERT_TRUE(echo_round_trip(c, "before"));
  std::mt19937 random(7);
  std::string noise(5000, '\0');
  for (char& ch : noise) ch = static_cast<char>(random());
  const unsigned short port = server_.port().vmmc;
  for (bool upgraded : {false, true}) {
    send_raw(port, noise, upgraded);                                    // no framing at all
    send_raw(port, record(noise.substr(0, 40)), upgraded);              // framed garbage
    send_raw(port, record(std::string(12, '\0')), upgraded);            // a call cut short
    send_raw(port, record(noise, false).substr(0, 900), upgraded);      // a truncated fragment
    send_raw(port, std::string("\0\0\0\0", 4) + noise, upgraded);       // a zero header
    send_raw(port, record(noise.substr(0, 3)) + record(""), upgraded);  // tiny records
    EXPECT_TRUE(echo_round_trip(c, "during")) << "upgraded=" << upgraded;
  }
  // A well-formed call with garbage arguments: the server answers GARBAGE_ARGS.
  u_int bogus = 16u << 20;  // an opaque<> length far beyond the record
  EXPECT_EQ(clnt_call(c, proc_echo, proc(xdr_u_int), &bogus, proc(xdr_void), nullptr, long_wait),
            RPC_CANTDECODEARGS);
  EXPECT_TRUE(echo_round_trip(c, "after"));
  clnt_destroy(c);
}

TEST_F(vrpc, creation_errors_are_reported) {
  EXPECT_EQ(clnt_vmmc_create("no-such-host.invalid", program, version, 1), nullptr);
  EXPECT_EQ(rpc_createerr.cf_stat, RPC_UNKNOWNHOST);
  int fd = bound_socket(SOCK_DGRAM,
                        htonl(INADDR_LOOPBACK));  // a port with no TCP listener: connection refused
  sockaddr_in a{};
  socklen_t length = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &length);
  EXPECT_EQ(clnt_vmmc_create("127.0.0.1", program, version, ntohs(a.sin_port)), nullptr);
  EXPECT_EQ(rpc_createerr.cf_stat, RPC_SYSTEMERROR);
  EXPECT_EQ(rpc_createerr.cf_error.re_errno, ECONNREFUSED);
  close(fd);
}

}  // namespace
