# The CUDA build (owner: cuda). `make cuda` rebuilds the library with the
# CUDA backend (src/backends/cuda/*.cu, nvcc) in $(CUDA_BUILD) and links the usual
# binaries (in the repository root, or BIN=dir/) plus $(CUDA_BUILD)/cuda-ops, the
# per-operation CUDA-vs-CPU check. CUDA_ARCH lists the machine-code targets;
# the default is a fat build for Ampere, Ada, Hopper (sm_90a, arch-specific) and
# Blackwell workstation parts, plus compute_80 PTX so any later GPU can JIT it.
# CUDA_ARCH=native builds for the GPUs of this machine only.

NVCC       ?= $(or $(wildcard /usr/local/cuda/bin/nvcc),$(shell command -v nvcc 2>/dev/null))
CUDA_HOME  ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_BUILD ?= build-cuda
CUDA_ARCH  ?= sm_80 sm_89 sm_90a sm_120
CUDA_PTX   ?= compute_80
ifeq ($(CUDA_ARCH),native)
CUDA_GENCODE := -arch=native
else
cuda_comma := ,
CUDA_GENCODE := $(foreach a,$(CUDA_ARCH),-gencode=arch=compute_$(subst sm_,,$(a))$(cuda_comma)code=$(a)) \
                $(if $(CUDA_PTX),-gencode=arch=$(CUDA_PTX)$(cuda_comma)code=$(CUDA_PTX))
endif
# no fast-math: the kernels must round like the CPU reference (exact path)
NVCCFLAGS  ?= -O3 -std=c++17 -g -lineinfo $(CUDA_GENCODE) -Isrc -Werror all-warnings \
              -Xcompiler -Wall,-Wextra,-Werror,-Wno-unused-parameter

.PHONY: cuda cuda-bins
cuda:
	@test -n "$(NVCC)" || { echo "make cuda: nvcc not found (install the CUDA toolkit or set NVCC=)"; exit 1; }
	$(MAKE) CUDA=1 BUILD=$(CUDA_BUILD) NVCC="$(NVCC)" all $(CUDA_BUILD)/cuda-ops

ifeq ($(CUDA),1)
# static cudart: the binaries need only the driver (libcuda) at run time, and
# without one they start and say so instead of failing to load
LDLIBS += -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib -lcudart_static -lrt -ldl -lstdc++
# the objects depend on the nvcc command line, so a CUDA_ARCH change rebuilds them
.PHONY: cuda-flags-check
$(BUILD)/cuda-flags: cuda-flags-check
	@mkdir -p $(dir $@)
	@echo '$(NVCC) $(NVCCFLAGS)' | cmp -s - $@ || echo '$(NVCC) $(NVCCFLAGS)' > $@
$(BUILD)/%.o: %.cu $(BUILD)/cuda-flags
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@
$(BUILD)/cuda-ops: tests/cuda/cuda_ops.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< $(LIB) -o $@ $(LDFLAGS) $(LDLIBS)
-include $(LIB_CU:%.cu=$(BUILD)/%.d)
endif

# make test checks the CUDA build on this (GPU-less) machine: it links, and
# --cuda fails cleanly (tests/cuda/test_cuda_nogpu.sh). Without nvcc that test
# fails, saying the CUDA build is missing.
# Only for the default build: sanitizer builds (BUILD=build-asan ...) pass
# their flags down to sub-makes and run no script tests anyway.
ifneq ($(NVCC),)
ifeq ($(CUDA)$(BUILD),build)
TEST_DATA += cuda-test-bins
.PHONY: cuda-test-bins
cuda-test-bins:
	@$(MAKE) --no-print-directory cuda BIN=$(CUDA_BUILD)/bin/
endif
endif
