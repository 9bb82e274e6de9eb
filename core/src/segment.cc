// Shared memory: memfd-backed segments we own, and mappings of a peer's.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>

#include "core.h"

namespace vmmc::core::detail {

namespace {
std::size_t page_size() {
  static const std::size_t size = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return size;
}
}  // namespace

namespace {
std::size_t whole_pages(std::size_t bytes) {
  return (bytes + page_size() - 1) / page_size() * page_size();
}

// A memfd of `bytes` (whole pages) whose size no holder can ever change.
unique_fd sized_memfd(std::size_t bytes, const char* name) {
  unique_fd fd(::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd || ::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0 ||
      ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0)
    return unique_fd{};
  return fd;
}

// Moves our pages at [at, at+length), backed by [from_offset, +length) of
// memfd `from`, onto [to_offset, +length) of memfd `to`, content kept: the
// range is then backed by `to` alone. Only pages that hold data are copied
// (a channel's ring is mostly never touched: copying its holes would fault
// in every page of both memfds). mremap swaps the filled staging mapping in
// with one call, so no thread sees a hole.
bool move_pages(std::byte* at, std::size_t length, int from, std::uint64_t from_offset, int to,
                std::uint64_t to_offset) {
  void* staging = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, to,
                         static_cast<off_t>(to_offset));
  if (staging == MAP_FAILED) return false;
  const auto first = static_cast<off_t>(from_offset),
             end = static_cast<off_t>(from_offset + length);
  for (off_t data = first; data < end;) {
    data = ::lseek(from, data, SEEK_DATA);
    if (data < 0 || data >= end) break;  // ENXIO: no data after it
    off_t hole = ::lseek(from, data, SEEK_HOLE);
    if (hole < 0 || hole > end) hole = end;
    const auto skip = static_cast<std::size_t>(data - first);
    std::memcpy(static_cast<std::byte*>(staging) + skip, at + skip,
                static_cast<std::size_t>(hole - data));
    data = hole;
  }
  if (::mremap(staging, length, length, MREMAP_MAYMOVE | MREMAP_FIXED, at) == MAP_FAILED) {
    ::munmap(staging, length);
    return false;
  }
  return true;
}
}  // namespace

segment::~segment() {
  if (base) ::munmap(base, size);
}

result<std::shared_ptr<segment>> segment::create(std::size_t bytes, const char* name) {
  if (bytes == 0) return errc::invalid_argument;
  auto s = std::make_shared<segment>();
  s->used = bytes;
  s->size = whole_pages(bytes);
  s->fd = sized_memfd(s->size, name);
  if (!s->fd) return errc::resource_exhausted;
  void* p = ::mmap(nullptr, s->size, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd.get(), 0);
  if (p == MAP_FAILED) return errc::resource_exhausted;
  s->base = static_cast<std::byte*>(p);
  return s;
}

status segment::seal_for_peers(bool read_only) {
  const int seals = F_SEAL_SEAL | (read_only ? F_SEAL_FUTURE_WRITE : 0);
  std::lock_guard lock(mutex);
  if (::fcntl(fd.get(), F_ADD_SEALS, seals) != 0) return errc::system_error;
  return {};
}

std::unique_ptr<export_window> export_window::open(std::shared_ptr<segment> seg,
                                                   std::uint64_t offset, std::uint64_t length) {
  // The window's last page must hold nothing but exported bytes (or the
  // unused tail of the segment): an importer can read and write all of it.
  if (offset % page_size() != 0 || length == 0 ||
      (length % page_size() != 0 && offset + length != seg->used))
    return nullptr;
  length = whole_pages(length);
  auto w = std::unique_ptr<export_window>(new export_window);
  std::lock_guard lock(seg->mutex);
  for (auto [o, l] : seg->windows)
    if (offset < o + l && o < offset + length) return nullptr;
  if (offset != 0 || length != seg->size || !seg->windows.empty()) {
    w->own_ = sized_memfd(length, "vmmc-window");
    if (!w->own_ ||
        !move_pages(seg->base + offset, length, seg->fd.get(), offset, w->own_.get(), 0))
      return nullptr;
    // Those pages of the segment's memfd back nothing now: free them, so
    // that taking the window back copies onto holes only.
    (void)::fallocate(seg->fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                      static_cast<off_t>(offset), static_cast<off_t>(length));
  }
  seg->windows.emplace_back(offset, length);
  w->seg_ = std::move(seg);
  w->offset_ = offset;
  w->length_ = length;
  return w;
}

result<unique_fd> export_window::lend(bool read_only) {
  std::lock_guard lock(seg_->mutex);
  if (closed_) return errc::unknown_export;
  const int fd = own_ ? own_.get() : seg_->fd.get();
  if (!lent_) {
    const int seals = F_SEAL_SEAL | (read_only ? F_SEAL_FUTURE_WRITE : 0);
    if (::fcntl(fd, F_ADD_SEALS, seals) != 0) return errc::resource_exhausted;
    lent_ = true;
  }
  unique_fd copy(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (!copy) return errc::resource_exhausted;
  return copy;
}

void export_window::close() {
  if (!seg_) return;
  std::lock_guard lock(seg_->mutex);
  if (closed_) return;
  closed_ = true;
  std::erase(seg_->windows, std::pair{offset_, length_});
  std::byte* at = seg_->base + offset_;
  bool moved = true;
  if (seg_.use_count() == 1) {
    // No one else holds the segment (its mappable_buffer is gone): our pages
    // are unmapped with it and never used again, so nothing needs moving.
  } else if (own_) {
    // Back onto the segment's memfd.
    moved = move_pages(at, length_, own_.get(), 0, seg_->fd.get(), offset_);
  } else if (lent_) {
    unique_fd fresh = sized_memfd(length_, "vmmc-buffer");  // the whole segment was lent
    moved = fresh && move_pages(at, length_, seg_->fd.get(), 0, fresh.get(), 0);
    if (moved) seg_->fd = std::move(fresh);
  }
  // Out of memory for a copy: the importers keep reaching these pages.
  if (!moved)
    VMMC_ERROR("could not take back the pages of a withdrawn export: %s", std::strerror(errno));
  own_.reset();
}

mapping::~mapping() {
  if (base) ::munmap(base, size);
}

void mapping::retire() {
  if (!base) return;
  // MAP_FIXED replaces the range atomically for every thread of the process.
  void* p =
      ::mmap(base, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  if (p == MAP_FAILED) {
    // Cannot swap (no memory for page tables): make the range inaccessible
    // rather than leave the peer's pages writable.
    (void)::mprotect(base, size, PROT_NONE);
  }
}

result<std::unique_ptr<mapping>> mapping::map(int fd, std::uint64_t offset, std::uint64_t length,
                                              bool writable) {
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_SHRINK)) return errc::protocol_error;
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
