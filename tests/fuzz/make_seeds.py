#!/usr/bin/env python3
# make_seeds.py: writes the seed corpora in corpus/<target>/ (valid frames
# and records of each protocol, plus edge cases), so that they can be read
# and regenerated. Run from anywhere; rewrites only seed-* files, never the
# regress-* inputs that crashes left behind.
import os
import struct

here = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    d = os.path.join(here, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# ---- core: control frames (core/src/wire.h), address blobs, records
blob = "vmmc1;h=0123456789abcdef.4026531992;p=4242;u=1000;n=987654321;c=127.0.0.1:40000;f.shm=0a0b0c0d"
def frame(kind, body, magic=0x434D4D56, version=4, length=None):
    return struct.pack("<IHHI", magic, version, kind, len(body) if length is None else length) + body
hello = frame(1, struct.pack("<III", 1000, 4242, len(blob)) + blob.encode())
request = frame(3, struct.pack("<QII32s", 7, 1, 5, b"shm") + b"inbox")
# import_reply: ... link_id, ring_capacity, has_wake_fd, reserved
mapped_reply = frame(4, struct.pack("<QIIQIIQQQQQIIII", 7, 0, 3, 65536, 3, 1, 4096, 0, 0, 0, 0, 0, 0, 1, 0))
fabric_reply = frame(4, struct.pack("<QIIQIIQQQQQIIII", 8, 0, 3, 65536, 3, 0, 0, 0x7f0000, 42, 0x7e0000, 43, 1, 256, 0, 0))
write("core_control", "hello", hello)
write("core_control", "import", request + mapped_reply + fabric_reply + frame(8, b""))
write("core_control", "replies", frame(2, struct.pack("<II", 0, 1)) + frame(6, struct.pack("<II", 3, 0)))
write("core_control", "truncated", request[:20])
write("core_control", "bad-magic", frame(8, b"", magic=0x12345678))
write("core_control", "too-long", frame(8, b"", length=64 * 1024 + 1))

write("core_address", "full", blob)
write("core_address", "minimal", "vmmc1;h=x;p=1;u=0;n=0")
write("core_address", "two-providers", blob + ";f.tcp=c0a80001;x=later")
write("core_address", "max-u64", "vmmc1;h=x;p=4294967295;u=0;n=18446744073709551615")

def record(kind, offset, length, notify=1, magic=0x4E4D4D56):
    return struct.pack("<IIIIQQQ", magic, kind, 5, notify, offset, length, 99)
write("core_records", "inline", b"\0" + record(2, 16, 8) + struct.pack("<HB", 64, 1) + b"payload!")
write("core_records", "notify", b"\0" + record(1, 0, 4096) + struct.pack("<HB", 4096, 0))
write("core_records", "beyond", b"\0" + record(1, 4000, 200) + struct.pack("<HB", 4096, 0))
ring = struct.pack("<QQ", 3, 5) + struct.pack("<IIQQQ", 5, 0, 0, 16, 1) * 5
write("core_records", "ring", b"\1" + ring)
write("core_records", "ring-corrupt", b"\1" + struct.pack("<QQ", 0, 5000))

# ---- redirect: descriptor, area words (redirect/src/wire.h)
descriptor = "rd1f2e.00c0ffee00c0ffeea1#65536#" + blob
write("redirect_descriptor", "valid", descriptor)
write("redirect_descriptor", "smallest-ring", "a#4096#x")
write("redirect_descriptor", "largest-ring", "a#1073741824#x")
write("redirect_descriptor", "not-pow2", "a#65537#x")
write("redirect_area", "area", b"\0\0" + struct.pack("<QQQQ", 65536, 4096, 65536, 69632))
hello_rec = struct.pack("<QII", 1, len(descriptor), 3) + b"123".ljust(64, b"\0") + descriptor.encode()
write("redirect_area", "hello", b"\1" + hello_rec)
write("redirect_area", "post", b"\2" + struct.pack("<QQQI", 1000, 4096, 1500, 8192))
write("redirect_area", "report", b"\3" + struct.pack("<QQQH", 1100, 2000, 1000, 4096))

# ---- sockets: upgrade hello and records (sockets/src/wire.h)
write("sockets_upgrade", "hello", b"\0" + struct.pack("<IHH", 0x53484D56, 2, 30) + b"1234")
write("sockets_upgrade", "hello-zero", b"\0" + struct.pack("<IHH", 0x53484D56, 2, 0) + b"0007")
write("sockets_upgrade", "records", b"\1" + b"\xdb\xdb\xdc\xdb\xdd" + struct.pack("<Q", 123456) + b"tail")
write("sockets_upgrade", "end-cut", b"\1" + b"\xdb\xdd\x01\x02")

# ---- vrpc: record marking and call headers (RFC 5531)
def call(xid, arg, prog=0x20000099, vers=1, proc=1):
    body = struct.pack(">IIIIIIIIIII", xid, 0, 2, prog, vers, proc, 0, 0, 0, 0, len(arg)) + arg
    body += b"\0" * (-len(arg) % 4)
    return body
def last(body):
    return struct.pack(">I", 0x80000000 | len(body)) + body
c = call(1, b"hello")
write("vrpc_record", "call", b"\0" + last(c))
write("vrpc_record", "fragments", b"\x07" + struct.pack(">I", 12) + c[:12] + last(c[12:]) + last(call(2, b"x" * 40)))
write("vrpc_record", "zero-header", b"\0" + struct.pack(">I", 0) + last(c))
reply = struct.pack(">IIIIII", 1, 1, 0, 0, 0, 0) + struct.pack(">I", 3) + b"abc\0"
write("vrpc_record", "reply", b"\x40" + last(reply))

# ---- nx: message headers, start-up records (nx/src/wire.h, parse.h)
def nx_header(space, seq, kind, length, ptype=0):
    return b"NX" + struct.pack("<BBIqqq", 3, space, seq, kind, length, ptype)
write("nx_header", "user", nx_header(1, 0, 7, 100))
write("nx_header", "internal", nx_header(2, 5, 0x40000001, 0))
write("nx_header", "mailbox-max", nx_header(1, 1, 3, 1088 - 8 - 32))
write("nx_header", "negative", nx_header(1, 1, -1, -5))
write("nx_header", "control-ready", nx_header(3, 0, 1, 0))
write("nx_header", "control-end", nx_header(3, 7, 2, 0))
key = "0123456789abcdef0123456789abcdef"
rec = "host1 4242 0,1 %s - rd.b1#65536#%s - mb.1 10.0.0.1:40001 %s" % (blob, blob, key)
rec2 = "host2 4243 2-3 %s rd.b0#65536#%s - mb.0 - - %s" % (blob, blob, key)
write("nx_bootstrap", "two-nodes", bytes([2, 0, 2]) + struct.pack("<I", len(rec)) + rec.encode()
      + struct.pack("<I", len(rec2)) + rec2.encode())
write("nx_bootstrap", "short", bytes([2, 1, 1]) + struct.pack("<I", 100) + b"host")

# ---- sockets: a file published for vmmc-stat (sockets/src/stat_page.h, v1):
# the 248-byte header, the file's size, then 168-byte rows (row i for fd i).
def stat_header(rows, pid=4242, version=1, row_size=256):
    h = b"vmmcstat" + struct.pack("<IIIiII", version, row_size, rows, pid, 1000, 0)
    h += struct.pack("<Q", 123456) + b"redis-server *:6379".ljust(128, b"\0")
    h += struct.pack("<IIiIIIII", 3, 3, 4243, rows, 0, 2, 1, 0) + struct.pack("<6Q", 9, 8, 1, 1, 0, 4096)
    return h
def stat_row(fd, state=3, why=0, v6=False, path=b"mapped"):
    if v6:
        local = struct.pack("<HH", 10, 6379) + b"\0" * 15 + b"\1"
    else:
        local = struct.pack("<HH", 2, 6379) + bytes([127, 0, 0, 1]) + b"\0" * 12
    r = struct.pack("<IBBBBiII4xQ", 2, 1, 0, state, why, fd, 0, 1, 777)
    r += local + local + path.ljust(48, b"\0") + struct.pack("<6Q", 10, 20, 30, 40, 25, 5)
    return r
write("sockets_stat", "two-rows", stat_header(64) + struct.pack("<Q", 4096 + 64 * 256)
      + stat_row(0) + stat_row(1, state=4, why=3, path=b"tcp"))
write("sockets_stat", "v6-fabric", stat_header(64) + struct.pack("<Q", 4096 + 64 * 256)
      + stat_row(0, v6=True, path=b"fabric:tcp;ofi_rxm"))
write("sockets_stat", "short-file", stat_header(65536) + struct.pack("<Q", 4096) + stat_row(0))
write("sockets_stat", "unterminated", stat_header(1) + struct.pack("<Q", 8192)
      + stat_row(0, path=b"x" * 48, state=9, why=200))
