#!/usr/bin/env python3
"""Memory a gateway holds for slow clients.

Starts `tollgate serve` (the binary given), opens N connections that each send
SIZE bytes of an unfinished request head and wait, and prints the gateway's
resident memory and open sockets while they are held and after they close,
twice over (the second wave shows freed memory is reused).

    cargo build --features gateway --bin tollgate
    scripts/bench-gateway-slow-clients.py target/debug/tollgate 1000 32000 [serve flags...]
"""
import os
import socket
import subprocess
import sys
import tempfile
import time

exe, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
extra = sys.argv[4:]
rules = os.path.join(tempfile.mkdtemp(), "rules.yaml")
with open(rules, "w") as f:
    f.write("rules:\n  - name: all\n    key: global\n"
            "    quotas: [{ algorithm: gcra, limit: 100000, period: 1s }]\n")
probe = socket.socket()
probe.bind(("127.0.0.1", 0))
port = probe.getsockname()[1]
probe.close()
gw = subprocess.Popen([exe, "serve", "--config", rules, "--listen", f"127.0.0.1:{port}"] + extra,
                      stderr=subprocess.DEVNULL)


def rss_kib():
    with open(f"/proc/{gw.pid}/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS"))


def sockets():
    fds = f"/proc/{gw.pid}/fd"
    return sum(os.readlink(f"{fds}/{fd}").startswith("socket:") for fd in os.listdir(fds))


for _ in range(200):
    try:
        socket.create_connection(("127.0.0.1", port)).close()
        break
    except OSError:
        time.sleep(0.05)
before = rss_kib()
head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * size
try:
    for wave in range(2):
        conns = []
        for _ in range(n):
            c = socket.create_connection(("127.0.0.1", port))
            c.setblocking(False)
            try:
                c.send(head)
            except OSError:
                pass
            conns.append(c)
        time.sleep(1)
        held, open_sockets = rss_kib(), sockets()
        for c in conns:
            c.close()
        time.sleep(1)
        after = rss_kib()
        print(f"wave {wave}: {n} x {size} B, flags {extra}: RSS {before} KiB before, "
              f"+{held - before} KiB held ({open_sockets} sockets open), "
              f"+{after - before} KiB 1 s after closing")
finally:
    gw.terminate()
    gw.wait()
