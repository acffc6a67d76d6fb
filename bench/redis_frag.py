#!/usr/bin/env python3
"""bench/frag.c's scenario on a real server: Debian's redis-server on
127.0.0.1 is filled with KEYS values of 100..1000 bytes, loses a random
70% of them, and is filled again up to the same payload with values of
1..4 KiB. After each phase the server idles SETTLE_MS and the figures are
read: its RSS (/proc/PID/smaps_rollup, less the RSS of the empty server
started the same way) over its own count of the bytes it holds
(`used_memory` of INFO memory, less the empty server's).

The server runs on the allocator in HAKMEM_BENCH_PRELOAD (the runner moves
its LD_PRELOAD there, so that this driver runs on the system allocator),
with every other variable of the environment. Output: "metric value" lines,
as the benchmark programs print. Usage: redis_frag.py KEYS [SETTLE_MS]
"""
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time

BATCH = 1000  # commands a pipelined round trip


def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Client:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.buf = b""

    def _line(self):
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise RuntimeError("redis closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _reply(self):
        line = self._line()
        if line[:1] == b"-":
            raise RuntimeError("redis: " + line[1:].decode())
        if line[:1] != b"$":
            return line[1:]
        n = int(line[1:])
        while len(self.buf) < n + 2:
            self.buf += self.sock.recv(1 << 16)
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def pipeline(self, commands):
        for i in range(0, len(commands), BATCH):
            chunk = commands[i:i + BATCH]
            self.sock.sendall(b"".join(chunk))
            for _ in chunk:
                self._reply()

    def info_field(self, name):
        self.sock.sendall(resp("INFO", "memory"))
        for line in self._reply().decode().splitlines():
            if line.startswith(name + ":"):
                return int(line.split(":")[1])
        raise RuntimeError(f"INFO memory has no {name}")


def value(size):
    """A value of SIZE bytes that redis keeps as a string (no integer
    encoding, no sharing)."""
    return os.urandom((size + 1) // 2).hex().encode()[:size]


def rss_bytes(pid):
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Rss:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no Rss in smaps_rollup")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(workdir):
    """The server and a client once it answers; the port is chosen here,
    and a server that cannot take it (one taken in between) is retried."""
    env = dict(os.environ)
    preload = env.pop("HAKMEM_BENCH_PRELOAD", "")
    if preload:
        env["LD_PRELOAD"] = preload
    for _ in range(5):
        port = free_port()
        server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "no", "--dir", workdir],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            if server.poll() is not None:
                break
            try:
                return server, Client(port)
            except OSError:
                time.sleep(0.02)
        server.kill()
        server.wait()
    raise RuntimeError("redis-server did not start")


def main():
    if len(sys.argv) not in (2, 3) or not shutil.which("redis-server"):
        sys.exit("usage: redis_frag.py KEYS [SETTLE_MS] (needs redis-server: apt-get install redis-server)")
    keys = int(sys.argv[1])
    settle = (int(sys.argv[2]) if len(sys.argv) > 2 else 1000) / 1000
    rng = random.Random(12345)
    with tempfile.TemporaryDirectory() as workdir:
        server, client = start_server(workdir)
        try:
            time.sleep(settle)
            base_rss, base_used = rss_bytes(server.pid), client.info_field("used_memory")

            def phase(name):
                time.sleep(settle)
                rss = rss_bytes(server.pid) - base_rss
                used = client.info_field("used_memory") - base_used
                print(f"used_mib_{name} {used / 1048576:.6g}")
                print(f"rss_mib_{name} {rss / 1048576:.6g}")
                print(f"rss_per_live_{name} {rss / used:.6g}")

            sizes = [rng.randint(100, 1000) for _ in range(keys)]
            client.pipeline([resp("SET", f"key:{i}", value(size)) for i, size in enumerate(sizes)])
            phase("filled")

            doomed = rng.sample(range(keys), keys * 7 // 10)
            client.pipeline([resp("DEL", f"key:{i}") for i in doomed])
            phase("deleted")

            # new keys up to the payload the deletion took
            wanted, commands = sum(sizes[i] for i in doomed), []
            while wanted > 0:
                size = rng.randint(1024, 4096)
                commands.append(resp("SET", f"key:{keys + len(commands)}", value(size)))
                wanted -= size
            client.pipeline(commands)
            phase("refilled")
            client.sock.sendall(resp("SHUTDOWN", "NOSAVE"))
        finally:
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


if __name__ == "__main__":
    main()
