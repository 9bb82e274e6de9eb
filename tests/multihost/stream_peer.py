# tests/multihost/stream_peer.py: one end of a checksummed one-way stream.
#
#   reader ADDRESS PORT            accepts one connection, reads to the end,
#                                  prints "end <bytes> <sha256>" or
#                                  "error <errno name> <bytes> <sha256>"
#   writer ADDRESS PORT BYTES RATE sends BYTES of a seeded stream at RATE
#                                  bytes/s (256 KiB pieces), prints
#                                  "sent <bytes>" after every piece the
#                                  kernel (or vmmc) accepted, then shuts its
#                                  side, waits for the reader's end and prints
#                                  "done <bytes> <sha256>"; "error ..." as above.
#
# The stream is random.Random(7).randbytes in pieces, so the reader's bytes
# can be checked as a prefix of what the writer would have sent.
# With STREAM_PEER_TIMEOUTS=1 in the environment both ends ask the kernel to
# give up on a silent peer: TCP_USER_TIMEOUT 3 s and keepalive probes every
# second from the first idle second, 3 unanswered ones ending it.
import errno, hashlib, random, socket, sys, time

PIECE = 256 << 10


def stream_pieces(total):
    rng = random.Random(7)
    while total > 0:
        n = min(PIECE, total)
        yield rng.randbytes(n)
        total -= n


def say(*words):
    print(*words, flush=True)


def error_name(e):
    return errno.errorcode.get(e.errno, str(e.errno)) if e.errno else type(e).__name__


def timeouts(conn):
    import os
    if os.environ.get("STREAM_PEER_TIMEOUTS") != "1":
        return
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 3000)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in ((socket.TCP_KEEPIDLE, 1), (socket.TCP_KEEPINTVL, 1), (socket.TCP_KEEPCNT, 3)):
        conn.setsockopt(socket.IPPROTO_TCP, option, value)


def reader(address, port):
    listener = socket.create_server((address, port))
    say("listening")
    conn, _ = listener.accept()
    timeouts(conn)
    got, digest = 0, hashlib.sha256()
    try:
        while True:
            chunk = conn.recv(1 << 20)
            if not chunk:
                say("end", got, digest.hexdigest())
                break
            digest.update(chunk)
            got += len(chunk)
    except OSError as e:
        say("error", error_name(e), got, digest.hexdigest())
    conn.close()


def writer(address, port, total, rate):
    conn = socket.create_connection((address, port), timeout=120)
    conn.settimeout(None)
    timeouts(conn)
    sent, digest, start = 0, hashlib.sha256(), time.monotonic()
    try:
        for piece in stream_pieces(total):
            conn.sendall(piece)
            sent += len(piece)
            digest.update(piece)
            say("sent", sent)
            ahead = sent / rate - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1)
        say("done", sent, digest.hexdigest())
    except OSError as e:
        say("error", error_name(e), sent, digest.hexdigest())
    conn.close()


if __name__ == "__main__":
    role, address, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if role == "reader":
        reader(address, port)
    else:
        writer(address, port, int(sys.argv[4]), int(sys.argv[5]))
