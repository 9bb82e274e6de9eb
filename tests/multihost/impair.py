# tests/multihost/impair.py TAP1 TAP2 SEED LOSS DELAY_MS REORDER: a lossy,
# slow, reordering wire between two TAP devices (this kernel has no netem).
# Every Ethernet frame read from one device is written to the other after
# DELAY_MS, unless dropped (probability LOSS); a fraction REORDER of them is
# held 2 ms longer, so later frames overtake it. ARP and other non-IPv4
# frames are never dropped (the path stays usable, only impaired). The
# pattern is seeded: a run can be repeated. Runs until SIGTERM, then prints
# "forwarded <frames> dropped <frames> reordered <frames>".
import fcntl, heapq, os, random, select, signal, struct, sys, time

TUNSETIFF, IFF_TAP, IFF_NO_PI = 0x400454CA, 0x0002, 0x1000


def open_tap(name):
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    os.set_blocking(fd, False)
    return fd


def main():
    tap1, tap2 = sys.argv[1], sys.argv[2]
    rng = random.Random(int(sys.argv[3]))
    loss, delay, reorder = float(sys.argv[4]), float(sys.argv[5]) / 1000, float(sys.argv[6])
    a, b = open_tap(tap1), open_tap(tap2)
    other = {a: b, b: a}
    counts = {"forwarded": 0, "dropped": 0, "reordered": 0}

    def report(*_):
        print(" ".join(f"{k} {v}" for k, v in counts.items()), flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, report)
    print("ready", flush=True)
    queue, order = [], 0  # (release time, order, fd, frame)
    while True:
        timeout = max(0.0, queue[0][0] - time.monotonic()) if queue else 1.0
        readable, _, _ = select.select([a, b], [], [], timeout)
        now = time.monotonic()
        for fd in readable:
            for _ in range(64):
                try:
                    frame = os.read(fd, 65536)
                except BlockingIOError:
                    break
                ipv4 = len(frame) > 14 and frame[12:14] == b"\x08\x00"
                if ipv4 and rng.random() < loss:
                    counts["dropped"] += 1
                    continue
                held = ipv4 and rng.random() < reorder
                counts["reordered"] += held
                late = delay + (0.002 if held else 0.0)
                order += 1
                heapq.heappush(queue, (now + late, order, other[fd], frame))
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, fd, frame = heapq.heappop(queue)
            try:
                os.write(fd, frame)
                counts["forwarded"] += 1
            except OSError:
                pass  # a full device queue drops, as a wire would


if __name__ == "__main__":
    main()
