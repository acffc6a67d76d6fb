# The README's two commands: `make bench` (build, install the competitors,
# compare) and `make test` (build release, debug and UBSan, run every test).
JOBS ?= $(shell nproc)
BENCH_ARGS ?=
# Debian's python3, where python3-matplotlib installs (not a pyenv one)
PYTHON ?= /usr/bin/python3

.PHONY: all release debug ubsan test bench bench-full deps bench-deps install clean

all: release

build/%/Makefile:
	cmake -S . -B build/$* $(CMAKE_ARGS_$*) >/dev/null

CMAKE_ARGS_release = -DCMAKE_BUILD_TYPE=Release
CMAKE_ARGS_debug = -DCMAKE_BUILD_TYPE=Debug -DHAKMEM_COUNTERS=ON
CMAKE_ARGS_ubsan = -DCMAKE_BUILD_TYPE=Debug -DHAKMEM_SANITIZE=undefined

release debug ubsan: %: build/%/Makefile
	cmake --build build/$* -j $(JOBS)

deps:
	scripts/install-deps.sh test

bench-deps:
	scripts/install-deps.sh bench

test: deps
	$(MAKE) release debug ubsan
	cd build/release && ctest --output-on-failure -j 2
	cd build/debug && ctest --output-on-failure -j 2
	cd build/ubsan && ctest --output-on-failure -j 2

bench: bench-deps release
	$(PYTHON) bench/run.py --build build/release $(BENCH_ARGS)

bench-full: bench-deps release
	$(PYTHON) bench/run.py --build build/release --full $(BENCH_ARGS)

install: release
	cmake --install build/release

clean:
	rm -rf build results
