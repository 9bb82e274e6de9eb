#!/usr/bin/env python3
"""tests/apps/echo.py: the apps matrix's scripting-runtime case, an asyncio
TCP echo server and a client (the standard library only).

  echo.py server PORT
  echo.py client PORT CONNECTIONS MIB

The client opens CONNECTIONS connections at once; each sends MIB MiB of a
pattern of its own in 64 KiB writes while reading the echo back, then shuts
its sending side down and reads to end of file. It prints
"digest <sha256 of every connection's echo, in connection order>" and
"MB/s <bytes echoed / wall time>"; exit status 1 when an echo differs from
what was sent."""
import asyncio
import hashlib
import sys
import time

CHUNK = 64 * 1024


async def serve(port):
    async def echo(reader, writer):
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(echo, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def pattern(index, mib):
    block = bytes((index * 31 + i * 7) & 0xFF for i in range(CHUNK))
    return [block[j:] + block[:j] for j in range(mib * 1024 * 1024 // CHUNK)]


async def one(port, index, mib):
    chunks = pattern(index, mib)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def send():
        for c in chunks:
            writer.write(c)
            await writer.drain()
        writer.write_eof()

    sender = asyncio.create_task(send())
    got = hashlib.sha256()
    received = 0
    while data := await reader.read(CHUNK):
        got.update(data)
        received += len(data)
    await sender
    writer.close()
    await writer.wait_closed()
    sent = hashlib.sha256(b"".join(chunks)).hexdigest()
    return got.hexdigest(), sent, received


async def client(port, connections, mib):
    t0 = time.monotonic()
    results = await asyncio.gather(*(one(port, i, mib) for i in range(connections)))
    seconds = time.monotonic() - t0
    ok = True
    for i, (got, sent, received) in enumerate(results):
        if got != sent:
            print(f"connection {i}: echo differs ({received} bytes back)", file=sys.stderr)
            ok = False
    total = sum(r[2] for r in results)
    print("digest", hashlib.sha256("".join(r[0] for r in results).encode()).hexdigest())
    print("MB/s %.1f" % (total / seconds / 1e6))
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1] == "server":
        asyncio.run(serve(int(sys.argv[2])))
    else:
        sys.exit(asyncio.run(client(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))))
