# DwarfStar build. One static library (src/, src/server/, src/agent/) plus thin binaries:
#   app/NAME.c   -> ./NAME      (ds4, ds4-server, ds4-bench, ds4-agent)
#   tools/NAME.c -> ./NAME      (ds4-convert, ds4-make-model, ds4-vocab, ds4-gguf-dump)
#   tests/unit/test_*.c -> $(BUILD)/tests/test_*   (run by `make test`)
#   fuzz/fuzz_*.c       -> $(BUILD)/fuzz/fuzz_*    (libFuzzer, clang)
# Files named *_avx2.c / *_avx512.c / *_amx.c get their ISA flags; everything else is
# plain x86-64, and kernels_cpu picks the level at run time.
# BUILD may be overridden so several builds (asan, ubsan, helpers) coexist.

BUILD   ?= build
CC      ?= gcc
OPT     ?= -O2
SAN     ?=
CFLAGS  ?= -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wno-unused-parameter $(OPT) -g -pthread -Isrc $(SAN)
LDFLAGS ?= -pthread $(SAN)
LDLIBS  ?= -lcjson -lpcre2-8 -ledit -lnng -lm

AVX2_FLAGS   = -mavx2 -mfma -mf16c
AVX512_FLAGS = -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni
AMX_FLAGS    = $(AVX512_FLAGS) -mamx-tile -mamx-int8

# Every C file under src/; the CUDA backend's stub only where the backend is not built.
LIB_SRC   := $(shell find src -name '*.c' -not -path src/backends/cuda/none.c | sort)
# CUDA=1 (`make cuda`, mk/cuda.mk) links the CUDA backend; other builds get
# its stub, which refuses --cuda with one line.
ifeq ($(CUDA),1)
LIB_CU    := $(wildcard src/backends/cuda/*.cu)
else
LIB_SRC   += src/backends/cuda/none.c
endif
# RDMA=1 (the default where libibverbs' header is installed: Debian's
# libibverbs-dev) links the RDMA transport of --tensor-parallel (--transport
# rdma); other builds get its stub, which refuses it with one line.
RDMA      ?= $(if $(wildcard /usr/include/infiniband/verbs.h),1,0)
ifeq ($(RDMA),1)
LIB_SRC   := $(filter-out src/dist/rdma_none.c,$(LIB_SRC))
LDLIBS    += -libverbs
$(BUILD)/src/options/cli_args.o: CFLAGS += -DDS4_RDMA=1
else
LIB_SRC   := $(filter-out src/dist/rdma_verbs.c,$(LIB_SRC))
endif
LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/%.o) $(LIB_CU:%.cu=$(BUILD)/%.o)
LIB       := $(BUILD)/libds4.a
APP_SRC   := $(wildcard app/*.c tools/*.c)
BIN       ?=
APPS      := $(addprefix $(BIN),$(notdir $(APP_SRC:.c=)))
TEST_SRC  := $(wildcard tests/unit/test_*.c)
TESTS     := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)
FUZZ_SRC  := $(wildcard fuzz/fuzz_*.c)
FUZZERS   := $(FUZZ_SRC:fuzz/%.c=$(BUILD)/fuzz/%)

.PHONY: all cpu test unit-tests asan ubsan bench-kernels demo fuzz fuzz-smoke venv clean distclean help cuda
all: $(APPS)
cpu: all

help:
	@echo "targets: all (=cpu) cuda test asan ubsan bench-kernels demo fuzz fuzz-smoke venv clean distclean"

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@
$(BUILD)/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX2_FLAGS) -MMD -MP -c $< -o $@
$(BUILD)/%_avx512.o: %_avx512.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX512_FLAGS) -MMD -MP -c $< -o $@
$(BUILD)/%_amx.o: %_amx.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AMX_FLAGS) -MMD -MP -c $< -o $@

$(LIB): $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

# Binaries land in the repository root, as the README's commands expect
# (BIN=dir/ puts them elsewhere: CI keeps the CUDA build's binaries apart).
# A binary's own modules live in app/NAME/ (ds4-bench's benchmarks in app/bench/)
# and link into that binary alone, never into the library.
BENCH_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(wildcard app/bench/*.c))
APP_OBJ_ds4-bench := $(BENCH_OBJ)
define APP_RULE
$(1): $(2) $(APP_OBJ_$(notdir $(1))) $(LIB)
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CFLAGS) $(2) $(APP_OBJ_$(notdir $(1))) $(LIB) -o $$@ $$(LDFLAGS) $$(LDLIBS)
endef
$(foreach s,$(APP_SRC),$(eval $(call APP_RULE,$(BIN)$(notdir $(s:.c=)),$(s))))

$(BUILD)/tests/%: tests/unit/%.c $(LIB) $(wildcard tests/unit/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/unit $< $(LIB) -o $@ $(LDFLAGS) $(LDLIBS)

# mk/*.mk fragments add generated test inputs (converted oracle models, the
# demo model) to TEST_DATA; they are built before the tests run.
TEST_DATA :=
-include mk/*.mk

# The script tests' Python oracles (tests/requirements-ci.txt) live in a
# virtual environment under the repository, never in the system Python
# (Debian/Ubuntu refuse a bare pip install). It sees the system's packages,
# so where they are installed already it costs seconds and no download.
# Nothing a user runs needs it: the binaries and `make demo` use no Python
# packages. No pip cache: the two coding-agent clients are ~700 MB of wheels
# that a cache would keep a second copy of.
VENV ?= .venv
venv: $(VENV)/.requirements-installed
$(VENV)/.requirements-installed: tests/requirements-ci.txt
	python3 -m venv --system-site-packages $(VENV)
	$(VENV)/bin/python3 -m pip install -q --disable-pip-version-check --no-cache-dir -r tests/requirements-ci.txt
	touch $@

test: $(APPS) $(TESTS) $(TEST_DATA) venv
	@PATH="$(abspath $(VENV))/bin:$$PATH" BUILD=$(BUILD) bash tests/run_tests.sh

# Sanitizer builds run the unit tests from their own build directories (the
# script tests drive the release binaries in the repository root).
unit-tests: $(TESTS) $(TEST_DATA)
	@UNIT_ONLY=1 BUILD=$(BUILD) bash tests/run_tests.sh
asan:
	$(MAKE) BUILD=build-asan SAN="-fsanitize=address -fno-omit-frame-pointer" OPT=-O1 unit-tests
ubsan:
	$(MAKE) BUILD=build-ubsan SAN="-fsanitize=undefined -fno-sanitize-recover=all" OPT=-O1 unit-tests

# The README's first command: build, unpack the trained tiny model, run CLI + server.
demo: all tiny-model
	bash scripts/demo.sh

bench-kernels: ds4-bench
	./ds4-bench --kernels

# libFuzzer targets: the library is rebuilt with clang and coverage.
FUZZ_CFLAGS = -std=c11 -D_GNU_SOURCE -O1 -g -Isrc -fsanitize=address,undefined -fno-sanitize-recover=undefined
$(BUILD)/fuzzobj/%.o: %.c
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@
$(BUILD)/fuzzobj/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) $(AVX2_FLAGS) -fsanitize=fuzzer-no-link -c $< -o $@
$(BUILD)/fuzzobj/%_avx512.o: %_avx512.c
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) $(AVX512_FLAGS) -fsanitize=fuzzer-no-link -c $< -o $@
$(BUILD)/fuzzobj/%_amx.o: %_amx.c
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) $(AMX_FLAGS) -fsanitize=fuzzer-no-link -c $< -o $@
FUZZ_LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/fuzzobj/%.o)
$(BUILD)/fuzz/%: fuzz/%.c $(FUZZ_LIB_OBJ)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer $^ -o $@ -pthread $(LDLIBS)
fuzz: $(FUZZERS)
fuzz-smoke: $(FUZZERS)
	@bash fuzz/smoke.sh $(BUILD)

clean:
	rm -rf build build-asan build-ubsan build-cuda $(APPS)

distclean: clean
	rm -rf $(VENV) models/demo*.gguf models/ds4-tiny*.gguf

-include $(LIB_OBJ:.o=.d) $(BENCH_OBJ:.o=.d)
