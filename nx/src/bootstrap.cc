// nx/src/bootstrap.cc: launch modes (nxrun socket, PMIx, alone) and doorbells.
#include "bootstrap.h"

#include <pmix.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include "parse.h"

#include "vmmc/core/host.h"
#include "vmmc/core/settings.h"

namespace vmmc::nx::detail {
namespace {

// What nxrun gives each node it starts (nx/nxrun.cc sets them).
// clang-format off
const core::setting launcher_fd    {"nx", "fd",    core::setting_type::integer, "-1",
  "set by nxrun: the node's socket to the launcher (-1: not started by nxrun)", true};
const core::setting launcher_rank  {"nx", "rank",  core::setting_type::integer, "0",
  "set by nxrun: the node's number", true};
const core::setting launcher_size  {"nx", "size",  core::setting_type::integer, "1",
  "set by nxrun: the number of nodes", true};
const core::setting launcher_job   {"nx", "job",   core::setting_type::string,  "0",
  "set by nxrun: its job's name", true};
const core::setting launcher_netns {"nx", "netns", core::setting_type::string,  "",
  "set by nxrun: its network namespace (a node in another one is on another host)", true};
// clang-format on
const core::setting launcher_table[] = {launcher_fd, launcher_rank, launcher_size, launcher_job,
                                        launcher_netns};
struct registrar {
  registrar() { core::register_settings(launcher_table); }
} const register_once;

class alone final : public bootstrap {
 public:
  alone() { job = "alone." + std::to_string(::getpid()), mode = "alone"; }
  std::vector<std::string> all_gather(const std::string& mine) override { return {mine}; }
};

// nxrun: each node writes <u32 length><blob>; nxrun answers every node with
// size × <u32 length><blob> in rank order (nx/nxrun.cc).
class launcher_socket final : public bootstrap {
 public:
  explicit launcher_socket(int fd) : fd_(fd) {
    rank = static_cast<int>(core::setting_integer(launcher_rank));
    size = static_cast<int>(core::setting_integer(launcher_size));
    job = "nxrun." + core::setting_string(launcher_job);
    mode = "nxrun";
  }
  ~launcher_socket() override { ::close(fd_); }
  // nxrun starts every node on its own host; a node that moved to another
  // network namespace on the way (a wrapper that enters one) is on another.
  bool spans_hosts() const override {
    return core::setting_given(launcher_netns) &&
           core::host_identity::local().network != core::setting_string(launcher_netns);
  }
  std::vector<std::string> all_gather(const std::string& mine) override {
    const std::string out = record(mine);
    if (!write_all(fd_, out.data(), out.size())) return fail();
    auto all = read_records(fd_, static_cast<std::size_t>(size));
    if (all.empty()) return fail();
    return all;
  }

 private:
  static std::vector<std::string> fail() {
    std::fprintf(stderr, "nx: lost the connection to nxrun during start-up\n");
    return {};
  }
  int fd_;
};

// Set once the node ends in order: PMIx_Finalize drops the connection too.
std::atomic<bool> pmix_finishing{false};

// Runs on PMIx's own thread when the connection to the local PMIx server
// (mpirun, or its daemon; slurmstepd under srun) breaks: the launcher is
// gone, so is the job. Open MPI's own processes end then (an MPI_Recv job
// whose mpirun got SIGKILL left nothing here); without this, a killed
// launcher left its nodes waiting for ever.
void launcher_lost(std::size_t, pmix_status_t status, const pmix_proc_t*, pmix_info_t*, std::size_t,
                   pmix_info_t*, std::size_t, pmix_event_notification_cbfunc_fn_t done,
                   void* done_data) {
  if (!pmix_finishing.load()) {
    char line[160];
    int n = std::snprintf(line, sizeof line, "nx: node %s: lost the launcher (PMIx: %s), ending\n",
                          std::getenv("PMIX_RANK") ? std::getenv("PMIX_RANK") : "?",
                          PMIx_Error_string(status));
    if (n > 0) (void)!::write(STDERR_FILENO, line, std::min<std::size_t>(n, sizeof line - 1));
    std::_Exit(1);  // peers see this node die, not end in order
  }
  if (done) done(PMIX_EVENT_NO_ACTION_TAKEN, nullptr, 0, nullptr, nullptr, done_data);
}

class pmix final : public bootstrap {
 public:
  bool init() {
    if (pmix_status_t rc = PMIx_Init(&me_, nullptr, 0); rc != PMIX_SUCCESS) {
      std::fprintf(stderr, "nx: PMIx_Init failed: %s\n", PMIx_Error_string(rc));
      return false;
    }
    // PMIx 4 names the event PMIX_ERR_LOST_CONNECTION; 2 and 3 named it
    // PMIX_ERR_LOST_CONNECTION_TO_SERVER (still defined, deprecated).
    pmix_status_t lost[] = {
#ifdef PMIX_ERR_LOST_CONNECTION
        PMIX_ERR_LOST_CONNECTION,
#endif
#ifdef PMIX_ERR_LOST_CONNECTION_TO_SERVER
        PMIX_ERR_LOST_CONNECTION_TO_SERVER,
#endif
    };
    pmix_status_t rc = PMIx_Register_event_handler(lost, std::size(lost), nullptr, 0, launcher_lost,
                                                   nullptr, nullptr);
    if (rc < 0) {
      std::fprintf(stderr, "nx: PMIx cannot watch the launcher: %s\n", PMIx_Error_string(rc));
      return false;
    }
    rank = me_.rank;
    job = std::string("pmix.") + me_.nspace;
    mode = "pmix";
    pmix_proc_t wildcard;
    PMIX_PROC_CONSTRUCT(&wildcard);
    PMIX_LOAD_PROCID(&wildcard, me_.nspace, PMIX_RANK_WILDCARD);
    pmix_value_t* v = nullptr;
    if (PMIx_Get(&wildcard, PMIX_JOB_SIZE, nullptr, 0, &v) != PMIX_SUCCESS || !v) {
      std::fprintf(stderr, "nx: PMIx has no job size\n");
      return false;
    }
    size = v->type == PMIX_UINT32 ? v->data.uint32 : static_cast<long>(v->data.size);
    PMIX_VALUE_RELEASE(v);
    v = nullptr;
    if (PMIx_Get(&wildcard, PMIX_NUM_NODES, nullptr, 0, &v) == PMIX_SUCCESS && v) {
      spans_ = v->type == PMIX_UINT32 && v->data.uint32 > 1;
      PMIX_VALUE_RELEASE(v);
    }
    return true;
  }
  std::vector<std::string> all_gather(const std::string& mine) override {
    pmix_value_t value;
    PMIX_VALUE_CONSTRUCT(&value);
    value.type = PMIX_STRING;
    value.data.string = const_cast<char*>(mine.c_str());
    if (PMIx_Put(PMIX_GLOBAL, key, &value) != PMIX_SUCCESS || PMIx_Commit() != PMIX_SUCCESS)
      return fail("put");
    pmix_info_t collect;
    bool yes = true;
    PMIX_INFO_LOAD(&collect, PMIX_COLLECT_DATA, &yes, PMIX_BOOL);
    pmix_proc_t all;
    PMIX_LOAD_PROCID(&all, me_.nspace, PMIX_RANK_WILDCARD);
    if (PMIx_Fence(&all, 1, &collect, 1) != PMIX_SUCCESS) return fail("fence");
    std::vector<std::string> out(static_cast<std::size_t>(size));
    for (long r = 0; r < size; ++r) {
      pmix_proc_t p;
      PMIX_LOAD_PROCID(&p, me_.nspace, static_cast<pmix_rank_t>(r));
      pmix_value_t* v = nullptr;
      if (PMIx_Get(&p, key, nullptr, 0, &v) != PMIX_SUCCESS || !v || v->type != PMIX_STRING)
        return fail("get");
      out[static_cast<std::size_t>(r)] = v->data.string;
      PMIX_VALUE_RELEASE(v);
    }
    return out;
  }
  bool spans_hosts() const override {
    return spans_;
  }
  void finish() override {
    pmix_finishing = true;
    PMIx_Finalize(nullptr, 0);
  }

 private:
  static constexpr const char* key = "vmmc.nx.blob";
  static std::vector<std::string> fail(const char* what) {
    std::fprintf(stderr, "nx: PMIx %s failed during start-up\n", what);
    return {};
  }
  pmix_proc_t me_{};
  bool spans_ = false;  // the launcher placed nodes on more than one node (PMIX_NUM_NODES)
};

sockaddr_un bell_address(const std::string& job, long rank, socklen_t& length) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::string name = "vmmc-nx/" + job + "/" + std::to_string(rank);
  name.resize(std::min(name.size(), sizeof a.sun_path - 2));
  std::memcpy(a.sun_path + 1, name.data(), name.size());  // abstract: leading NUL
  length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

}  // namespace

std::unique_ptr<bootstrap> detect_bootstrap() {
  if (auto fd = core::setting_integer(launcher_fd); fd >= 0)
    return std::make_unique<launcher_socket>(static_cast<int>(fd));
  if (std::getenv("PMIX_RANK") && std::getenv("PMIX_NAMESPACE")) {
    auto p = std::make_unique<pmix>();
    if (!p->init()) return nullptr;
    return p;
  }
  return std::make_unique<alone>();
}

doorbell::doorbell(const std::string& job, long rank) : job_(job) {
  fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  socklen_t length;
  sockaddr_un a = bell_address(job, rank, length);
  if (fd_ >= 0 && ::bind(fd_, reinterpret_cast<sockaddr*>(&a), length) != 0) {
    ::close(fd_);
    fd_ = -1;  // callers nap instead of sleeping on the bell
  }
}

doorbell::~doorbell() {
  if (fd_ >= 0) ::close(fd_);
}

void doorbell::ring(long rank) const {
  if (fd_ < 0) return;
  socklen_t length;
  sockaddr_un a = bell_address(job_, rank, length);
  char byte = 1;
  (void)::sendto(fd_, &byte, 1, MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&a), length);
}

void doorbell::drain() const {
  char buf[64];
  while (fd_ >= 0 && ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT) > 0) {
  }
}

}  // namespace vmmc::nx::detail
