// A shared mapping of an unlinked temporary file: memory that userfaultfd's
// write-protect mode cannot watch, for the UTLB and monitor tests.
#pragma once

#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>

namespace vmmc::test {

class file_mapping {
 public:
  explicit file_mapping(std::size_t size) : size_(size) {
    char path[] = "/tmp/vmmc_test_XXXXXX";
    fd_ = ::mkstemp(path);
    if (fd_ < 0) return;
    ::unlink(path);
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) return;
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p != MAP_FAILED) data_ = p;
  }
  ~file_mapping() {
    if (data_) ::munmap(data_, size_);
    if (fd_ >= 0) ::close(fd_);
  }
  file_mapping(const file_mapping&) = delete;
  file_mapping& operator=(const file_mapping&) = delete;

  void* data() const { return data_; }  // null if the mapping failed
  std::size_t size() const { return size_; }

 private:
  std::size_t size_;
  int fd_ = -1;
  void* data_ = nullptr;
};

}  // namespace vmmc::test
