#!/usr/bin/env python3
"""The layers of src/, checked from the library's object files.

A file depends on another when it uses a symbol the other defines (nm:
its undefined symbols against the others' defined ones), which counts
calls and data made from inline code in headers as well. Every link must
point down the table LAYERS or stay within a layer; the few links that
point up are listed in UPWARD with the reason, and any other fails. The
cycles left among the files are printed, and must be those named in
CYCLES (docs/architecture.md explains each).

The headers of src/ have layers too (HEADERS): a header or a .c file
includes only headers of its own layer or below, but for the includes
named in INCLUDE_UP.

    scripts/layers.py OBJDIR [SRCDIR]   check (the ctest `layers`)
    scripts/layers.py OBJDIR --graph    print each file's links, by layer
"""
import collections
import glob
import os
import re
import subprocess
import sys

# Bottom first. A file may use the files of its own layer and of the
# layers below it.
LAYERS = [
    ("settings", ["config"]),
    ("the OS contract", ["os", "limit"]),
    ("diagnostics", ["error", "fault"]),
    ("tables and options", ["options", "sizeclass", "segmap", "hooks"]),
    ("the purger", ["purger"]),
    ("tiers", ["superslab", "mesh", "arena"]),
    ("threads' heaps", ["heap", "front"]),
    ("large blocks", ["large", "bigcache"]),
    ("profiler and tuner", ["sample", "stack", "unwind", "site", "kpi", "learn"]),
    ("dispatch", ["alloc"]),
    ("introspection", ["stats", "report", "profile_report", "symtab", "lines"]),
    ("entry points", ["init", "override", "override_cxx"]),
]

# The headers' layers: each declares what the files of its layer offer.
HEADERS = {
    "base.h": 0, "config.h": 0, "os.h": 1, "error.h": 2, "layout.h": 3, "block.h": 3, "hooks.h": 3,
    "purger.h": 4, "superslab.h": 5, "mesh.h": 5, "arena.h": 5, "heap.h": 6, "large.h": 7, "profile.h": 8,
    "alloc.h": 9, "report.h": 10, "init.h": 11,
}

# Includes up the layers, by file and header, and why.
INCLUDE_UP = {
    ("*", "init.h"): "lazy initialisation (hak_ensure_init)",
    ("superslab.c", "heap.h"): "a heap's SuperSlabs are binned in the heap, which owns them",
}

# Links up the layers, by file pair: the symbols allowed and why.
UPWARD = {
    # Lazy initialisation: whichever entry point comes first (a thread's
    # first malloc reaches it through heap_thread_init) runs init.c.
    "*->init": ({"hak_init_slow", "hak_init_state"}, "lazy initialisation"),
}

# The strongly connected groups of files that may remain.
CYCLES = [
    # One tier in two files: large.c caches freed blocks in BigCache
    # (bigcache_put, bigcache_take), and BigCache evicts through large.c
    # (large_unmap).
    {"large", "bigcache"},
    # One contract in two files: os.c's mappings ask the memory limit
    # (os_memory_refuses), which reads the kernel's files through os.c.
    {"os", "limit"},
]


def layer_of():
    return {f: i for i, (_, files) in enumerate(LAYERS) for f in files}


def read_objects(objdir):
    defined, used = {}, collections.defaultdict(set)
    objects = sorted(glob.glob(os.path.join(objdir, "*.o")))
    if not objects:
        sys.exit(f"layers: no object files in {objdir}")
    for path in objects:
        name = os.path.basename(path)[:-len(".c.o")] if path.endswith(".c.o") else os.path.basename(path)[:-2]
        out = subprocess.run(["nm", path], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] in "TDBRVWC":
                defined[parts[2]] = name
            elif len(parts) == 2 and parts[0] == "U":
                used[name].add(parts[1])
    links = collections.defaultdict(lambda: collections.defaultdict(set))
    for f, symbols in used.items():
        for s in symbols:
            g = defined.get(s)
            if g and g != f:
                links[f][g].add(s)
    return sorted({os.path.basename(p)[:-len(".c.o")] for p in objects}), links


def allowed_upward(f, g, symbols):
    for key in (f"{f}->{g}", f"*->{g}"):
        if key in UPWARD and symbols <= UPWARD[key][0]:
            return True
    return False


def cycles(files, links):
    """Tarjan's strongly connected components of more than one file."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in links.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(group)

    for v in files:
        if v not in index:
            visit(v)
    return out


def include_failures(srcdir, layer):
    """Includes of src/ that point up the layers, less INCLUDE_UP."""
    failures = []
    for path in sorted(glob.glob(os.path.join(srcdir, "*.[ch]"))):
        name = os.path.basename(path)
        own = HEADERS.get(name) if name.endswith(".h") else layer.get(name[:-2])
        if own is None:
            failures.append(f"{name} is in no layer: add it to scripts/layers.py")
            continue
        with open(path) as f:
            for header in re.findall(r'^#include "([a-z_]+\.h)"', f.read(), re.M):
                if header == "hakmem.h":
                    continue
                if header not in HEADERS:
                    failures.append(f"{name} includes {header}, a header in no layer")
                elif HEADERS[header] > own and (name, header) not in INCLUDE_UP and ("*", header) not in INCLUDE_UP:
                    failures.append(f"{name} includes {header}, a layer above it")
    return failures


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    files, links = read_objects(sys.argv[1])
    layer = layer_of()
    srcdir = sys.argv[2] if len(sys.argv) > 2 and not sys.argv[2].startswith("--") else \
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    failures = include_failures(srcdir, layer)
    for f in files:
        if f not in layer:
            failures.append(f"{f}.c is in no layer: add it to LAYERS in scripts/layers.py")
    if "--graph" in sys.argv:
        for i, (title, members) in enumerate(LAYERS):
            for f in members:
                down = sorted(links.get(f, {}))
                print(f"{i:2} {title:20} {f:13} -> {', '.join(down)}")
        return
    for f in files:
        for g, symbols in sorted(links.get(f, {}).items()):
            if f in layer and g in layer and layer[g] > layer[f] and not allowed_upward(f, g, symbols):
                failures.append(f"{f}.c uses {g}.c, a layer above it: {', '.join(sorted(symbols))}")
    # Cycles through init.c are the lazy initialisation's; leave its link out.
    acyclic_links = {f: {g: s for g, s in gs.items() if not (g == "init" and allowed_upward(f, g, s))}
                     for f, gs in links.items()}
    found = cycles(files, acyclic_links)
    for group in found:
        if group not in CYCLES:
            failures.append(f"a dependency cycle not named in CYCLES: {', '.join(sorted(group))}")
    upward = sum(1 for f in files for g in links.get(f, {}) if f in layer and g in layer and layer[g] > layer[f])
    total = sum(len(gs) for gs in links.values())
    print(f"layers: {len(files)} files, {total} links between them, {upward} up the layers (named); "
          f"cycles: {'; '.join(', '.join(sorted(c)) for c in found) or 'none'}")
    for failure in failures:
        print(f"layers: FAILED: {failure}", file=sys.stderr)
    print(f"layers: {1 if not failures else 0} passed, {1 if failures else 0} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
