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
BINDIR ?= $(PREFIX)/bin
MANDIR ?= $(PREFIX)/share/man

CC ?= cc
# The interpreter of the Python package's checks: Debian's python3, with the
# python3-numpy, python3-pytest and python3-venv that tools/setup.sh installs.
# A `python3` earlier on PATH (a pyenv or conda one) usually lacks those
# modules, so the first of python3 and /usr/bin/python3 that has them is taken.
PYTHON ?= $(shell for p in python3 /usr/bin/python3; do \
  $$p -c 'import numpy, pytest, venv, ensurepip' >/dev/null 2>&1 && { echo $$p; exit 0; }; \
  done; echo python3)
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
# CUDA=1 where nvcc exists, unless the caller says CUDA=0.
ifeq ($(NVCC),)
CUDA ?= 0
else
CUDA ?= 1
endif

# CFLAGS, CPPFLAGS and LDFLAGS are the caller's (a distribution's hardening
# flags, say): added to every compile and link, never replacing what the
# build needs.
OPT ?= -O2
CFLAGS ?= $(OPT) -g
WARN := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wno-unused-parameter
BASE_CFLAGS := -std=c11 -fPIC -fvisibility=hidden -pthread $(WARN) -Iinclude -Isrc -I. -DMT_BUILDING_LIBRARY
DEPFLAGS = -MMD -MP
LDLIBS_PRIV := -lcjson -lnuma -lpcre2-8 -lutf8proc -lpthread -lm
# these ship .pc files: the static link asks pkg-config for them
PC_REQUIRES_PRIV := libcjson numa libpcre2-8 libutf8proc
PC_LIBS_PRIV := -lpthread -lm

# Per-file instruction sets: kernels named *_avx2.c / *_avx512.c are built for
# that ISA and only called after a run-time CPU check.
ISA_avx2 := -mavx2 -mfma -mf16c
ISA_avx512 := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma
ISA_avx512bf16 := $(ISA_avx512) -mavx512bf16

SRC := $(sort $(wildcard src/*/*.c))
OBJ := $(SRC:src/%.c=build/src/%.o)

ifeq ($(CUDA),1)
NVCCFLAGS ?= -O3 -g -std=c++17 -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90,code=compute_90 \
  -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra -Iinclude -Isrc -I. -DMT_BUILDING_LIBRARY
CU_SRC := $(sort $(wildcard cuda/*/*.cu))
CU_OBJ := $(CU_SRC:cuda/%.cu=build/cuda/%.o)
BASE_CFLAGS += -DMT_HAVE_CUDA=1
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
# the .pc names the CUDA runtime but not where it lies (docs/abi.md, README)
PC_LIBS_PRIV += -lcudart_static -ldl -lrt -lstdc++
else
CU_OBJ :=
CUDA_LIBS :=
endif

SONAME := libmegatrain.so.$(VMAJOR)
SHLIB := lib/libmegatrain.so.$(VERSION)
STLIB := lib/libmegatrain.a
PCFILE := pkgconfig/megatrain.pc

# tests/tokenizer_check.c and tests/chat_template_check.c are programs of
# their own (tests/tokenizers.sh and tests/chat_templates.sh run them)
TOKENIZER_CHECK := build/tests/tokenizer_check
CHAT_TEMPLATE_CHECK := build/tests/chat_template_check
TEST_SRC := $(filter-out tests/tokenizer_check.c tests/chat_template_check.c,$(sort $(wildcard tests/*.c)))
TEST_BIN := build/tests/mt_tests
BENCH_SRC := $(sort $(wildcard bench/*.c))
BENCH_BIN := $(BENCH_SRC:bench/%.c=build/bench/%)
TOOL_SRC := $(sort $(wildcard tools/megatrain/*.c))
CLI := bin/megatrain

all: $(SHLIB) $(STLIB) $(PCFILE) $(TEST_BIN) $(TOKENIZER_CHECK) $(CHAT_TEMPLATE_CHECK) $(BENCH_BIN) $(if $(TOOL_SRC),$(CLI))
.PHONY: all test memcheck check check-python demo demo-sft setup install uninstall clean check-exports check-abi fuzz fuzz-replay fuzz-seeds

# Objects compiled for one CUDA setting are stale for the other (the CPU-only
# stand-ins of src/device/device_none.c): a stamp per setting, made anew on a
# switch, rebuilds them.
CONFIG_STAMP := build/config-cuda$(CUDA).stamp
$(CONFIG_STAMP):
	@mkdir -p build
	@rm -f build/config-cuda*.stamp
	@touch $@

# -- library ------------------------------------------------------------
build/src/%.o: src/%.c Makefile $(CONFIG_STAMP)
	@mkdir -p $(@D)
	$(CC) $(BASE_CFLAGS) $(CPPFLAGS) $(CFLAGS) $(DEPFLAGS) $(ISA_$(lastword $(subst _, ,$*))) -c $< -o $@

build/cuda/%.o: cuda/%.cu Makefile
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

$(SHLIB): $(OBJ) $(CU_OBJ) src/megatrain.map
	@mkdir -p lib
	$(CC) -shared -pthread $(LDFLAGS) -Wl,-soname,$(SONAME) -Wl,--version-script=src/megatrain.map -Wl,--no-undefined \
	  -o $@ $(OBJ) $(CU_OBJ) $(CUDA_LIBS) $(LDLIBS_PRIV)
	ln -sf libmegatrain.so.$(VERSION) lib/$(SONAME)
	ln -sf $(SONAME) lib/libmegatrain.so

$(STLIB): $(OBJ) $(CU_OBJ)
	@mkdir -p lib
	rm -f $@
	ar rcs $@ $^

# libdir and includedir are written relative to ${prefix} where they lie
# under it, so a relocated install (DESTDIR, a copied tree) needs only prefix
# changed.
pc_rel = $(if $(filter $(PREFIX)/%,$(1)),$${prefix}/$(patsubst $(PREFIX)/%,%,$(1)),$(1))
PC_SED = sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(call pc_rel,$(LIBDIR))|' \
	    -e 's|@INCLUDEDIR@|$(call pc_rel,$(INCLUDEDIR))|' -e 's|@VERSION@|$(VERSION)|' \
	    -e 's|@REQUIRES_PRIVATE@|$(PC_REQUIRES_PRIV)|' -e 's|@LIBS_PRIVATE@|$(PC_LIBS_PRIV)|'
$(PCFILE): pkgconfig/megatrain.pc.in include/megatrain.h Makefile
	$(PC_SED) $< > $@

# -- tests, benchmarks, CLI (linked statically so tests reach internals) ---
build/tests/%.o: tests/%.c Makefile $(CONFIG_STAMP)
	@mkdir -p $(@D)
	$(CC) $(BASE_CFLAGS) $(CPPFLAGS) $(CFLAGS) $(DEPFLAGS) -c $< -o $@

$(TEST_BIN): $(TEST_SRC:tests/%.c=build/tests/%.o) $(STLIB)
	$(CC) -pthread $(LDFLAGS) -o $@ $(filter %.o,$^) $(STLIB) -lcriterion $(CUDA_LIBS) $(LDLIBS_PRIV)

$(TOKENIZER_CHECK): tests/tokenizer_check.c $(STLIB) $(CONFIG_STAMP)
	@mkdir -p $(@D)
	$(CC) $(BASE_CFLAGS) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $< $(STLIB) $(CUDA_LIBS) $(LDLIBS_PRIV)

$(CHAT_TEMPLATE_CHECK): tests/chat_template_check.c $(STLIB) $(CONFIG_STAMP)
	@mkdir -p $(@D)
	$(CC) $(BASE_CFLAGS) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $< $(STLIB) $(CUDA_LIBS) $(LDLIBS_PRIV)

build/bench/%: bench/%.c $(STLIB) $(CONFIG_STAMP)
	@mkdir -p $(@D)
	$(CC) $(BASE_CFLAGS) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $< $(STLIB) $(CUDA_LIBS) $(LDLIBS_PRIV)

build/tools/%.o: tools/megatrain/%.c Makefile $(CONFIG_STAMP)
	@mkdir -p $(@D)
	$(CC) $(BASE_CFLAGS) $(CPPFLAGS) $(CFLAGS) $(DEPFLAGS) -c $< -o $@

# The CLI uses only the public API and links the shared library (and cJSON
# for its run files: logs, checkpoint metadata).
$(CLI): $(TOOL_SRC:tools/megatrain/%.c=build/tools/%.o) $(SHLIB)
	@mkdir -p bin
	$(CC) -pthread $(LDFLAGS) -o $@ $(filter %.o,$^) -Llib -lmegatrain -Wl,-rpath,'$$ORIGIN/../lib' -lcjson -lm

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
FUZZ_LIB_CFLAGS := -std=c11 -pthread $(WARN) -Iinclude -Isrc -I. -DMT_BUILDING_LIBRARY -g -O1 $(FUZZ_SAN)
FUZZ_LIB_OBJ := $(SRC:src/%.c=build/fuzz/lib/%.o)
FUZZ_SECONDS ?= 60
FUZZ_FIXTURE_CONFIGS := $(sort $(wildcard tests/fixtures/*/model/config.json))

build/fuzz/replay_%: tests/fuzz/fuzz_%.c tests/fuzz/replay.c $(FUZZ_HDR) $(STLIB) $(CONFIG_STAMP)
	@mkdir -p $(@D)
	$(CC) $(BASE_CFLAGS) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -Itests/fuzz -o $@ $< tests/fuzz/replay.c $(STLIB) $(CUDA_LIBS) $(LDLIBS_PRIV)

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
# MT_REQUIRE_GPU=1 in the environment fails, rather than skips, a GPU test
# that finds no GPU (tests/gpu.h; tests/require_gpu.sh checks it).
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
# MT_MEMCHECK=1 tells the parity tests to skip their one-ulp re-trainings (the
# same code three times more, which `make check` runs): 21 minutes had become
# most of CI. The fuzz corpus replays run under it too.
VALGRIND := valgrind --leak-check=full --show-leak-kinds=definite,indirect,possible \
  --errors-for-leak-kinds=definite,indirect --suppressions=tests/valgrind.supp --trace-children=yes \
  --log-file=build/memcheck/%p.log
# Without a GPU the cuda_* suites' skipping tests are left out (tools/memcheck-filter.sh: each would cost
# a valgrind start-up and check nothing); their tests that run without one stay in.
memcheck: $(TEST_BIN) $(FUZZ_REPLAY)
	@rm -rf build/memcheck && mkdir -p build/memcheck
	@filter=$$(tools/memcheck-filter.sh $(TEST_BIN)) && echo "memcheck: $${filter:-the whole suite}" && \
	MT_MEMCHECK=1 $(VALGRIND) $(TEST_BIN) --jobs 2 $${filter:+"$$filter"} $(TEST_ARGS)
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
	tests/require_gpu.sh $(TEST_BIN)
	tools/check-deps.sh
	tools/check-backends.sh
	$(MAKE) check-abi
	$(MAKE) fuzz-replay
	tests/cli.sh
	tests/tokenizers.sh
	tests/chat_templates.sh
	tests/plot.sh $(CLI)
	$(if $(filter 1,$(CUDA)),CUDA_HOME=$(CUDA_HOME)) PYTHON=$(PYTHON) tools/install-check.sh

# The Python package's tests against this tree's library and CLI, without an
# install (`make check` runs them on the installed library, pip-installed).
check-python: $(SHLIB) $(CLI)
	MEGATRAIN_LIBRARY=lib/$(SONAME) MEGATRAIN_CLI=$(CLI) MEGATRAIN_CFLAGS=-Iinclude PYTHONPATH=bindings/python \
	  PYTHONDONTWRITEBYTECODE=1 $(PYTHON) -m pytest -q -p no:cacheprovider bindings/python/tests

# The quick start: set up, build, train the built-in demo, report what it learned.
demo: setup
	$(MAKE) $(CLI)
	$(CLI) train

# The fine-tuning demo: chat data, a tokenizer, prompt masking, exact match.
demo-sft: setup
	$(MAKE) $(CLI)
	BIN=$(CLI) tools/sft-demo.sh

setup:
	@tools/setup.sh

check-exports: $(SHLIB)
	@tools/check-exports.sh $(SHLIB)

# The ABI rules (docs/abi.md): the committed layout assertions are those of the
# header, the exports those of the header and the version script, the library
# compatible with every released baseline in abi/ (abidiff), a program built
# against the 0.1.0 header runs against it, and the check itself tells an
# allowed change from a breaking one (--selftest); docs/api.md covers the API.
check-abi: $(SHLIB)
	@tools/abi-layout.py --check
	@tools/check-exports.sh $(SHLIB)
	@tools/abi-check.sh $(SHLIB)
	@mkdir -p build/abi/scratch && rm -rf build/abi/scratch/*
	@$(CC) -std=c11 -Wall -Wextra -Werror $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -Itests/abi tests/abi/old_caller.c \
	  -Llib -lmegatrain -Wl,-rpath,'$$ORIGIN/../../lib' -o build/abi/old_caller
	@build/abi/old_caller build/abi/scratch
	@tools/abi-check.sh --selftest
	@tools/check-api-doc.sh

install: $(SHLIB) $(STLIB) $(PCFILE) $(CLI)
	install -d $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(MANDIR)/man1
	install -m 644 include/megatrain.h include/megatrain.hpp $(DESTDIR)$(INCLUDEDIR)/
	install -m 644 docs/megatrain.1 $(DESTDIR)$(MANDIR)/man1/
	install -m 755 $(SHLIB) $(DESTDIR)$(LIBDIR)/
	ln -sf libmegatrain.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libmegatrain.so
	install -m 644 $(STLIB) $(DESTDIR)$(LIBDIR)/
	$(PC_SED) pkgconfig/megatrain.pc.in > $(DESTDIR)$(LIBDIR)/pkgconfig/megatrain.pc
	install -d $(DESTDIR)$(BINDIR)
	install -m 755 $(CLI) $(DESTDIR)$(BINDIR)/

uninstall:
	rm -f $(DESTDIR)$(INCLUDEDIR)/megatrain.h $(DESTDIR)$(INCLUDEDIR)/megatrain.hpp $(DESTDIR)$(LIBDIR)/libmegatrain.* \
	  $(DESTDIR)$(LIBDIR)/pkgconfig/megatrain.pc $(DESTDIR)$(BINDIR)/megatrain $(DESTDIR)$(MANDIR)/man1/megatrain.1

clean:
	rm -rf build lib bin $(PCFILE)

-include $(OBJ:.o=.d) $(CU_OBJ:.o=.d) $(wildcard build/fuzz/lib/*/*.d) $(TEST_SRC:tests/%.c=build/tests/%.d) $(TOOL_SRC:tools/megatrain/%.c=build/tools/%.d)
