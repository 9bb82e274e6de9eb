// sockets/src/presence.h: which TCP sockets of this host belong to processes
// running vmmc, known without a byte on the connection (issue 14, item 14).
//
// Each user has one table, <stat_dir>/vmmc-presence-<uid> (mode 0644, only
// that user's processes write it), of socket cookies (SO_COOKIE: never reused
// until reboot). A vmmc process enters its listening sockets, and a client
// socket before it connects. The other end finds that socket with sock_diag
// (its owner's uid and its cookie) and looks in that user's table: a user
// can vouch for its own sockets only. So a client offers the upgrade only to
// a listener that is entered, and a server answers only a client that is:
// a plain peer never sees one of our bytes.
//
// Entries of sockets that die with their process stay behind, harmless
// (their cookie never comes again); a full bucket takes over slots whose
// process is gone. Mixed SO_REUSEPORT groups (a vmmc and a plain process of
// the same user behind one port) are not told apart.
#pragma once

#include <sys/socket.h>

#include <cstdint>

namespace vmmc::sockets::detail::presence {

// Enters the socket `fd` in our user's table; its cookie, 0 if it could not
// (no table, or the table is full). Exported, though not API, for the test
// suite's hostile and relaying peers that pose as vmmc processes.
[[gnu::visibility("default")]] std::uint64_t enter(int fd);
// Takes the cookie's entry out (0: nothing).
void remove(std::uint64_t cookie);
// The listening socket a connection to `address` (on this host) would reach
// is entered.
bool listener_entered(const sockaddr* address, socklen_t length);
// The socket at the other end of a connection (on this host) is entered,
// given the connection's two addresses as this end sees them.
bool peer_entered(const sockaddr* local, socklen_t local_length, const sockaddr* peer,
                  socklen_t peer_length);
// The program is about to close the descriptors first..last or put other
// files in their place: our lookup socket among them is forgotten (a later
// lookup makes another).
void descriptors_closing(unsigned first, unsigned last);

}  // namespace vmmc::sockets::detail::presence
