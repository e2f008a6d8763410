# libmegatrain build. `make` builds the shared and static libraries, the CLI,
# the tests and the benchmarks; `make test` runs the Criterion suite;
# `make CUDA=0` builds without the CUDA backend.

# Version numbers come from the public header (one source of truth).
VMAJOR := $(shell sed -n 's/^\#define MT_VERSION_MAJOR *\([0-9]*\).*/\1/p' include/megatrain.h)
VMINOR := $(shell sed -n 's/^\#define MT_VERSION_MINOR *\([0-9]*\).*/\1/p' include/megatrain.h)
VPATCH := $(shell sed -n 's/^\#define MT_VERSION_PATCH *\([0-9]*\).*/\1/p' include/megatrain.h)
VERSION := $(VMAJOR).$(VMINOR).$(VPATCH)

PREFIX ?= /usr/local
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include

CC ?= cc
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
# CUDA=1 where nvcc exists, unless the caller says CUDA=0.
ifeq ($(NVCC),)
CUDA ?= 0
else
CUDA ?= 1
endif

OPT ?= -O2
CFLAGS ?= $(OPT) -g
WARN := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wno-unused-parameter
BASE_CFLAGS := -std=c11 -fPIC -fvisibility=hidden -pthread $(WARN) -Iinclude -Isrc -DMT_BUILDING_LIBRARY
DEPFLAGS = -MMD -MP
LDLIBS_PRIV := -lcjson -lnuma -lpthread -lm

# Per-file instruction sets: kernels named *_avx2.c / *_avx512.c are built for
# that ISA and only called after a run-time CPU check.
ISA_avx2 := -mavx2 -mfma -mf16c
ISA_avx512 := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma
ISA_avx512bf16 := $(ISA_avx512) -mavx512bf16

SRC := $(sort $(wildcard src/*.c))
OBJ := $(SRC:src/%.c=build/src/%.o)

ifeq ($(CUDA),1)
NVCCFLAGS ?= -O3 -g -std=c++17 -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90,code=compute_90 \
  -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra -Iinclude -Isrc -DMT_BUILDING_LIBRARY
CU_SRC := $(sort $(wildcard cuda/*.cu))
CU_OBJ := $(CU_SRC:cuda/%.cu=build/cuda/%.o)
BASE_CFLAGS += -DMT_HAVE_CUDA=1
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
else
CU_OBJ :=
CUDA_LIBS :=
endif

SONAME := libmegatrain.so.$(VMAJOR)
SHLIB := lib/libmegatrain.so.$(VERSION)
STLIB := lib/libmegatrain.a
PCFILE := pkgconfig/megatrain.pc

TEST_SRC := $(sort $(wildcard tests/*.c))
TEST_BIN := build/tests/mt_tests
BENCH_SRC := $(sort $(wildcard bench/*.c))
BENCH_BIN := $(BENCH_SRC:bench/%.c=build/bench/%)
TOOL_SRC := $(sort $(wildcard tools/megatrain/*.c))
CLI := bin/megatrain

all: $(SHLIB) $(STLIB) $(PCFILE) $(TEST_BIN) $(BENCH_BIN) $(if $(TOOL_SRC),$(CLI))
.PHONY: all test memcheck check demo setup install uninstall clean check-exports fuzz fuzz-replay fuzz-seeds

# Objects compiled for one CUDA setting are stale for the other (the CPU-only
# stubs of src/cuda_host_none.c): a stamp per setting, made anew on a switch,
# rebuilds them.
CONFIG_STAMP := build/config-cuda$(CUDA).stamp
$(CONFIG_STAMP):
	@mkdir -p build
	@rm -f build/config-cuda*.stamp
	@touch $@

# -- library ------------------------------------------------------------
build/src/%.o: src/%.c Makefile $(CONFIG_STAMP)
	@mkdir -p $(@D)
	$(CC) $(BASE_CFLAGS) $(CFLAGS) $(DEPFLAGS) $(ISA_$(lastword $(subst _, ,$*))) -c $< -o $@

build/cuda/%.o: cuda/%.cu Makefile
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

$(SHLIB): $(OBJ) $(CU_OBJ) src/megatrain.map
	@mkdir -p lib
	$(CC) -shared -pthread -Wl,-soname,$(SONAME) -Wl,--version-script=src/megatrain.map -Wl,--no-undefined \
	  -o $@ $(OBJ) $(CU_OBJ) $(CUDA_LIBS) $(LDLIBS_PRIV)
	ln -sf libmegatrain.so.$(VERSION) lib/$(SONAME)
	ln -sf $(SONAME) lib/libmegatrain.so

$(STLIB): $(OBJ) $(CU_OBJ)
	@mkdir -p lib
	rm -f $@
	ar rcs $@ $^

PC_SED = sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|' \
	    -e 's|@VERSION@|$(VERSION)|' -e 's|@LIBS_PRIVATE@|$(CUDA_LIBS) $(LDLIBS_PRIV)|'
$(PCFILE): pkgconfig/megatrain.pc.in include/megatrain.h Makefile
	$(PC_SED) $< > $@

# -- tests, benchmarks, CLI (linked statically so tests reach internals) ---
build/tests/%.o: tests/%.c Makefile $(CONFIG_STAMP)
	@mkdir -p $(@D)
	$(CC) $(BASE_CFLAGS) $(CFLAGS) $(DEPFLAGS) -c $< -o $@

$(TEST_BIN): $(TEST_SRC:tests/%.c=build/tests/%.o) $(STLIB)
	$(CC) -pthread -o $@ $(filter %.o,$^) $(STLIB) -lcriterion $(CUDA_LIBS) $(LDLIBS_PRIV)

build/bench/%: bench/%.c $(STLIB) $(CONFIG_STAMP)
	@mkdir -p $(@D)
	$(CC) $(BASE_CFLAGS) $(CFLAGS) -o $@ $< $(STLIB) $(CUDA_LIBS) $(LDLIBS_PRIV)

build/tools/%.o: tools/megatrain/%.c Makefile $(CONFIG_STAMP)
	@mkdir -p $(@D)
	$(CC) $(BASE_CFLAGS) $(CFLAGS) $(DEPFLAGS) -c $< -o $@

# The CLI uses only the public API and links the shared library.
$(CLI): $(TOOL_SRC:tools/megatrain/%.c=build/tools/%.o) $(SHLIB)
	@mkdir -p bin
	$(CC) -pthread -o $@ $(filter %.o,$^) -Llib -lmegatrain -Wl,-rpath,'$$ORIGIN/../lib' -lm

# -- fuzz targets (tests/fuzz, docs/fuzzing.md) ---------------------------
# Each tests/fuzz/fuzz_NAME.c is a libFuzzer entry point for one file reader.
# build/fuzz/replay_NAME runs it on files with the ordinary compiler (the
# committed corpus, in `make check`); build/fuzz/NAME is the libFuzzer build
# (clang, AddressSanitizer and UndefinedBehaviorSanitizer, CPU-only library).
FUZZ_NAMES := $(patsubst tests/fuzz/fuzz_%.c,%,$(sort $(wildcard tests/fuzz/fuzz_*.c)))
FUZZ_REPLAY := $(FUZZ_NAMES:%=build/fuzz/replay_%)
FUZZ_HDR := $(wildcard tests/fuzz/*.h)
FUZZ_CC ?= clang
FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_LIB_CFLAGS := -std=c11 -pthread $(WARN) -Iinclude -Isrc -DMT_BUILDING_LIBRARY -g -O1 $(FUZZ_SAN)
FUZZ_LIB_OBJ := $(SRC:src/%.c=build/fuzz/lib/%.o)
FUZZ_SECONDS ?= 60
FUZZ_FIXTURE_CONFIGS := $(sort $(wildcard tests/fixtures/*/model/config.json))

build/fuzz/replay_%: tests/fuzz/fuzz_%.c tests/fuzz/replay.c $(FUZZ_HDR) $(STLIB) $(CONFIG_STAMP)
	@mkdir -p $(@D)
	$(CC) $(BASE_CFLAGS) $(CFLAGS) -Itests/fuzz -o $@ $< tests/fuzz/replay.c $(STLIB) $(CUDA_LIBS) $(LDLIBS_PRIV)

build/fuzz/seeds: tests/fuzz/seeds.c $(FUZZ_HDR) $(STLIB) $(CONFIG_STAMP)
	@mkdir -p $(@D)
	$(CC) $(BASE_CFLAGS) $(CFLAGS) -Itests/fuzz -o $@ $< $(STLIB) $(CUDA_LIBS) $(LDLIBS_PRIV)

build/fuzz/lib/%.o: src/%.c Makefile
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_LIB_CFLAGS) $(DEPFLAGS) -fsanitize=fuzzer-no-link $(ISA_$(lastword $(subst _, ,$*))) -c $< -o $@

.SECONDARY: $(FUZZ_LIB_OBJ)
build/fuzz/%: tests/fuzz/fuzz_%.c $(FUZZ_HDR) $(FUZZ_LIB_OBJ)
	$(FUZZ_CC) $(FUZZ_LIB_CFLAGS) -Itests/fuzz -fsanitize=fuzzer -o $@ $< $(FUZZ_LIB_OBJ) $(LDLIBS_PRIV)

# -- running --------------------------------------------------------------
# Criterion runs each test in its own process. JOBS=1 for GPU suites.
JOBS ?= 2
test: $(TEST_BIN)
	$(TEST_BIN) --jobs $(JOBS) $(TEST_ARGS)

# valgrind follows Criterion's child processes (one per test) and writes a
# log per process. A leak is only known when a child exits, after Criterion
# has recorded its result, so the logs are read afterwards: any error,
# leaks included, fails the target (processes that tests kill on purpose
# leave no summary and are not counted). "Possibly lost" blocks are shown
# but do not count: Criterion's own runner leaves some when a test skips.
# Two jobs, for the two cores of the CI machine: CI took 11 minutes, not 19.
# The fuzz corpus replays run under it too.
VALGRIND := valgrind --leak-check=full --show-leak-kinds=definite,indirect,possible \
  --errors-for-leak-kinds=definite,indirect --suppressions=tests/valgrind.supp --trace-children=yes \
  --log-file=build/memcheck/%p.log
memcheck: $(TEST_BIN) $(FUZZ_REPLAY)
	@rm -rf build/memcheck && mkdir -p build/memcheck
	MT_MEMCHECK=1 $(VALGRIND) $(TEST_BIN) --jobs 2 $(TEST_ARGS)
	@for t in $(FUZZ_NAMES); do $(VALGRIND) build/fuzz/replay_$$t tests/fuzz/corpus/$$t || exit 1; done
	@bad=$$(grep -l 'ERROR SUMMARY: [1-9]' build/memcheck/*.log); \
	if [ -n "$$bad" ]; then for f in $$bad; do cat $$f; done; echo "memcheck: valgrind found errors (logs above)"; exit 1; fi; \
	echo "memcheck: $$(grep -l 'ERROR SUMMARY' build/memcheck/*.log | wc -l) processes, no leaks or memory errors"

# The committed fuzz corpus (seeds and the inputs that once failed) through
# every target: each input must give a clean result or a clear error.
fuzz-replay: $(FUZZ_REPLAY)
	@for t in $(FUZZ_NAMES); do build/fuzz/replay_$$t tests/fuzz/corpus/$$t || exit 1; done

# libFuzzer on each target for FUZZ_SECONDS, from the committed corpus; new
# inputs go to build/fuzz/corpus/NAME, failures to build/fuzz/crashes/NAME-*.
fuzz: $(FUZZ_NAMES:%=build/fuzz/%)
	@for t in $(FUZZ_NAMES); do \
	  mkdir -p build/fuzz/corpus/$$t build/fuzz/crashes; \
	  echo "fuzz: $$t for $(FUZZ_SECONDS) s"; \
	  build/fuzz/$$t -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
	    -artifact_prefix=build/fuzz/crashes/$$t- build/fuzz/corpus/$$t tests/fuzz/corpus/$$t || exit 1; \
	done

# Writes the seed inputs anew (after a change of the tiny model or a format).
fuzz-seeds: build/fuzz/seeds
	build/fuzz/seeds tests/fuzz/corpus $(FUZZ_FIXTURE_CONFIGS)

check: setup
	$(MAKE) all
	$(MAKE) test
	$(MAKE) check-exports
	$(MAKE) fuzz-replay
	tests/cli.sh
	tools/install-check.sh

# The quick start: set up, build, train the built-in demo, report what it learned.
demo: setup
	$(MAKE) $(CLI)
	$(CLI) train

setup:
	@tools/setup.sh

check-exports: $(SHLIB)
	@bad=$$(nm -D --defined-only $(SHLIB) | awk '{print $$3}' | grep -v '^mt_' | grep -v '^MEGATRAIN_' ); \
	if [ -n "$$bad" ]; then echo "non-API symbols exported:"; echo "$$bad"; exit 1; fi; \
	echo "exports: $$(nm -D --defined-only $(SHLIB) | grep -c ' T mt_') mt_ functions, nothing else"

install: $(SHLIB) $(STLIB) $(PCFILE)
	install -d $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCLUDEDIR)
	install -m 644 include/megatrain.h $(DESTDIR)$(INCLUDEDIR)/
	install -m 755 $(SHLIB) $(DESTDIR)$(LIBDIR)/
	ln -sf libmegatrain.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libmegatrain.so
	install -m 644 $(STLIB) $(DESTDIR)$(LIBDIR)/
	$(PC_SED) pkgconfig/megatrain.pc.in > $(DESTDIR)$(LIBDIR)/pkgconfig/megatrain.pc
	if [ -f $(CLI) ]; then install -d $(DESTDIR)$(PREFIX)/bin && install -m 755 $(CLI) $(DESTDIR)$(PREFIX)/bin/; fi

uninstall:
	rm -f $(DESTDIR)$(INCLUDEDIR)/megatrain.h $(DESTDIR)$(LIBDIR)/libmegatrain.* \
	  $(DESTDIR)$(LIBDIR)/pkgconfig/megatrain.pc $(DESTDIR)$(PREFIX)/bin/megatrain

clean:
	rm -rf build lib bin $(PCFILE)

-include $(OBJ:.o=.d) $(CU_OBJ:.o=.d) $(wildcard build/fuzz/lib/*.d) $(TEST_SRC:tests/%.c=build/tests/%.d) $(TOOL_SRC:tools/megatrain/%.c=build/tools/%.d)
