#!/usr/bin/env python3
"""The benchmark comparison: hakmem against the system allocator, mimalloc,
jemalloc and tcmalloc, in one run.

Every benchmark program is run once per allocator per round, the allocator
chosen by LD_PRELOAD (nothing for the system allocator), with the order of
allocators rotated each round so that none always runs first or last on a
noisy machine. Figures are medians over rounds; each is also given as a
ratio to mimalloc and to the system allocator. Instruction counts come from
callgrind, which is deterministic.

Output: a markdown table on stdout, and results/<date>/ with results.csv,
summary.md and PNG charts (results/latest points at the newest).
"""
import argparse
import csv
import datetime
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBDIR = "/usr/lib/x86_64-linux-gnu" if platform.machine() == "x86_64" else "/usr/lib/aarch64-linux-gnu"

# name, Debian package, library (None: no preload)
COMPETITORS = [
    ("system", "libc6", None),
    ("mimalloc", "libmimalloc2.0", "libmimalloc.so.2"),
    ("jemalloc", "libjemalloc2", "libjemalloc.so.2"),
    ("tcmalloc", "libgoogle-perftools4", "libtcmalloc_minimal.so.4"),
]

LOWER_IS_BETTER = re.compile(r"(ns|faults|rss|overhead|instr|bytes)")


def workloads(full, thread_counts):
    """(group, name, program, args, metrics); scale depends on full."""
    k = 10 if full else 1
    w = []
    for pattern in ["lifo", "fifo", "random", "interleaved", "longlived"]:
        w.append(("tiny", f"{pattern} 16B", "tiny", [pattern, "16", str(4_000_000 * k)], ["mops"]))
    for size in [8, 16, 32, 64, 128, 256, 512, 1024]:
        w.append(("sweep", f"lifo {size}B", "tiny", ["lifo", str(size), str(3_000_000 * k)], ["mops"]))
    battle_iters = {"json": 1000, "mir": 1000, "vm": 200 * (10 if full else 1), "mixed": 1000, "buffers": 100_000, "grow": 200, "varied": 2000}
    for scenario, iters in battle_iters.items():
        w.append(("battle", scenario, "battle", [scenario, str(iters)],
                  ["median_ns", "mean_ns", "p95_ns", "p99_ns", "faults_per_iter", "rss_mib", "bigcache_hit_pct"]))
    w.append(("rss-time", "prodcons 1K..1M", "rsstime", [str(300_000 * k)],
              ["kops", "rss_warm_mib", "rss_end_mib", "rss_peak_mib", "rss_growth_mib", "faults_per_block"]))
    # a short program and an interpreter's start, a process each run
    w.append(("startup", "ls /", "startup", [str(100 * k), "/bin/ls", "/"], ["median_ns", "faults_per_run"]))
    w.append(("startup", "python3 -c pass", "startup", [str(20 * k), "/usr/bin/python3", "-c", "pass"],
              ["median_ns", "faults_per_run"]))
    counts = [1_000, 10_000, 100_000, 1_000_000]
    for kind in ["16", "uniform"]:
        # 10M blocks at full scale: 160 MB of 16 B blocks; 10M uniform ones
        # would take 5 GB per run and say nothing new.
        for n in counts + ([10_000_000] if full and kind == "16" else []):
            w.append(("memory", f"{kind} x {n}", "memory", [kind, str(n)], ["overhead_pct", "rss_delta_mib"]))
    # mid at 400 k operations a thread measured mostly the first touch of its blocks' pages
    thread_ops = {"larson": 4_000_000, "prodcons": 1_000_000, "churn": 200_000, "batch": 2_000_000, "mid": 2_000_000,
                  "mid4k": 2_000_000, "spread": 2_000_000, "big": 1_000_000, "xmalloc": 2_000_000,
                  "rptest": 1_000_000, "mstress": 1_000_000, "large": 2_000}
    for threads in thread_counts:
        for name, ops in thread_ops.items():
            ops *= k
            w.append(("threads", f"{name} T={threads}", "threads", [name, str(threads), str(ops)],
                      ["mops", "rss_mib", "rss_peak_mib"]))
    w.append(("realloc", "string-builder", "realloc", ["strings", str(2_000_000 * k)], ["mops"]))
    w.append(("realloc", "realloc cycle", "realloc", ["cycle", str(200_000 * k)], ["mops"]))
    # a store filled, 70% deleted at random, refilled with larger values;
    # the server idles a second after each phase
    frag = ["rss_per_live_filled", "rss_per_live_deleted", "rss_per_live_refilled", "rss_mib_deleted",
            "rss_mib_refilled"]
    w.append(("frag", "kv store", "frag", [str(200_000 * k), "1000"], frag + ["kops"]))
    if shutil.which("redis-server"):
        w.append(("frag", "redis-server", "redis_frag.py", [str(200_000 * k), "1000"], frag))
    else:
        print("note: redis-server missing (apt-get install redis-server); no redis fragmentation figures",
              file=sys.stderr)
    return w


def package_version(package):
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package],
                             capture_output=True, text=True, check=False)
        return out.stdout.strip() or "?"
    except FileNotFoundError:
        return "?"


def ensure_installed(package):
    """Install a missing competitor when root; else say so and go on."""
    if package_version(package) != "?":
        return True
    if os.geteuid() == 0:
        print(f"installing {package} ...", file=sys.stderr)
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        if subprocess.run(["apt-get", "install", "-y", "-q", package], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
            return True
    print(f"note: {package} is not installed (apt-get install {package}); skipping it", file=sys.stderr)
    return False


def hakmem_version():
    text = open(os.path.join(ROOT, "include", "hakmem.h")).read()
    version = re.search(r'HAKMEM_VERSION "([^"]+)"', text).group(1)
    rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    return f"{version}+{rev}" if rev else version


def allocators(build, libdir):
    found = []
    for name, package, lib in COMPETITORS:
        if lib is None:
            found.append({"name": name, "version": "glibc " + package_version(package), "env": {}})
            continue
        path = os.path.join(libdir, lib)
        if not os.path.exists(path) and not ensure_installed(package):
            continue
        if os.path.exists(path):
            found.append({"name": name, "version": package_version(package), "env": {"LD_PRELOAD": path}})
    hakmem = os.path.join(build, "libhakmem.so")
    if not os.path.exists(hakmem):
        sys.exit(f"run.py: {hakmem} not found; build with `make release` first")
    found.append({"name": "hakmem", "version": hakmem_version(), "env": {"LD_PRELOAD": hakmem}})
    # The hardened library, whose cost is bounded: the Tiny tier.
    secure = os.path.join(build, "libhakmem-secure.so")
    if os.path.exists(secure):
        found.append({"name": "hakmem-secure", "version": hakmem_version() + " hardened",
                      "env": {"LD_PRELOAD": secure}, "groups": ("tiny", "sweep", "instructions")})
    # The self-tuning policy, where a policy can matter (the battle scenarios
    # and RSS over time). A benchmark process lives seconds at most, so its
    # windows are 50 ms instead of the default second.
    found.append({"name": "hakmem-evolving", "version": hakmem_version() + " HAKMEM_MODE=evolving",
                  "env": {"LD_PRELOAD": hakmem, "HAKMEM_MODE": "evolving", "HAKMEM_TUNE_WINDOW_MS": "50"},
                  "groups": ("battle", "rss-time")})
    return found


def run_program(program, args, env):
    full_env = dict(os.environ, **env)
    command = [program] + args
    if program.endswith(".py"):  # a driver of a real server: the server runs on the allocator, not the driver
        command = [sys.executable, os.path.join(ROOT, "bench", os.path.basename(program)[len("bench_"):])] + args
        full_env["HAKMEM_BENCH_PRELOAD"] = full_env.pop("LD_PRELOAD", "")
    out = subprocess.run(command, env=full_env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"{os.path.basename(program)} {' '.join(args)} failed "
                           f"({out.returncode}): {out.stderr.strip()[:300]}")
    metrics = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            metrics[parts[0]] = float(parts[1])
    return metrics


def callgrind_instructions(program, args, env):
    with tempfile.NamedTemporaryFile(suffix=".cg") as out_file:
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_file.name}", program] + args
        res = subprocess.run(cmd, env=dict(os.environ, **env), capture_output=True, text=True, timeout=900)
    m = re.search(r"Collected : (\d+)", res.stderr)
    if not m:
        raise RuntimeError("callgrind gave no count: " + res.stderr[-300:])
    return int(m.group(1))


def instruction_counts(bench_dir, allocs):
    """Instructions per iteration: difference of two iteration counts."""
    if not shutil.which("valgrind"):
        print("note: valgrind missing (apt-get install valgrind); no instruction counts", file=sys.stderr)
        return []
    rows = []
    program = os.path.join(bench_dir, "bench_pair")
    for loop, label in [("lifo", "malloc(16)+free"), ("ring", "ring of 1000, oldest freed")]:
        for a in allocs:
            print(f"  callgrind {label} {a['name']}", file=sys.stderr)
            low = callgrind_instructions(program, [loop, "100000"], a["env"])
            high = callgrind_instructions(program, [loop, "300000"], a["env"])
            rows.append(("instructions", label, a["name"], "instr_per_iter", (high - low) / 200000))
    return rows


def fit_line(points):
    """Least squares y = a + b x: returns (a, b)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return my - b * mx, b


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "release"))
    ap.add_argument("--full", action="store_true", help="full scale: more operations, 10M blocks, 50 battle runs")
    ap.add_argument("--runs", type=int, help="rounds per figure (default 5, full 50 for battle, 10 otherwise)")
    ap.add_argument("--only", help="regular expression: run only the workloads whose group or name matches")
    ap.add_argument("--no-callgrind", action="store_true")
    ap.add_argument("--threads", default="1,2,4", help="thread counts of the threads group (default 1,2,4)")
    ap.add_argument("--libdir", default=LIBDIR, help="where the competitors' libraries are")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:VAR=VALUE[,VAR=VALUE...]",
                    help="also run hakmem with these options, as hakmem-NAME (e.g. prewarm:HAKMEM_PREWARM=1, "
                         "evolving:HAKMEM_MODE=evolving, noprofile:HAKMEM_PROFILE=0); repeatable")
    ap.add_argument("--peer", action="append", default=[], metavar="NAME=PATH",
                    help="also run the allocator library at PATH, preloaded, as NAME (any malloc replacement, "
                         "or another hakmem build); repeatable; HAKMEM_BENCH_PEERS adds more, space-separated")
    ap.add_argument("--out", default=os.path.join(ROOT, "results"))
    opts = ap.parse_args()

    build = os.path.abspath(opts.build)
    bench_dir = os.path.join(build, "bench")
    allocs = allocators(build, opts.libdir)
    for variant in opts.variant:
        name, _, assignments = variant.partition(":")
        env = dict(kv.split("=", 1) for kv in assignments.split(",") if kv)
        hakmem = next(a for a in allocs if a["name"] == "hakmem")
        allocs.append({"name": "hakmem-" + name, "version": hakmem["version"] + " " + " ".join(
            f"{k}={v}" for k, v in env.items()), "env": dict(hakmem["env"], **env)})
    for peer in opts.peer + os.environ.get("HAKMEM_BENCH_PEERS", "").split():
        name, _, path = peer.partition("=")
        if not name or not path or not os.path.exists(path):
            sys.exit(f"run.py: --peer {peer}: expected NAME=PATH of an existing library")
        if any(a["name"] == name for a in allocs):
            sys.exit(f"run.py: --peer {peer}: the name {name} is taken")
        path = os.path.abspath(path)
        allocs.append({"name": name, "version": path, "env": {"LD_PRELOAD": path}})
    thread_counts = [int(t) for t in opts.threads.split(",")]
    chosen = [w for w in workloads(opts.full, thread_counts)
              if not opts.only or re.search(opts.only, w[0] + " " + w[1])]

    def runs_for(group):
        if opts.runs:
            return opts.runs
        if opts.full:
            return 50 if group == "battle" else 10
        return 5

    samples = {}  # (group, name, alloc, metric) -> [values]
    max_runs = max(runs_for(w[0]) for w in chosen) if chosen else 0
    def runs_in(group, a):
        return group in a.get("groups", (group,))

    total = sum(runs_for(w[0]) * sum(runs_in(w[0], a) for a in allocs) for w in chosen)
    done = 0
    for rnd in range(max_runs):
        for group, name, program, args, metrics in chosen:
            if rnd >= runs_for(group):
                continue
            order = allocs[rnd % len(allocs):] + allocs[:rnd % len(allocs)]
            for a in (a for a in order if runs_in(group, a)):
                done += 1
                print(f"\r[{done}/{total}] round {rnd + 1}: {group} {name} on {a['name']}\033[K",
                      end="", file=sys.stderr, flush=True)
                got = run_program(os.path.join(bench_dir, "bench_" + program), args, a["env"])
                for metric in metrics:
                    if metric in got:  # some are hakmem's alone (bigcache_hit_pct)
                        samples.setdefault((group, name, a["name"], metric), []).append(got[metric])
    print(file=sys.stderr)

    rows = [(g, n, a, m, statistics.median(v)) for (g, n, a, m), v in samples.items()]
    if not opts.no_callgrind and (not opts.only or re.search(opts.only, "instructions")):
        rows += instruction_counts(bench_dir, [a for a in allocs if runs_in("instructions", a)])

    # memory scaling fit: RSS delta = fixed + per_alloc * N
    for kind in ["16", "uniform"]:
        for a in allocs:
            pts = [(float(n.split(" x ")[1]), v * 1048576)
                   for g, n, al, m, v in rows
                   if g == "memory" and al == a["name"] and m == "rss_delta_mib" and n.startswith(kind + " x")]
            if len(pts) >= 2:
                fixed, per = fit_line(pts)
                rows.append(("memory fit", f"{kind}: fixed bytes", a["name"], "fit_bytes", fixed))
                rows.append(("memory fit", f"{kind}: bytes per block", a["name"], "fit_bytes", per))

    # points ranking over the battle scenarios (median ns): best gets N-1,
    # N the allocators that ran the scenario; only those are ranked
    points = {}
    for scenario in ["json", "mir", "vm", "mixed"]:
        ranked = sorted((v, al) for g, n, al, m, v in rows if g == "battle" and n == scenario and m == "median_ns")
        for place, (_, al) in enumerate(ranked):
            points[al] = points.get(al, 0) + len(ranked) - 1 - place

    # what a page costs here weighs on every figure with faults (a Firecracker
    # guest charged 10 us a fault, bare metal well under one)
    try:
        page_costs = run_program(os.path.join(bench_dir, "bench_pagecost"), [], {})
    except (RuntimeError, OSError) as e:  # never lose the run's figures to it
        print(f"bench_pagecost: {e}", file=sys.stderr)
        page_costs = {}
    write_outputs(opts, allocs, rows, points, page_costs)


def fmt(v):
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}"


def write_outputs(opts, allocs, rows, points, page_costs):
    names = [a["name"] for a in allocs]
    table = {}
    for g, n, a, m, v in rows:
        table.setdefault((g, n, m), {})[a] = v
    stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H%M%S")
    out_dir = os.path.join(opts.out, stamp)
    os.makedirs(out_dir, exist_ok=True)

    lines = []
    lines.append(f"hakmem benchmark, {datetime.datetime.now():%Y-%m-%d %H:%M}, {platform.node()}, "
                 f"{os.cpu_count()} CPUs, {'full' if opts.full else 'default'} scale")
    lines.append("")
    costs = [f"{label} {page_costs[key]:,.0f} ns" for key, label in
             (("touch_ns_per_page", "a fault on first touch"), ("populate_ns_per_page", "MADV_POPULATE_WRITE"),
              ("dontneed_ns_per_page", "MADV_DONTNEED")) if key in page_costs]
    if costs:
        lines.append("Page costs on this machine (bench_pagecost, no allocator): " + ", ".join(costs) +
                     " a 4 KiB page.")
        lines.append("")
    for a in allocs:
        lines.append(f"- {a['name']}: {a['version']}")
    lines.append("")
    ratio_cols = [c for c in ("mimalloc", "system") if c in names]
    hardened = "hakmem-secure" in names  # its cost: hakmem-secure / hakmem
    header = "| group | workload | metric | " + " | ".join(names) + " | " + \
        " | ".join(f"hakmem / {c}" for c in ratio_cols) + (" | hakmem-secure / hakmem" if hardened else "") + " |"
    lines.append(header)
    lines.append("|" + "---|" * (3 + len(names) + len(ratio_cols) + hardened))
    for (g, n, m), vals in table.items():
        better = "lower" if LOWER_IS_BETTER.search(m) else "higher"
        cells = []
        valid = {k: v for k, v in vals.items() if k in names}
        best = (min if better == "lower" else max)(valid.values()) if valid else None
        for a in names:
            v = vals.get(a)
            cell = "-" if v is None else fmt(v)
            if v is not None and v == best and len(valid) > 1:
                cell = f"**{cell}**"
            cells.append(cell)
        ratios = []
        pairs = [("hakmem", c) for c in ratio_cols] + ([("hakmem-secure", "hakmem")] if hardened else [])
        for num, den in pairs:
            h, base = vals.get(num), vals.get(den)
            ratios.append(f"{h / base:.2f}" if h is not None and base else "-")
        lines.append(f"| {g} | {n} | {m} ({better} better) | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    lines.append("")
    if points:
        ranking = sorted(points.items(), key=lambda kv: -kv[1])
        lines.append("Battle points (median ns per scenario; of N allocators that ran it, the best gets N-1): " +
                     ", ".join(f"{a} {p}" for a, p in ranking))
        lines.append("")
    lines += at_a_glance(names, table)
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(out_dir, "results.csv"), "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["group", "workload", "allocator", "version", "metric", "median",
                     "ratio_to_mimalloc", "ratio_to_system"])
        versions = {a["name"]: a["version"] for a in allocs}
        for g, n, a, m, v in rows:
            vals = table[(g, n, m)]
            rm = v / vals["mimalloc"] if vals.get("mimalloc") else ""
            rs = v / vals["system"] if vals.get("system") else ""
            wr.writerow([g, n, a, versions[a], m, v, rm, rs])
    charts(out_dir, names, table)
    latest = os.path.join(opts.out, "latest")
    if os.path.islink(latest) or os.path.exists(latest):
        os.remove(latest)
    os.symlink(stamp, latest)
    print(f"\nresults: {out_dir} (results.csv, summary.md, *.png)", file=sys.stderr)


# Each workload's main figure, the one the short summary and the charts show.
PRIMARY = ("mops", "kops", "median_ns", "rss_delta_mib", "instr_per_iter", "rss_per_live_deleted",
           "rss_per_live_refilled")


def hakmem_vs_best(vals, metric):
    """hakmem's figure over the best other allocator's, as a time: below 1
    hakmem is better, whichever way the metric runs. None if either is
    missing. The other hakmem columns (variants, the hardened build) are not
    peers."""
    h = vals.get("hakmem")
    others = [v for a, v in vals.items() if not a.startswith("hakmem") and v is not None]
    if h is None or not others:
        return None
    if LOWER_IS_BETTER.search(metric):
        best = min(others)
        return h / best if best else None
    best = max(others)
    return best / h if h else None


def at_a_glance(names, table):
    """The short table a user reads first: one row a workload, its main
    figure for every allocator, the winner in bold, and hakmem against the
    best of the others with every ratio in the same direction."""
    keys = [k for k in table if k[2] in PRIMARY]
    if not keys:
        return []
    shown = [a for a in names if any(a in table[k] for k in keys)]
    out = ["At a glance: each workload's main figure; hakmem / best other below 1 means hakmem is better.", "",
           "| workload | metric | " + " | ".join(shown) + " | hakmem / best other |",
           "|" + "---|" * (3 + len(shown))]
    ratios = []
    for g, n, m in keys:
        vals = table[(g, n, m)]
        valid = {a: v for a, v in vals.items() if a in shown}
        best = (min if LOWER_IS_BETTER.search(m) else max)(valid.values())
        cells = ["-" if vals.get(a) is None else (f"**{fmt(vals[a])}**" if vals[a] == best and len(valid) > 1
                                                   else fmt(vals[a])) for a in shown]
        r = hakmem_vs_best(vals, m)
        if r:
            ratios.append(r)
        out.append(f"| {g} {n} | {m} | " + " | ".join(cells) + f" | {'-' if r is None else f'{r:.2f}'} |")
    if ratios:
        geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        out += ["", f"hakmem / best other, geometric mean over {len(ratios)} workloads: {geomean:.2f}; "
                    f"hakmem the best on {sum(r <= 1 for r in ratios)} of them."]
    return out


def charts(out_dir, names, table):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        print("note: python3-matplotlib missing; no charts", file=sys.stderr)
        return
    # Each group's main figures, one chart a group: every allocator's
    # figure as a ratio to hakmem's, drawn so that a bar below 1 is worse
    # than hakmem (time-like ratios for every metric).
    groups = {}
    for (g, n, m), vals in table.items():
        if m in PRIMARY and "hakmem" in vals:
            groups.setdefault(g, []).append((n, m))
    for g, keys in groups.items():
        shown = [a for a in names if any(a in table[(g, n, m)] for n, m in keys)]
        fig, ax = plt.subplots(figsize=(max(8, len(keys) * 0.6 * len(shown) / 4 + 3), 5))
        width = 0.8 / len(shown)
        for i, a in enumerate(shown):
            ys = []
            for n, m in keys:
                v, h = table[(g, n, m)].get(a), table[(g, n, m)]["hakmem"]
                ratio = (h / v if LOWER_IS_BETTER.search(m) else v / h) if v and h else 0
                ys.append(ratio)
            ax.bar([x + i * width for x in range(len(keys))], ys, width, label=a)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(keys))])
        # a workload with several main figures (frag) names each bar's metric
        metric_count = {n: sum(1 for k, _ in keys if k == n) for n, _ in keys}
        ax.set_xticklabels([n if metric_count[n] == 1 else f"{n}: {m}" for n, m in keys],
                           rotation=30, ha="right", fontsize=9)
        ax.set_ylabel("against hakmem (above 1: better than hakmem)")
        ax.set_title(f"{g}: " + ", ".join(sorted({m for n, m in keys})))
        ax.set_yscale("log", base=2)
        # ticks a power of two apart, half of one where the range is narrow
        # (there the axis had a single "1" and no bar could be read)
        low, high = ax.get_ylim()
        step = 0.5 if high / low <= 16 else 1
        ticks = [2 ** (k * step) for k in range(int(-16 / step), int(16 / step) + 1) if low <= 2 ** (k * step) <= high]
        ax.set_yticks(ticks)
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%.2g"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.legend(fontsize=8, ncol=2)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, f"{g.replace(' ', '_')}.png"), dpi=110)
        plt.close(fig)
    # RSS growth against the number of live blocks.
    if "memory" not in groups:
        return
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    for ax, kind in zip(axes, ["16", "uniform"]):
        for a in names:
            pts = sorted((int(n.split(" x ")[1]), vals[a]) for (g, n, m), vals in table.items()
                         if g == "memory" and m == "rss_delta_mib" and n.startswith(kind + " x") and a in vals)
            if pts:
                ax.plot([p[0] for p in pts], [max(p[1], 1e-3) for p in pts], marker="o", label=a)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("live blocks")
        ax.set_ylabel("RSS growth (MiB)")
        ax.set_title("16 B blocks" if kind == "16" else "blocks of 8..1024 B")
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "memory.png"), dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
