// sockets/src/presence.h: which TCP sockets of this host belong to processes
// running vmmc, known without a byte on the connection (issue 14, item 14).
//
// Each user has one table, <stat_dir>/vmmc-presence-<uid> (mode 0644, only
// that user's processes write it), of socket cookies (SO_COOKIE: never reused
// until reboot). A vmmc process enters its listening sockets, and a client
// socket before it connects; a client marks its entry "asking" once its
// connection earned a channel. The other end finds that socket with
// sock_diag (its owner's uid and its cookie) and looks in that user's
// table: a user can vouch for its own sockets only. So a client asks only a
// listener that is entered, and a server answers only a client that asks:
// a plain peer never sees one of our bytes, and a connection that ends
// before it earned a channel costs neither end a byte or a lookup (the
// client's entry costs it a getsockopt).
//
// Entries of sockets that die with their process stay behind, harmless
// (their cookie never comes again); a full bucket takes over slots whose
// process is gone. Mixed SO_REUSEPORT groups (a vmmc and a plain process of
// the same user behind one port) are not told apart.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <cstdint>
#include <optional>

namespace vmmc::sockets::detail::presence {

// Enters the socket `fd` in our user's table; its cookie, 0 if it could not
// (no table, or the table is full). Exported, though not API, for the test
// suite's hostile and relaying peers that pose as vmmc processes.
[[gnu::visibility("default")]] std::uint64_t enter(int fd);
// Our entry `cookie` asks the other end for the upgrade (a client on this
// host whose connection earned a channel): no byte on the connection.
[[gnu::visibility("default")]] void ask(std::uint64_t cookie);
// Our entry `cookie` says the connection stays kernel TCP by our choice (we
// shut our writes down before it earned a channel, or share it since
// fork()): the server is not to take us for a plain program.
[[gnu::visibility("default")]] void decline(std::uint64_t cookie);
// Takes the cookie's entry out (0: nothing).
void remove(std::uint64_t cookie);
// The listening socket a connection to `address` (on this host) would
// reach: none (a program that accepts one connection and closes its
// listener, as for an FTP data connection, has none once its connection is
// under way), plain, or entered. Answers of the last second are reused,
// unless `fresh`.
enum class listener { none, plain, entered };
listener listener_at(const sockaddr* address, socklen_t length, bool fresh);
// A TCP socket of this host: its owner and cookie.
struct socket_id {
  uid_t uid;
  std::uint64_t cookie;
};
// The socket at the other end of a connection (on this host), given the
// connection's two addresses as this end sees them (a sock_diag lookup).
// (Exported, with entry_of, for the test suite's relay, which mirrors the
// entry of the client behind it.)
[[gnu::visibility("default")]] std::optional<socket_id> peer_socket(const sockaddr* local,
                                                                    socklen_t local_length,
                                                                    const sockaddr* peer,
                                                                    socklen_t peer_length);
// Whether that socket is entered in its owner's table, and asks or
// declined (memory only: a lookup per connection, then a load per look).
enum class entry { absent, entered, asking, declined };
[[gnu::visibility("default")]] entry entry_of(const socket_id& socket);
// The program is about to close the descriptors first..last or put other
// files in their place: our lookup socket among them is forgotten (a later
// lookup makes another).
void descriptors_closing(unsigned first, unsigned last);

}  // namespace vmmc::sockets::detail::presence
