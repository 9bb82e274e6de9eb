// record_stream: RPC record marking over a vmmc::sockets descriptor, as an
// XDR stream (see vrpc_impl.h).
#include <arpa/inet.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <iterator>

#include "vmmc/sockets/socket.h"
#include "vrpc_impl.h"

namespace vmmc::vrpc::detail {

namespace {
constexpr std::size_t buffer_bytes = 64 * 1024;
// Gets and puts at least this large bypass the buffers: the bytes go between
// the connection and the caller's memory directly.
constexpr std::size_t direct_min = 16 * 1024;
constexpr std::uint32_t last_bit = 0x80000000u;
// What a read at a record's start takes at most (see read_limit).
constexpr std::size_t first_read_bytes = 512;
// The most one write takes over kernel TCP (see write_all).
constexpr std::size_t kernel_write_max = std::size_t{1} << 20;

record_stream* self(XDR* xdrs) {
  return static_cast<record_stream*>(xdrs->x_private);
}

bool_t get_long(XDR* xdrs, long* value) {
  std::uint32_t v;
  if (std::int32_t* p = self(xdrs)->inline_get(4))
    std::memcpy(&v, p, 4);
  else if (!self(xdrs)->get(reinterpret_cast<char*>(&v), 4))
    return FALSE;
  *value = static_cast<long>(static_cast<std::int32_t>(ntohl(v)));
  return TRUE;
}

bool_t put_long(XDR* xdrs, const long* value) {
  std::uint32_t v = htonl(static_cast<std::uint32_t>(*value));
  if (std::int32_t* p = self(xdrs)->inline_put(4)) {
    std::memcpy(p, &v, 4);
    return TRUE;
  }
  return self(xdrs)->put(reinterpret_cast<const char*>(&v), 4);
}

bool_t get_bytes(XDR* xdrs, char* data, u_int length) {
  return self(xdrs)->get(data, length);
}
bool_t put_bytes(XDR* xdrs, const char* data, u_int length) {
  return self(xdrs)->put(data, length);
}
u_int get_position(XDR* xdrs) {
  return self(xdrs)->position();
}
bool_t set_position(XDR*, u_int) {
  return FALSE;
}
int32_t* inline_bytes(XDR* xdrs, u_int length) {
  if (xdrs->x_op == XDR_ENCODE) return self(xdrs)->inline_put(length);
  if (xdrs->x_op == XDR_DECODE) return self(xdrs)->inline_get(length);
  return nullptr;
}
void destroy(XDR*) {}
bool_t control(XDR*, int, void*) {
  return FALSE;
}

const XDR::xdr_ops record_ops = {get_long,     put_long,     get_bytes, put_bytes, get_position,
                                 set_position, inline_bytes, destroy,   control};
}  // namespace

record_stream::record_stream(int fd) : fd_(fd), in_(buffer_bytes), out_(buffer_bytes) {
  for (XDR* x : {&in_xdr_, &out_xdr_}) {
    x->x_ops = &record_ops;
    x->x_private = this;
  }
  in_xdr_.x_op = XDR_DECODE;
  out_xdr_.x_op = XDR_ENCODE;
}

bool record_stream::fail(failure f, int error_number) {
  failure_ = f;
  errno_ = error_number;
  return false;
}

// ------------------------------------------------------------------ decoding

// A read never takes bytes of a fragment it may not need to buffer: inside a
// record it stops at the current fragment's end plus the next header, so a
// large fragment after it is read straight into the caller's memory; at a
// record's start it takes what a small call or reply needs (what a sender
// puts before a large value's own fragment), so at most that much of a large
// value is copied twice. Over kernel TCP a read costs more than a copy: there
// a record's start takes what the buffer holds, as libtirpc's xdrrec does.
std::size_t record_stream::read_limit() {
  std::size_t room = in_.size() - in_end_;
  if (in_record_ && fragment_left_ > buffered())
    return std::min(room, fragment_left_ - buffered() + 4);
  return path() == path_kind::kernel_tcp ? room : std::min(room, first_read_bytes);
}

// Decided once the connection is: a plain one (or one the sockets layer does
// not manage) stays on kernel TCP for good; one on VMMC stays there (if a fork
// reverts it later, reads and writes are only less well sized).
record_stream::path_kind record_stream::path() {
  if (path_ == path_kind::undecided) {
    auto info = sockets::describe(fd_);
    if (!info || info->plain)
      path_ = path_kind::kernel_tcp;
    else if (info->accelerated)
      path_ = path_kind::vmmc;
  }
  return path_;
}

bool record_stream::fill() {
  if (in_pos_ == in_end_) {
    in_pos_ = in_end_ = 0;
  } else if (in_end_ == in_.size()) {
    std::memmove(in_.data(), in_.data() + in_pos_, in_end_ - in_pos_);
    in_end_ -= in_pos_;
    in_pos_ = 0;
  }
  while (true) {
    ssize_t n = sockets::read(fd_, in_.data() + in_end_, read_limit());
    if (n > 0) {
      in_end_ += static_cast<std::size_t>(n);
      return true;
    }
    if (n == 0) return fail(failure::end_of_stream, 0);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return fail(failure::timed_out, errno);
    return fail(errno == ECONNRESET ? failure::end_of_stream : failure::io, errno);
  }
}

long record_stream::try_fill() {
  if (in_pos_ == in_end_) in_pos_ = in_end_ = 0;
  if (in_end_ == in_.size()) return static_cast<long>(buffered());
  ssize_t n = sockets::recv(fd_, in_.data() + in_end_, read_limit(), MSG_DONTWAIT);
  if (n > 0) in_end_ += static_cast<std::size_t>(n);
  return n;
}

// Over VMMC one MSG_WAITALL read lets the sockets layer place a large
// value straight into `data`; over kernel TCP a long MSG_WAITALL read
// holds back the window updates (16 MiB results came at 0.91x libtirpc's
// speed across hosts), so there each read takes what has arrived.
bool record_stream::read_direct(char* data, std::size_t length) {
  const int flags = path() == path_kind::kernel_tcp ? 0 : MSG_WAITALL;
  std::size_t done = 0;
  while (done < length) {
    ssize_t n = sockets::recv(fd_, data + done, length - done, flags);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0) return fail(failure::end_of_stream, 0);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return fail(failure::timed_out, errno);
    return fail(errno == ECONNRESET ? failure::end_of_stream : failure::io, errno);
  }
  return true;
}

bool record_stream::next_fragment() {
  if (last_fragment_) return fail(failure::short_record, 0);
  while (buffered() < 4)
    if (!fill()) return false;
  std::uint32_t header;
  std::memcpy(&header, in_.data() + in_pos_, 4);
  in_pos_ += 4;
  header = ntohl(header);
  // A zero header (an empty fragment that is not the last) is never sent by
  // a sane peer; libtirpc rejects it too.
  if (header == 0) return fail(failure::protocol, 0);
  last_fragment_ = header & last_bit;
  fragment_left_ = header & ~last_bit;
  return true;
}

bool record_stream::begin_record() {
  if (in_record_ && !skip_record()) return false;
  in_record_ = true;
  fragment_left_ = 0;
  last_fragment_ = false;
  return true;
}

bool record_stream::skip_record() {
  while (in_record_) {
    if (fragment_left_ == 0) {
      if (last_fragment_) {
        in_record_ = false;
        break;
      }
      if (!next_fragment()) return false;
      continue;
    }
    if (buffered() == 0 && !fill()) return false;
    std::size_t n = std::min(fragment_left_, buffered());
    in_pos_ += n;
    fragment_left_ -= n;
  }
  return true;
}

bool record_stream::get(char* data, std::size_t length) {
  position_ += static_cast<std::uint32_t>(length);
  while (length > 0) {
    if (fragment_left_ == 0) {
      if (!next_fragment()) return false;
      continue;
    }
    std::size_t want = std::min(length, fragment_left_);
    if (buffered() > 0) {
      std::size_t n = std::min(want, buffered());
      std::memcpy(data, in_.data() + in_pos_, n);
      in_pos_ += n, fragment_left_ -= n, data += n, length -= n;
    } else if (want >= direct_min) {
      if (!read_direct(data, want)) return false;
      fragment_left_ -= want, data += want, length -= want;
    } else if (!fill()) {
      return false;
    }
  }
  return true;
}

std::int32_t* record_stream::inline_get(std::size_t length) {
  if (!in_record_) return nullptr;
  if (fragment_left_ == 0 && !last_fragment_ && buffered() >= 4 && !next_fragment()) return nullptr;
  if (fragment_left_ < length || buffered() < length) return nullptr;
  auto* p = reinterpret_cast<std::int32_t*>(in_.data() + in_pos_);
  in_pos_ += length;
  fragment_left_ -= length;
  position_ += static_cast<std::uint32_t>(length);
  return p;
}

// ------------------------------------------------------------------ encoding

bool record_stream::write_all(iovec* iov, int count) {
  // Over kernel TCP one write of many MiB holds the socket while it copies,
  // and the peer's acknowledgements wait behind it: writes there take at
  // most kernel_write_max bytes.
  const std::size_t most = path() == path_kind::kernel_tcp ? kernel_write_max : SIZE_MAX;
  while (count > 0) {
    iovec part[4];
    std::size_t parts = 0, total = 0;
    for (int k = 0; k < count && parts < std::size(part) && total < most; ++k) {
      const std::size_t take = std::min(iov[k].iov_len, most - total);
      part[parts++] = {iov[k].iov_base, take};
      total += take;
    }
    msghdr m{};
    m.msg_iov = part;
    m.msg_iovlen = parts;
    // No MSG_NOSIGNAL: libtirpc writes with write(2), so a peer that reset
    // the connection raises SIGPIPE, and a program that relies on (or
    // handles) that must see it under vRPC too.
    ssize_t n = sockets::sendmsg(fd_, &m, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return fail(failure::timed_out, errno);
      return fail(failure::io, errno);
    }
    auto left = static_cast<std::size_t>(n);
    while (count > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov, --count;
    }
    if (count > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return true;
}

// A record goes out in one write where it can: a large put is held (no
// staging copy) with the buffered bytes before it as a fragment of their
// own, and the bytes after it start a new fragment behind them in the
// buffer; all of it leaves together when the buffer is full, the next large
// put comes, or the record ends. (Writing the bytes before a large value at
// once cost a second system call and a second segment per call: a 16 KiB
// argument across hosts went 0.8x libtirpc's speed.)
//
// A record ends in a fragment with data, as libtirpc's own ends it: an
// empty last fragment is legal, but a libtirpc peer reads it only at its
// next record, and a plain client that forked and shares the connection
// with its child then loses its framing (the child took the header).
bool record_stream::flush_fragment(bool last) {
  const bool current_data = out_len_ - current_ > 4;
  std::uint32_t held_header =
      htonl(static_cast<std::uint32_t>(held_len_) | (last && !current_data ? last_bit : 0));
  std::uint32_t header =
      htonl(static_cast<std::uint32_t>(out_len_ - current_ - 4) | (last ? last_bit : 0));
  std::memcpy(out_.data() + current_, &header, 4);
  iovec iov[4];
  int count = 0;
  if (current_ > 0) iov[count++] = {out_.data(), current_};  // the fragment before held_
  if (held_) {
    iov[count++] = {&held_header, 4};
    iov[count++] = {const_cast<char*>(held_), held_len_};
  }
  // Never an empty fragment but a last one that has nothing before it.
  if (current_data || (last && count == 0))
    iov[count++] = {out_.data() + current_, out_len_ - current_};
  held_ = nullptr;
  held_len_ = 0;
  current_ = 0;
  out_len_ = 4;
  return count == 0 || write_all(iov, count);
}

bool record_stream::put(const char* data, std::size_t length) {
  position_ += static_cast<std::uint32_t>(length);
  if (length >= direct_min && length < last_bit) {
    // One value held at a time; the buffered bytes before it become a
    // fragment of their own (there must be room for the next one's header).
    if (held_ || out_len_ + 4 > out_.size()) {
      if (!flush_fragment(false)) return false;
    }
    if (out_len_ - current_ > 4) {
      std::uint32_t header = htonl(static_cast<std::uint32_t>(out_len_ - current_ - 4));
      std::memcpy(out_.data() + current_, &header, 4);
      current_ = out_len_;
      out_len_ += 4;
    }
    held_ = data;
    held_len_ = length;
    return true;
  }
  while (length > 0) {
    if (out_len_ == out_.size() && !flush_fragment(false)) return false;
    std::size_t n = std::min(length, out_.size() - out_len_);
    std::memcpy(out_.data() + out_len_, data, n);
    out_len_ += n, data += n, length -= n;
  }
  return true;
}

std::int32_t* record_stream::inline_put(std::size_t length) {
  if (out_.size() - out_len_ < length) return nullptr;
  auto* p = reinterpret_cast<std::int32_t*>(out_.data() + out_len_);
  out_len_ += length;
  position_ += static_cast<std::uint32_t>(length);
  return p;
}

bool record_stream::end_record() {
  return flush_fragment(true);
}

// ------------------------------------------------------------------ helpers

bool set_io_timeout(int fd, int milliseconds) {
  timeval tv{milliseconds / 1000, (milliseconds % 1000) * 1000};
  return sockets::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0 &&
         sockets::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) == 0;
}

std::string path_of(int fd) {
  auto info = sockets::describe(fd);
  return info && info->accelerated ? info->path : std::string("tcp");
}

}  // namespace vmmc::vrpc::detail
