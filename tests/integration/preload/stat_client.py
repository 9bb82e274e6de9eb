# A redis client that knows exactly how many bytes it sent and received:
# SET then GET of one value, checked, then it holds the connection open until
# <done> exists (at most 60 s) so that vmmc-stat can see it.
#   python3 stat_client.py <port> <value bytes> <done file>
import os
import socket
import sys
import time

port, size, done = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
s = socket.create_connection(("127.0.0.1", port))
value = (b"0123456789abcdef" * (size // 16 + 1))[:size]
sent = received = 0


def call(command, expected):
    global sent, received
    s.sendall(command)
    sent += len(command)
    reply = b""
    while len(reply) < len(expected):
        chunk = s.recv(len(expected) - len(reply))
        if not chunk:
            sys.exit("redis closed the connection")
        reply += chunk
    received += len(reply)
    if reply != expected:
        sys.exit("unexpected reply %r" % reply[:40])


def bulk(b):
    return b"$%d\r\n%s\r\n" % (len(b), b)


call(b"*3\r\n" + bulk(b"SET") + bulk(b"key%d" % os.getpid()) + bulk(value), b"+OK\r\n")
call(b"*2\r\n" + bulk(b"GET") + bulk(b"key%d" % os.getpid()), bulk(value))
print("ready", s.getsockname()[1], sent, received, flush=True)
deadline = time.monotonic() + 60
while not os.path.exists(done) and time.monotonic() < deadline:
    time.sleep(0.05)
s.close()
