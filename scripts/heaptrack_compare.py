#!/usr/bin/env python3
"""hakmem's heap profile against heaptrack's exact one, on real programs.

heaptrack (Debian's package) records every allocation with its stack:
the ground truth. For each program this runs it once under heaptrack,
reads heaptrack's data file (its interpreted text format: every
allocation's size and stack), then RUNS times under hakmem's default
profile (HAKMEM_STATS=json, one file per process), and compares the two
by call site: a site is the first two frames outside the allocator and
the allocation wrappers, named by function where the tools can name one
and by module where not (both read the same symbol tables). It prints,
for heaptrack's top 10 sites by bytes, each site's count and bytes and
hakmem's estimates of them (median and worst error over the runs), and
sums up: how many of heaptrack's top 10 sites are hakmem's top 10 in
every run, and the worst error of the sites above 1% of the bytes.

Programs (all by default): two_sites (4,000 blocks of 300 KB and 4
million of 24 B, compiled here), python (Debian's python3: json and a
regular expression over 200,000 dicts), git (git pack-objects, the work
of git gc, over a repository of 3,000 files), sqlite (an index over a
million rows), redis (redis-server under redis-benchmark on 127.0.0.1).
git and redis-server are multi-process or multi-threaded: heaptrack
follows the process it started, as hakmem's figures here do.

Usage: scripts/heaptrack_compare.py [--runs N] [--lib PATH] [PROGRAM...]
Needs: heaptrack, git, sqlite3, redis-server, redis-tools
(scripts/install-deps.sh profile).
"""
import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Frames that are the allocator or allocate for their caller (the report's
# default list of wrappers, src/profile_report.c, and heaptrack's own).
WRAPPERS = re.compile(
    r"^(malloc|calloc|realloc|free|posix_memalign|aligned_alloc|memalign|valloc|reallocarray|"
    r"operator new.*|_Zn[wa][mj].*|__libc_.*alloc|strdup|__strdup|strndup|__strndup|"
    r"x[a-z0-9]*alloc.*|xmemdup.*|xstrn?dup|do_xmalloc|x2?n?realloc|sh_x(m|re)alloc|"
    r"g_(try_)?(malloc|realloc).*|g_slice_alloc.*|g_strdup.*|g_memdup.*|"
    r"_?PyMem_.*|_?PyObject_(Malloc|Calloc|Realloc)|_?PyObject_GC_.*|PyType_GenericAlloc|"
    r"z(try)?(malloc|calloc|realloc).*|zstrdup|sqlite3(_malloc|_realloc|Malloc|DbMalloc|DbRealloc|Realloc).*|"
    r"heaptrack_.*|hak_.*)$")

PYTHON_WORK = r"""
import json, re
d = [{"id": i, "name": "n%d" % i, "v": [i, i * 2]} for i in range(200000)]
s = json.dumps(d)
e = json.loads(s)
print(len(re.findall(r'"n\d+"', s)), len(e))
"""

TWO_SITES = r"""
#include <stdlib.h>
__attribute__((noipa)) void *site_big(size_t n) { void *p = malloc(n); __asm__ volatile("" : "+r"(p)); return p; }
__attribute__((noipa)) void *site_small(size_t n) { void *p = malloc(n); __asm__ volatile("" : "+r"(p)); return p; }
int main(void)
{
    static void *keep[64];
    for (int i = 0; i < 4000; i++) {
        char *p = site_big(300000);
        p[0] = 1;
        free(keep[i % 64]);
        keep[i % 64] = p;
    }
    for (int i = 0; i < 4000000; i++)
        free(site_small(24));
    return 0;
}
"""

SQLITE_WORK = """
CREATE TABLE t(a INTEGER, b TEXT);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000000)
INSERT INTO t SELECT i, printf('row %d %d', i * 7919 % 1000003, i) FROM n;
CREATE INDEX t_b ON t(b);
SELECT count(*) FROM t WHERE b > 'row 5';
"""


def token(name, module):
    """A frame's name for matching: its function, else its module."""
    return name if name else "[" + os.path.basename(module or "?") + "]"


def site_of(frames):
    """The first two frames outside the allocator and its wrappers."""
    k = 0
    while k < len(frames) - 1 and frames[k][0] and WRAPPERS.match(frames[k][0]):
        k += 1
    return tuple(token(n, m) for n, m in frames[k:k + 2])


# ---- heaptrack ---------------------------------------------------------------

def heaptrack_sites(path):
    """{site: [count, bytes]} from heaptrack's data file."""
    text = subprocess.run(["zstd", "-dc", path] if path.endswith(".zst") else ["gzip", "-dc", path],
                          capture_output=True, text=True, errors="replace", check=True).stdout
    strings = [None]
    ips = [None]          # (function name, module)
    traces = [None]       # (ip index, parent trace)
    infos = []            # (size, trace)
    counts = {}
    for line in text.splitlines():
        if not line:
            continue
        kind, rest = line[0], line[2:]
        if kind == "s":
            strings.append(rest.split(" ", 1)[1] if " " in rest else "")
        elif kind == "i":
            f = rest.split()
            module = strings[int(f[1], 16)] if len(f) > 1 else None
            function = strings[int(f[2], 16)] if len(f) > 2 and int(f[2], 16) else None
            ips.append((function, module))
        elif kind == "t":
            ip, parent = rest.split()
            traces.append((int(ip, 16), int(parent, 16)))
        elif kind == "a":
            size, trace = rest.split()
            infos.append((int(size, 16), int(trace, 16)))
        elif kind == "+":
            i = int(rest, 16)
            counts[i] = counts.get(i, 0) + 1
    sites = {}
    for i, n in counts.items():
        size, trace = infos[i]
        frames = []
        while trace and len(frames) < 64:
            ip, trace = traces[trace]
            frames.append(ips[ip])
        s = sites.setdefault(site_of(frames), [0, 0])
        s[0] += n
        s[1] += n * size
    return sites


# ---- hakmem ------------------------------------------------------------------

SAMPLES = ("samples",)  # the key under which hakmem_sites counts a run's samples

def hakmem_sites(files, program_file):
    """{site: [count, bytes]} from hakmem's JSON reports. hakmem names the
    program's module as it was started (python3), heaptrack by its file
    (python3.11): program_file maps the one to the other."""
    sites = {}
    for path in files:
        with open(path) as f:
            report = json.load(f)
        started_as = report.get("program")
        for stack in report.get("stacks", []):
            frames = []
            for fr in stack["frames"]:
                m = re.match(r"^(.*)\+0x[0-9a-f]+ \((.*)\)$", fr["name"])
                if not m:
                    m = re.match(r"^()(.*)\+0x[0-9a-f]+$", fr["name"])
                name, module = (m.group(1) or None, m.group(2)) if m else (None, None)
                frames.append((name, program_file if module == started_as else module))
            s = sites.setdefault(site_of(frames), [0.0, 0.0])
            s[0] += stack["allocs"]
            s[1] += stack["bytes"]
            sites[SAMPLES] = sites.get(SAMPLES, 0) + stack["samples"]
    return sites


# ---- the programs ------------------------------------------------------------

class Program:
    """A program to profile: setup() once in its work directory, then
    run(wrap, env) as often as asked, its command line after wrap;
    binary names its file (hakmem names the program as it was started,
    heaptrack by its file)."""

    def __init__(self, work):
        self.work = work


class TwoSites(Program):
    name = "two_sites"

    def setup(self):
        src = os.path.join(self.work, "two_sites.c")
        with open(src, "w") as f:
            f.write(TWO_SITES)
        self.exe = self.binary = os.path.join(self.work, "two_sites")
        subprocess.run(["cc", "-O2", "-g", "-o", self.exe, src], check=True)

    def run(self, wrap, env):
        subprocess.run(wrap + [self.exe], env=env, check=True)


class Python(Program):
    binary = "/usr/bin/python3"
    name = "python"

    def setup(self):
        self.script = os.path.join(self.work, "work.py")
        with open(self.script, "w") as f:
            f.write(PYTHON_WORK)

    def run(self, wrap, env):
        subprocess.run(wrap + ["/usr/bin/python3", self.script], env=dict(env, PYTHONHASHSEED="0"), check=True,
                       stdout=subprocess.DEVNULL)


class Git(Program):
    binary = "git"
    name = "git"

    def setup(self):
        import random
        rng = random.Random(1)
        self.repo = os.path.join(self.work, "repo")
        os.makedirs(self.repo)
        for d in range(30):
            os.makedirs(os.path.join(self.repo, "d%d" % d))
            for i in range(100):
                words = [rng.choice(["alpha", "beta", "gamma", "delta", "eps", str(rng.randrange(1000))])
                         for _ in range(400)]
                with open(os.path.join(self.repo, "d%d" % d, "f%d.txt" % i), "w") as f:
                    f.write(" ".join(words))
        git = ["git", "-C", self.repo, "-c", "user.name=hakmem", "-c", "user.email=hakmem@localhost"]
        subprocess.run(git + ["init", "-q"], check=True)
        subprocess.run(git + ["add", "-A"], check=True)
        subprocess.run(git + ["commit", "-qm", "files"], check=True)
        for d in range(0, 30, 3):  # a second version of a tenth of the files: deltas to search
            for i in range(100):
                with open(os.path.join(self.repo, "d%d" % d, "f%d.txt" % i), "a") as f:
                    f.write(" omega %d" % i)
        subprocess.run(git + ["commit", "-qam", "more"], check=True)

    def run(self, wrap, env):
        # What git gc's repack runs, in one process (one thread: the same work each run)
        subprocess.run(wrap + ["git", "-C", self.repo, "-c", "pack.threads=1", "pack-objects", "--all", "--reflog",
                               "--non-empty", "--local", "--delta-base-offset", "-q", "--stdout"],
                       env=env, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


class Sqlite(Program):
    binary = "sqlite3"
    name = "sqlite"

    def setup(self):
        self.sql = os.path.join(self.work, "index.sql")
        with open(self.sql, "w") as f:
            f.write(SQLITE_WORK)

    def run(self, wrap, env):
        with open(self.sql) as sql:
            subprocess.run(wrap + ["sqlite3", ":memory:"], env=env, check=True, stdin=sql,
                           stdout=subprocess.DEVNULL)


class Redis(Program):
    binary = "redis-server"
    name = "redis"
    port = "16379"

    def setup(self):
        pass

    def run(self, wrap, env):
        server = subprocess.Popen(wrap + ["redis-server", "--port", self.port, "--bind", "127.0.0.1", "--save", "",
                                          "--appendonly", "no", "--daemonize", "no", "--io-threads", "1"],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cli = ["redis-cli", "-h", "127.0.0.1", "-p", self.port]
        for _ in range(200):
            if subprocess.run(cli + ["ping"], capture_output=True, text=True).stdout.strip() == "PONG":
                break
            time.sleep(0.05)
        subprocess.run(["redis-benchmark", "-h", "127.0.0.1", "-p", self.port, "-q", "-n", "100000", "-c", "10",
                        "-t", "set,get,lpush,lpop,hset,sadd", "-d", "100"], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(cli + ["shutdown", "nosave"], capture_output=True)
        server.wait(timeout=60)


PROGRAMS = [TwoSites, Python, Git, Sqlite, Redis]


def run_heaptrack(program, work):
    out = os.path.join(work, "heaptrack." + program.name)
    program.run(["sh", "-c", 'exec heaptrack -o "$0" "$@" >/dev/null 2>&1', out], dict(os.environ))
    files = glob.glob(out + "*.zst") + glob.glob(out + "*.gz")
    if not files:
        sys.exit("heaptrack_compare: heaptrack wrote no data for " + program.name)
    return heaptrack_sites(max(files, key=os.path.getsize))


def run_hakmem(program, work, lib, run):
    prefix = os.path.join(work, "hakmem.%s.%d" % (program.name, run))
    env = dict(os.environ, LD_PRELOAD=lib, HAKMEM_STATS="json", HAKMEM_PROFILE_FILE=prefix + ".%e.%p")
    started = time.time()
    program.run([], env)
    seconds = time.time() - started
    files = glob.glob(prefix + ".*")
    # The process heaptrack follows: the one started, the largest report
    main = max(files, key=lambda f: sum(s["bytes"] for s in json.load(open(f)).get("stacks", [])))
    return hakmem_sites([main], os.path.basename(os.path.realpath(shutil.which(program.binary)))), seconds


def error(estimate, truth):
    return 100.0 * (estimate / truth - 1) if truth else 0.0


def compare(program, truth, runs):
    total = sum(b for _, b in truth.values())
    top = sorted(truth, key=lambda k: -truth[k][1])[:10]
    print("\n%s: heaptrack %d calls, %.1f MiB; hakmem %d runs" % (
        program.name, sum(c for c, _ in truth.values()), total / 2**20, len(runs)))
    print("| site (first frames outside the wrappers) | share of bytes | heaptrack calls | hakmem calls, median | "
          "worst error | heaptrack MiB | hakmem MiB, median | worst error |")
    print("|---|---|---|---|---|---|---|---|")
    worst_count = worst_bytes = 0.0
    for key in top:
        count, size = truth[key]
        counts = [r.get(key, [0, 0])[0] for r in runs]
        sizes = [r.get(key, [0, 0])[1] for r in runs]
        e_count = max((error(c, count) for c in counts), key=abs)
        e_size = max((error(s, size) for s in sizes), key=abs)
        if size >= total / 100:
            worst_count = max(worst_count, abs(e_count))
            worst_bytes = max(worst_bytes, abs(e_size))
        print("| %s | %.1f%% | %d | %.0f | %+.1f%% | %.2f | %.2f | %+.1f%% |" % (
            " <- ".join(key), 100.0 * size / total, count, statistics.median(counts), e_count, size / 2**20,
            statistics.median(sizes) / 2**20, e_size))
    above = [k for k in top if truth[k][1] >= total / 100]
    ranked = [sorted((k for k in r if k != SAMPLES), key=lambda k: -r[k][1]) for r in runs]
    found = sum(1 for r in ranked if set(above) <= set(r[:10]))
    ordered = sum(1 for r in ranked if r[:len(above)] == above)
    print("%s: %d of heaptrack's top 10 sites hold more than 1%% of the bytes; all of them are in hakmem's top 10 "
          "in %d of %d runs, in heaptrack's order in %d; worst error of their bytes %.1f%%, of their counts "
          "%.1f%%; %.0f samples a run" % (program.name, len(above), found, len(runs), ordered, worst_bytes,
                                           worst_count, statistics.median(r.get(SAMPLES, 0) for r in runs)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5, help="hakmem runs per program (default 5)")
    ap.add_argument("--lib", default=os.path.join(ROOT, "build", "release", "libhakmem.so"))
    ap.add_argument("programs", nargs="*", help="of: " + ", ".join(p.name for p in PROGRAMS))
    opts = ap.parse_args()
    for tool in ("heaptrack", "zstd"):
        if not shutil.which(tool):
            sys.exit("heaptrack_compare: %s is missing (scripts/install-deps.sh profile)" % tool)
    lib = os.path.abspath(opts.lib)
    chosen = [p for p in PROGRAMS if not opts.programs or p.name in opts.programs]
    with tempfile.TemporaryDirectory(prefix="hakmem-heaptrack.") as work:
        for cls in chosen:
            program = cls(os.path.join(work, cls.name))
            os.makedirs(program.work)
            program.setup()
            started = time.time()
            truth = run_heaptrack(program, program.work)
            heaptrack_seconds = time.time() - started
            runs, seconds = [], []
            for run in range(opts.runs):
                sites, s = run_hakmem(program, program.work, lib, run)
                runs.append(sites)
                seconds.append(s)
            compare(program, truth, runs)
            print("%s: %.2f s a run under hakmem (median), %.2f s under heaptrack" % (
                program.name, statistics.median(seconds), heaptrack_seconds))


if __name__ == "__main__":
    main()
