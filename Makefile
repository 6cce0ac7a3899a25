# torchneuron_jit — `make demo` runs the main job, `make test` runs every test.
# Both install what they need first (tools/deps.sh: idempotent, checks real state).

PYTHON := $(shell tools/python.sh)
TCC_DIR := build/tcc
CC ?= gcc
CFLAGS_C := -std=c11 -Wall -Wextra -Werror -O2 -g -fopenmp-simd -D_GNU_SOURCE -Icsrc -I$(TCC_DIR)/include
# libc before mimalloc: Debian's libmimalloc.so exports malloc, and the first
# library that defines it wins for the whole test process.
# (check's flags are asked of pkg-config in the recipe: it may only exist
# once `deps` has run, after make has read this file)
LDLIBS_CORE := -Wl,--no-as-needed -lc -llmdb -lxxhash -lmimalloc -lmvec $(TCC_DIR)/lib/libtcc.a
LDLIBS_C := $(LDLIBS_CORE) $$(pkg-config --libs check) -ldl -lpthread -lm

CORE_SRC := csrc/tn_config.c csrc/tn_stats.c csrc/tn_yield.c csrc/graph/graph.c csrc/graph/encode.c csrc/cache/cache.c \
            csrc/neuron_backend/tcc.c csrc/neuron_backend/runtime.c csrc/neuron_backend/codegen.c \
            csrc/neuron_backend/pool.c csrc/neuron_backend/launch.c csrc/neuron_backend/gemm.c \
            csrc/neuron_backend/plan.c csrc/neuron_backend/executor.c \
            csrc/neuron_backend/tier2.c csrc/fallback/fallback.c csrc/lowering/fuse.c
CORE_HDR := $(wildcard csrc/*.h csrc/*/*.h)
C_SUITES := graph cache tcc fuse plan tier2 yield
C_TESTS := $(addprefix build/tests/test_,$(C_SUITES))
# AddressSanitizer and UndefinedBehaviorSanitizer (make test-asan): any finding fails
ASAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
ASAN_TESTS := $(addprefix build/asan/test_,$(C_SUITES))

# libFuzzer targets (tests/fuzz/README.md), built with clang and ASan/UBSan:
# make fuzz-c SECONDS=N runs each for N seconds (both at once); make test runs 10 s each.
FUZZ_CC := clang-14
FUZZ_TARGETS := graph cache
FUZZ_BINS := $(addprefix build/fuzz/fuzz_,$(FUZZ_TARGETS))
SECONDS ?= 60
LDLIBS_FUZZ := $(LDLIBS_CORE) -ldl -lpthread -lm

.PHONY: all deps build demo bench bench-quick test test-long test-c test-python test-asan fuzz-c fuzz-deps clean

all: build

deps:
	@tools/deps.sh apt
	@tools/deps.sh tcc $(TCC_DIR)
	@tools/deps.sh python $(PYTHON)

# The editable install registers the package (and its torch_dynamo_backends
# entry point) for this checkout; it is redone only when the installed
# package is missing or points at another checkout.
build: deps
	$(PYTHON) setup.py -q build_ext --inplace
	@(cd / && $(PYTHON) -c "import os, sys, torchneuron_jit as t; sys.exit(os.path.dirname(t.__file__) != '$(CURDIR)/torchneuron_jit')") 2>/dev/null \
	  || $(PYTHON) -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v -i warning || true

# the core is compiled once for every suite (each suite compiling it again took 18 s)
CORE_OBJ := $(patsubst csrc/%.c,build/core/%.o,$(CORE_SRC))
build/core/%.o: csrc/%.c $(CORE_HDR) | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_C) -c -o $@ $<

build/tests/test_%: tests/c/test_%.c tests/c/tn_check.h $(CORE_OBJ) | deps
	@mkdir -p build/tests
	$(CC) $(CFLAGS_C) -o $@ $< $(CORE_OBJ) $(LDLIBS_C)

# the suites build two at a time (CI's cores: 36 s one after the other)
test-c:
	@$(MAKE) -j2 --no-print-directory $(C_TESTS)
	@for t in $(C_TESTS); do echo "== $$t"; TN_TCC_LIBDIR=$(TCC_DIR)/lib $$t || exit 1; done

build/asan/test_%: tests/c/test_%.c tests/c/tn_check.h $(CORE_SRC) $(CORE_HDR) | deps
	@mkdir -p build/asan
	$(CC) $(CFLAGS_C) $(ASAN_FLAGS) -o $@ $< $(CORE_SRC) $(LDLIBS_C)

# The Check suites, then a Python smoke test (tests/sanitize/smoke.py) of an
# extension built with the sanitizers (into build/asan-py; the interpreter and
# torch are not instrumented, so the runtime is preloaded and leak checking is
# off there: CPython keeps objects alive until exit).
test-asan: $(ASAN_TESTS)
	@for t in $(ASAN_TESTS); do echo "== $$t"; TN_TCC_LIBDIR=$(TCC_DIR)/lib \
	  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 $$t || exit 1; done
	CFLAGS="$(ASAN_FLAGS)" LDFLAGS="$(ASAN_FLAGS)" $(PYTHON) setup.py -q build --build-base build/asan-tmp \
	  --build-lib build/asan-py
	LD_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libubsan.so)" \
	  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  PYTHONPATH=build/asan-py $(PYTHON) tests/sanitize/smoke.py

fuzz-deps: deps
	@tools/deps.sh fuzz

# The core is compiled once for both targets, an object per source (each
# target compiling all of it took 47 s on 2 cores, 15 s so). The runtime's
# math (float16 arithmetic clang 14 lacks) is the Check suites' object,
# built by $(CC), uninstrumented: the targets reach it only through kernels
# they never run.
FUZZ_OBJ := $(patsubst csrc/%.c,build/fuzz/obj/%.o,$(filter-out csrc/neuron_backend/runtime.c,$(CORE_SRC)))
FUZZ_RUNTIME := build/core/neuron_backend/runtime.o

# objects a pattern rule alone names: make would delete them after the link
.SECONDARY: $(CORE_OBJ) $(FUZZ_OBJ)

build/fuzz/obj/%.o: csrc/%.c $(CORE_HDR) | fuzz-deps
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(CFLAGS_C) $(ASAN_FLAGS) -fsanitize=fuzzer-no-link -c -o $@ $<

build/fuzz/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_RUNTIME) $(FUZZ_OBJ) $(CORE_HDR) | fuzz-deps
	$(FUZZ_CC) $(CFLAGS_C) $(ASAN_FLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_RUNTIME) $(FUZZ_OBJ) $(LDLIBS_FUZZ)

# Seeds: graphs the back end imports from real blocks and fuzzer programs
# (so the extension must be built), and cache records.
build/fuzz/seeds/.done: tests/fuzz/seeds.py | build
	rm -rf build/fuzz/seeds
	$(PYTHON) tests/fuzz/seeds.py build/fuzz/seeds
	@touch $@

# Both targets at once, SECONDS each; a crash fails with its input saved as
# build/fuzz/crash-<target>-*. New inputs collect in build/fuzz/corpus/.
fuzz-c: $(FUZZ_BINS) build/fuzz/seeds/.done
	@mkdir -p $(addprefix build/fuzz/corpus/,$(FUZZ_TARGETS))
	@pids=; for t in $(FUZZ_TARGETS); do \
	  TN_TCC_LIBDIR=$(TCC_DIR)/lib ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	    build/fuzz/fuzz_$$t -max_total_time=$(SECONDS) -max_len=65536 -timeout=20 -rss_limit_mb=4096 \
	    -print_final_stats=1 -artifact_prefix=build/fuzz/crash-$$t- \
	    build/fuzz/corpus/$$t build/fuzz/seeds/$$t > build/fuzz/$$t.log 2>&1 & pids="$$pids $$!"; \
	done; rc=0; for p in $$pids; do wait $$p || rc=1; done; \
	for t in $(FUZZ_TARGETS); do echo "== fuzz_$$t ($(SECONDS) s)"; \
	  grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|#[0-9]+ +DONE)|ERROR|SUMMARY|fuzz_$$t:" build/fuzz/$$t.log || tail -20 build/fuzz/$$t.log; \
	done; if [ $$rc != 0 ]; then echo "fuzz-c: a target failed (logs: build/fuzz/*.log)"; exit 1; fi

# The tests on TEST_WORKERS processes (pytest-xdist; a file's tests in one, so a module's fixtures run
# once): 451 s instead of 750 s on 2 cores. Then the row kernel tests again with every kernel at tier 2
# from its first launch (test_tier2.py covers pointwise). The slowest tests are listed: CI has 15 minutes.
TEST_WORKERS ?= 2
test-python: build
	$(PYTHON) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15 tests/python
	TN_TEST_TIER2=sync $(PYTHON) -m pytest -q -n $(TEST_WORKERS) tests/python/test_reductions.py

# the fuzz targets build two objects at a time
test: build test-c test-python
	$(MAKE) -j2 --no-print-directory fuzz-c SECONDS=10

# The long sweeps make test slices: the tests marked long (more zoo rows and
# processes of what CI's tests cover), the OpInfo tests in every dtype, then
# every OpInfo sample (again with tier 2 forced: TIER2_SYNC); the differential fuzzer through both front doors
# (and for 30 minutes with tier 2 forced) and
# the Python-state fuzzer through jit for 10 minutes each; the libFuzzer
# targets 5 minutes each.
TIER2_SYNC := TORCHNEURON_COMPILE_TIER2=sync TORCHNEURON_TIER2_AFTER_CALLS=1 TORCHNEURON_ROW_FUSION=on
test-long: test
	TN_TEST_LONG=1 $(PYTHON) -m pytest -q -m long tests/python
	TN_TEST_LONG=1 $(PYTHON) -m pytest -q tests/python/test_opinfo.py
	$(PYTHON) -m torchneuron_jit.testing.opinfo --all
	$(PYTHON) -m torchneuron_jit.testing.fuzz --seconds 600 --seed 1 --out build/fuzz-repros
	$(TIER2_SYNC) $(PYTHON) -m torchneuron_jit.testing.opinfo --all
	$(TIER2_SYNC) $(PYTHON) -m torchneuron_jit.testing.fuzz --seconds 1800 --seed 2 --out build/fuzz-repros-tier2
	$(PYTHON) -m torchneuron_jit.testing.statefuzz --seconds 600 --seed 1
	$(MAKE) --no-print-directory fuzz-c SECONDS=300

demo: build
	$(PYTHON) -m torchneuron_jit.demo

# The benchmark suite (benchmarks/suite.py): a full run, about 30 minutes on
# 2 cores, writes benchmarks/results/; bench-quick takes a few minutes.
bench: build
	@tools/deps.sh bench $(PYTHON)
	$(PYTHON) -m benchmarks

bench-quick: build
	@tools/deps.sh bench $(PYTHON)
	$(PYTHON) -m benchmarks --quick --out build/bench-quick

clean:
	rm -rf build/tests build/core build/temp* torchneuron_jit/_C.*.so torchneuron_jit/_tcc
