// nx/src/bootstrap.h: how a node learns its number, the job size and the
// other nodes' addresses, and how sleeping nodes are woken.
//
// Launch modes, chosen from the environment at the first NX call:
//   nxrun  VMMC_NX_FD/RANK/SIZE/JOB set by the launcher: an AF_UNIX socket to
//          nxrun carries one all-gather of address blobs.
//   PMIx   PMIX_RANK/PMIX_NAMESPACE set (mpirun, srun): PMIx_Put/Commit/Fence/Get.
//   alone  neither: one node.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace vmmc::nx::detail {

class bootstrap {
 public:
  virtual ~bootstrap() = default;
  long rank = 0;
  long size = 1;
  std::string job;  // unique per job, the same on every node
  std::string mode;
  // Every node passes its blob; returns all of them, indexed by rank.
  // Empty vector on failure (the reason went to stderr).
  virtual std::vector<std::string> all_gather(const std::string& mine) = 0;
  // Whether some node may be on another host (as core defines it), known
  // before the all-gather: where this node's fabric listens depends on it.
  virtual bool spans_hosts() const { return false; }
  // Called once at exit.
  virtual void finish() {}
};

// Never null; prints the reason and returns null only on a broken launch.
std::unique_ptr<bootstrap> detect_bootstrap();

// One AF_UNIX datagram socket per node in the abstract namespace, named by
// job and rank: ringing it wakes a node sleeping in poll() on fd(). Ringing
// a node on another host fails silently (callers then sleep in short naps).
class doorbell {
 public:
  doorbell(const std::string& job, long rank);
  ~doorbell();
  doorbell(const doorbell&) = delete;
  doorbell& operator=(const doorbell&) = delete;
  void ring(long rank) const;
  int fd() const { return fd_; }
  void drain() const;

 private:
  std::string job_;
  int fd_ = -1;
};

}  // namespace vmmc::nx::detail
