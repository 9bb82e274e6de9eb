// Identity across TCP, where no kernel vouches for the peer (see the
// "Security model" in README.md):
//  - a context proves it is the one an address names with the address's
//    secret (the ";k=" part, which only the peers it handed its address to
//    know): HMAC over the exporter's fresh challenge;
//  - a user proves "same user" with the user key, a file only that user can
//    read (VMMC_CORE_USER_KEY; hosts that share the home directory share it).
// HMAC-SHA-256 (FIPS 180-4, RFC 2104) is written out here: a few dozen lines
// instead of a cryptographic library for one keyed hash at each TCP hello.
#include <fcntl.h>
#include <pwd.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core.h"

namespace vmmc::core::detail {

namespace {
constexpr std::array<std::uint32_t, 64> round_constants = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

std::uint32_t rotate_right(std::uint32_t x, int n) {
  return (x >> n) | (x << (32 - n));
}

class sha256 {
 public:
  void update(const std::uint8_t* data, std::size_t length) {
    for (std::size_t i = 0; i < length; ++i) {
      block_[filled_++] = data[i];
      if (filled_ == 64) {
        compress();
        filled_ = 0;
      }
    }
    bits_ += std::uint64_t{length} * 8;
  }
  digest finish() {
    const std::uint64_t bits = bits_;
    const std::uint8_t one = 0x80, zero = 0;
    update(&one, 1);
    while (filled_ != 56) update(&zero, 1);
    std::uint8_t length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<std::uint8_t>(bits >> (56 - 8 * i));
    update(length, 8);
    digest out;
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 4; ++j) out[4 * i + j] = static_cast<std::uint8_t>(h_[i] >> (24 - 8 * j));
    return out;
  }

 private:
  void compress() {
    std::uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = std::uint32_t{block_[4 * i]} << 24 | std::uint32_t{block_[4 * i + 1]} << 16 |
             std::uint32_t{block_[4 * i + 2]} << 8 | block_[4 * i + 3];
    for (int i = 16; i < 64; ++i) {
      const std::uint32_t s0 =
          rotate_right(w[i - 15], 7) ^ rotate_right(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const std::uint32_t s1 =
          rotate_right(w[i - 2], 17) ^ rotate_right(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    std::uint32_t v[8];
    std::memcpy(v, h_, sizeof v);
    for (int i = 0; i < 64; ++i) {
      const std::uint32_t e = v[4], a = v[0];
      const std::uint32_t t1 = v[7] +
                               (rotate_right(e, 6) ^ rotate_right(e, 11) ^ rotate_right(e, 25)) +
                               ((e & v[5]) ^ (~e & v[6])) + round_constants[i] + w[i];
      const std::uint32_t t2 = (rotate_right(a, 2) ^ rotate_right(a, 13) ^ rotate_right(a, 22)) +
                               ((a & v[1]) ^ (a & v[2]) ^ (v[1] & v[2]));
      std::memmove(v + 1, v, 7 * sizeof v[0]);
      v[4] += t1;
      v[0] = t1 + t2;
    }
    for (int i = 0; i < 8; ++i) h_[i] += v[i];
  }

  std::uint32_t h_[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                         0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::uint8_t block_[64] = {};
  std::size_t filled_ = 0;
  std::uint64_t bits_ = 0;
};

// The user key's file: VMMC_CORE_USER_KEY, else ~/.vmmc/user-key.
std::string user_key_path() {
  std::string path = setting_string(settings::user_key);
  if (!path.empty()) return path;
  const char* home = std::getenv("HOME");
  if (!home || !*home)
    if (const passwd* pw = ::getpwuid(::getuid())) home = pw->pw_dir;
  return home ? std::string(home) + "/.vmmc/user-key" : std::string();
}

// Reads a key file that is ours and readable by us alone.
std::optional<std::vector<std::uint8_t>> read_key(const std::string& path) {
  unique_fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  struct stat st {};
  if (!fd || ::fstat(fd.get(), &st) != 0) return std::nullopt;
  if (st.st_uid != ::getuid() || (st.st_mode & 077) != 0 || st.st_size < 16 || st.st_size > 1024) {
    VMMC_WARN("ignored the user key %s: not ours alone, or not 16 to 1024 bytes", path.c_str());
    return std::nullopt;
  }
  std::vector<std::uint8_t> key(static_cast<std::size_t>(st.st_size));
  if (::read(fd.get(), key.data(), key.size()) != static_cast<ssize_t>(key.size()))
    return std::nullopt;
  return key;
}
}  // namespace

digest hmac_sha256(std::span<const std::uint8_t> key, std::span<const std::uint8_t> message) {
  std::uint8_t block[64] = {};
  if (key.size() > 64) {
    sha256 h;
    h.update(key.data(), key.size());
    digest d = h.finish();
    std::memcpy(block, d.data(), d.size());
  } else {
    std::memcpy(block, key.data(), key.size());
  }
  std::uint8_t pad[64];
  sha256 inner, outer;
  for (int i = 0; i < 64; ++i) pad[i] = static_cast<std::uint8_t>(block[i] ^ 0x36);
  inner.update(pad, 64);
  inner.update(message.data(), message.size());
  const digest inner_digest = inner.finish();
  for (int i = 0; i < 64; ++i) pad[i] = static_cast<std::uint8_t>(block[i] ^ 0x5c);
  outer.update(pad, 64);
  outer.update(inner_digest.data(), inner_digest.size());
  return outer.finish();
}

namespace {
// label | challenge | exporter nonce (little-endian) [| uid (little-endian)]
std::vector<std::uint8_t> proof_message(std::string_view label,
                                        std::span<const std::uint8_t> challenge,
                                        std::uint64_t exporter_nonce,
                                        std::optional<std::uint32_t> uid) {
  std::vector<std::uint8_t> m(label.begin(), label.end());
  m.insert(m.end(), challenge.begin(), challenge.end());
  for (int i = 0; i < 8; ++i) m.push_back(static_cast<std::uint8_t>(exporter_nonce >> (8 * i)));
  if (uid)
    for (int i = 0; i < 4; ++i) m.push_back(static_cast<std::uint8_t>(*uid >> (8 * i)));
  return m;
}
}  // namespace

digest context_proof(std::span<const std::uint8_t> secret, std::span<const std::uint8_t> challenge,
                     std::uint64_t exporter_nonce) {
  return hmac_sha256(secret, proof_message("vmmc context", challenge, exporter_nonce, {}));
}

digest user_proof(std::span<const std::uint8_t> key, std::span<const std::uint8_t> challenge,
                  std::uint64_t exporter_nonce, std::uint32_t uid) {
  return hmac_sha256(key, proof_message("vmmc user", challenge, exporter_nonce, uid));
}

bool same_digest(const digest& a, const digest& b) {
  std::uint8_t differ = 0;  // constant time: no early exit for an attacker to time
  for (std::size_t i = 0; i < a.size(); ++i)
    differ = static_cast<std::uint8_t>(differ | (a[i] ^ b[i]));
  return differ == 0;
}

std::optional<std::vector<std::uint8_t>> user_key() {
  static std::mutex mutex;
  static std::vector<std::uint8_t> cached;  // empty until read
  std::lock_guard lock(mutex);
  if (!cached.empty()) return cached;
  const std::string path = user_key_path();
  if (path.empty()) return std::nullopt;
  auto remember = [&](std::optional<std::vector<std::uint8_t>> key) {
    if (key) cached = *key;
    return key;
  };
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) return remember(read_key(path));
  if (errno != ENOENT) return std::nullopt;
  // First use: make one, atomically (another process may race us to it).
  if (auto slash = path.rfind('/'); slash != std::string::npos && slash > 0)
    (void)::mkdir(path.substr(0, slash).c_str(), 0700);
  std::uint8_t fresh[32];
  if (::getrandom(fresh, sizeof fresh, 0) != static_cast<ssize_t>(sizeof fresh))
    return std::nullopt;
  const std::string temporary = path + "." + std::to_string(::getpid());
  {
    unique_fd fd(::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!fd || ::write(fd.get(), fresh, sizeof fresh) != static_cast<ssize_t>(sizeof fresh)) {
      (void)::unlink(temporary.c_str());
      return std::nullopt;
    }
  }
  (void)::link(temporary.c_str(), path.c_str());  // fails if another process was first
  (void)::unlink(temporary.c_str());
  return remember(read_key(path));
}

}  // namespace vmmc::core::detail
