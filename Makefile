# The README's two commands: `make bench` (build, install the competitors,
# compare) and `make test` (build release, debug, UBSan, TSan, musl and an
# aarch64 cross build, run every test; aarch64's under qemu-user).
JOBS ?= $(shell nproc)
BENCH_ARGS ?=
# Debian's python3, where python3-matplotlib installs (not a pyenv one)
PYTHON ?= /usr/bin/python3

.PHONY: all release debug ubsan tsan musl aarch64 soak fuzz long-run test bench bench-full deps bench-deps install clean options-doc

all: release

build/%/Makefile:
	cmake -S . -B build/$* $(CMAKE_ARGS_$*) >/dev/null

CMAKE_ARGS_release = -DCMAKE_BUILD_TYPE=Release
CMAKE_ARGS_debug = -DCMAKE_BUILD_TYPE=Debug -DHAKMEM_COUNTERS=ON
CMAKE_ARGS_ubsan = -DCMAKE_BUILD_TYPE=Debug -DHAKMEM_SANITIZE=undefined
# ThreadSanitizer owns malloc: hakmem keeps to its own names (hak_malloc ...)
CMAKE_ARGS_tsan = -DCMAKE_BUILD_TYPE=Debug -DHAKMEM_SANITIZE=thread -DHAKMEM_OVERRIDE=OFF -DHAKMEM_BUILD_BENCH=OFF

# musl (Debian's musl-tools): the library and the C tests, with the
# kernel's headers, which musl-gcc leaves out, from a folder of links, and
# the frame tables' search table (.eh_frame_hdr), which Debian's musl-gcc
# leaves out too and the profile's stack walk reads (Alpine's gcc writes it).
CMAKE_ARGS_musl = -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=musl-gcc -DHAKMEM_BUILD_BENCH=OFF \
  -DCMAKE_C_FLAGS="-isystem $(CURDIR)/build/musl-include" \
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--eh-frame-hdr -DCMAKE_SHARED_LINKER_FLAGS=-Wl,--eh-frame-hdr
# aarch64: a cross build (Debian's gcc-aarch64-linux-gnu), laid out by
# 64 KiB pages as on kernels that run them (RHEL's, Ampere's; qemu's own
# are 4 KiB: HAKMEM_PAGE_SIZE), whose tests run under qemu-user-static (static: a test's LD_PRELOAD reaches the program,
# not the emulator). TEST_EMULATOR tells the tests that re-run themselves
# (exec_self in tests/check.h). Under Debian 12's qemu (7.2) a forked child
# of a process of several threads cannot start a thread, so the purger
# runs inline (HAKMEM_PURGE_THREAD=0) and the fork tests' children run
# their thread's work themselves. Left out there: what measures the
# process's resident memory or the purger thread (qemu's own memory and
# threads are the process's: release_*, arena_lazyfree, memory_limit, oom,
# soak_short, mesh_soak), shell-script tests that run the programs natively (options,
# launcher, install, misuse), the latency percentiles (qemu's virtual counter
# ticks too coarsely for a malloc: profile, profile_sample_starting_purger),
# the online tuner's run (it learns from the latency and faults it measures,
# and qemu's faults of 4 KiB pages under a layout of 64 KiB are no
# machine's: tuner_evolving), and the x86-64 tools (memcheck_*,
# locked_instructions, fuzz, real programs).
AARCH64_EMULATOR = qemu-aarch64-static -L /usr/aarch64-linux-gnu
CMAKE_ARGS_aarch64 = -DCMAKE_BUILD_TYPE=Release -DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64 \
  -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++ -DHAKMEM_BUILD_BENCH=OFF \
  -DHAKMEM_PAGE_SIZE=65536 \
  "-DCMAKE_CROSSCOMPILING_EMULATOR=$(subst $(eval) ,;,$(AARCH64_EMULATOR))"
AARCH64_NOT_EMULATED = ^(release_.*|address_space|secure_address_space|arena_lazyfree|memory_limit|oom|memcheck_oom|soak_short|mesh_soak|options|launcher|install|profile|profile_sample_starting_purger|tuner_evolving|memcheck_.*|locked_instructions|secure_locked_instructions|fuzz_short|real_programs|secure_real_programs|misuse|secure_misuse)$$

MULTIARCH := $(shell gcc -print-multiarch 2>/dev/null)
build/musl/Makefile: build/musl-include/linux
build/musl-include/linux:
	mkdir -p build/musl-include
	ln -sfn /usr/include/linux build/musl-include/linux
	ln -sfn /usr/include/asm-generic build/musl-include/asm-generic
	ln -sfn /usr/include/$(MULTIARCH)/asm build/musl-include/asm

release debug ubsan tsan musl aarch64: %: build/%/Makefile
	cmake --build build/$* -j $(JOBS)

deps:
	scripts/install-deps.sh test

bench-deps:
	scripts/install-deps.sh bench

test: deps
	$(MAKE) release debug ubsan tsan musl aarch64
	cd build/release && ctest --output-on-failure -j 2
	cd build/debug && ctest --output-on-failure -j 2
	cd build/ubsan && ctest --output-on-failure -j 2
	cd build/tsan && ctest --output-on-failure
	cd build/musl && ctest --output-on-failure -j 2
	cd build/aarch64 && TEST_EMULATOR="$(AARCH64_EMULATOR)" HAKMEM_PURGE_THREAD=0 \
	  ctest --output-on-failure -j 2 -E '$(AARCH64_NOT_EMULATED)'
	@# CI shows only the tail of its log: the slowest tests of each build
	@for b in release debug ubsan tsan musl aarch64; do printf '%s, slowest:' $$b; \
	  sort -k3 -g -r build/$$b/Testing/Temporary/CTestCostData.txt | head -3 | awk '{printf " %s %.1f s;", $$1, $$3}'; echo; done

# Long runs for local use: the soak (RSS flat over SOAK_SECONDS with thread
# churn) and the fuzzer (FUZZ_SECONDS), both in minutes rather than seconds.
SOAK_SECONDS ?= 600
FUZZ_SECONDS ?= 600
soak: release
	build/release/tests/test_stress soak $(SOAK_SECONDS) 4
	build/release/tests/test_stress stress $(SOAK_SECONDS) 8

fuzz: deps
	tests/fuzz.sh $(FUZZ_SECONDS)

# The long run of docs/reliability.md: soak, fuzzer and the fault tests
# side by side for LONG_SECONDS.
LONG_SECONDS ?= 3600
long-run: deps release
	scripts/long_run.sh $(LONG_SECONDS)

bench: bench-deps release
	$(PYTHON) bench/run.py --build build/release $(BENCH_ARGS)

bench-full: bench-deps release
	$(PYTHON) bench/run.py --build build/release --full $(BENCH_ARGS)

# docs/options.md's table, printed by the library from src/options.c
options-doc: release
	scripts/options_doc.sh build/release/tests/print_options docs/options.md

install: release
	cmake --install build/release

clean:
	rm -rf build results
