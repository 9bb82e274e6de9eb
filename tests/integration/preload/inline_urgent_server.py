#!/usr/bin/env python3
"""A plain TCP server that reads urgent bytes inline (SO_OOBINLINE), as some
servers do and as a peer behind a middlebox that clears the URG flag would
see them: it prints, per connection, the first bytes it received (repr), and
answers with a small HTTP/1.0 response.
  inline_urgent_server.py CONNECTIONS     (prints its port first)"""
import socket
import sys

s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_OOBINLINE, 1)
s.bind(("127.0.0.1", 0))
s.listen(8)
s.settimeout(30)
print(s.getsockname()[1], flush=True)
for _ in range(int(sys.argv[1])):
    c, _ = s.accept()
    c.setsockopt(socket.SOL_SOCKET, socket.SO_OOBINLINE, 1)
    c.settimeout(5)
    data = b""
    try:
        while b"\r\n\r\n" not in data and not data.endswith(b"\n"):
            more = c.recv(4096)
            if not more:
                break
            data += more
    except socket.timeout:
        pass
    print(repr(data[:16]), flush=True)
    c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
    c.close()
