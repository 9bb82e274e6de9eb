// Shared memory: memfd-backed segments we own, and mappings of a peer's.
#include <dirent.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>

#include "core.h"

namespace vmmc::core::detail {

namespace {
std::size_t page_size() {
  static const std::size_t size = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return size;
}
}  // namespace

segment::~segment() {
  if (base) ::munmap(base, size);
}

result<std::shared_ptr<segment>> segment::create(std::size_t bytes, const char* name) {
  if (bytes == 0) return errc::invalid_argument;
  auto s = std::make_shared<segment>();
  s->size = (bytes + page_size() - 1) / page_size() * page_size();
  s->fd.reset(::memfd_create(name, MFD_CLOEXEC));
  if (!s->fd || ::ftruncate(s->fd.get(), static_cast<off_t>(s->size)) != 0)
    return errc::resource_exhausted;
  void* p = ::mmap(nullptr, s->size, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd.get(), 0);
  if (p == MAP_FAILED) return errc::resource_exhausted;
  s->base = static_cast<std::byte*>(p);
  return s;
}

mapping::~mapping() {
  if (base) ::munmap(base, size);
}

void mapping::retire() {
  if (!base) return;
  // MAP_FIXED replaces the range atomically for every thread of the process.
  void* p = ::mmap(base, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                   -1, 0);
  if (p == MAP_FAILED) {
    // Cannot swap (no memory for page tables): make the range inaccessible
    // rather than leave the peer's pages writable.
    (void)::mprotect(base, size, PROT_NONE);
  }
}

result<std::unique_ptr<mapping>> mapping::map(int fd, std::uint64_t offset, std::uint64_t length,
                                              bool writable) {
  // The fd's size bounds what the peer may claim: never map past its end.
  off_t end = ::lseek(fd, 0, SEEK_END);
  if (end < 0 || length == 0 || offset > static_cast<std::uint64_t>(end) ||
      length > static_cast<std::uint64_t>(end) - offset)
    return errc::protocol_error;
  auto m = std::make_unique<mapping>();
  std::uint64_t first = offset / page_size() * page_size();
  m->delta = offset - first;
  m->size = (m->delta + length + page_size() - 1) / page_size() * page_size();
  int prot = PROT_READ | (writable ? PROT_WRITE : 0);
  void* p = ::mmap(nullptr, m->size, prot, MAP_SHARED, fd, static_cast<off_t>(first));
  if (p == MAP_FAILED) return errc::resource_exhausted;
  m->base = static_cast<std::byte*>(p);
  return m;
}

std::size_t remove_stale_fabric_shm_files(const char* directory) {
  // libfabric's shm provider names its regions "<pid>:<n>:<n>" and unlinks
  // them on a clean close; a killed process leaves 16 MiB each behind. Ours
  // are the ones owned by our uid whose pid no longer exists.
  DIR* dir = ::opendir(directory);
  if (!dir) return 0;
  std::size_t removed = 0;
  const uid_t uid = ::getuid();
  while (dirent* entry = ::readdir(dir)) {
    int pid = 0, a = 0, b = 0, consumed = 0;
    if (std::sscanf(entry->d_name, "%d:%d:%d%n", &pid, &a, &b, &consumed) != 3 ||
        entry->d_name[consumed] != '\0' || pid <= 0)
      continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge
    struct stat st {};
    if (::fstatat(::dirfd(dir), entry->d_name, &st, 0) != 0 || st.st_uid != uid) continue;
    if (::unlinkat(::dirfd(dir), entry->d_name, 0) == 0) {
      ++removed;
      VMMC_DEBUG("removed stale %s/%s of a dead process", directory, entry->d_name);
    }
  }
  ::closedir(dir);
  return removed;
}

}  // namespace vmmc::core::detail
