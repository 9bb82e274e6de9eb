#!/usr/bin/env python3
"""tests/apps/banner.py: the apps matrix's server-speaks-first case (an SMTP
or SSH banner), one short connection per exchange (the standard library only).

  banner.py server PORT
  banner.py client PORT CONNECTIONS

The server greets each connection at once, reads one line and answers it
with a goodbye that echoes the line, then closes. The client makes
CONNECTIONS such connections one after another. It prints "digest <sha256 of
every answer>" and "conn/s <connections / wall time>"; exit status 1 when an
answer is not what the server should have said."""
import hashlib
import socket
import sys
import time


def read_line(c):
    line = b""
    while not line.endswith(b"\n"):
        more = c.recv(100)
        if not more:
            break
        line += more
    return line


def serve(port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(128)
    while True:
        c, _ = s.accept()
        with c:
            c.sendall(b"220 banner ready\r\n")
            c.sendall(b"221 bye " + read_line(c))


def client(port, connections):
    got = hashlib.sha256()
    start = time.perf_counter()
    for i in range(connections):
        with socket.create_connection(("127.0.0.1", port)) as c:
            greeting = read_line(c)
            line = b"QUIT %d\r\n" % i
            c.sendall(line)
            answer = b""
            while more := c.recv(100):
                answer += more
        if greeting != b"220 banner ready\r\n" or answer != b"221 bye " + line:
            print("connection %d: greeting %r, answer %r" % (i, greeting, answer))
            return 1
        got.update(greeting + answer)
    took = time.perf_counter() - start
    print("digest", got.hexdigest())
    print("conn/s %.1f" % (connections / took))
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "server":
        serve(int(sys.argv[2]))
    else:
        sys.exit(client(int(sys.argv[2]), int(sys.argv[3])))
