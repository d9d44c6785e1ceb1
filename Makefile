# zinf — one build for everything.
#
#   make                 libzinf and every program into bin/
#   make test            install missing packages, build, run every suite
#   make demo            install missing packages, build, run a short pipeline
#   make bench           the benchmark programs (zinf-iobench, ...)
#   make install PREFIX=/usr/local
#   make deps            install the Debian packages (scripts/deps.sh) and the reference
#                        tokenizers (npm, into .cache/: scripts/tokenizer-refs.sh)
#   make fuzz            build the libFuzzer targets (clang) and run each FUZZ_SECONDS=60,
#                        FUZZ_JOBS=2 at a time; a crash fails it (tests/fuzz/README.md)
#   make fuzz-syntax     clang parses what make fuzz builds, no code made (make test
#                        runs it: tests/e2e/targets.sh)
#
#   make sanitize        every unit and MPI suite under ASan+UBSan, the threaded ones under TSan
#   make crash-trials    CRASH_TRIALS=100 SIGKILL trials of each kind (scripts/crash-trials.sh)
#   make soak            SOAK_MINUTES=30 of kills and resumes beside zinf-pinstress
#
# Options: NO_CUDA=1 NO_MPI=1 V=1 (show commands) DEBUG=1
#          SANITIZE=address,undefined | SANITIZE=thread (CPU-only, into build/san-<name>/;
#          `make test SANITIZE=...` runs every unit and MPI suite under it)
#          FAST_CXX=g++ (the tests and the programs' option files are clang's
#          where it is installed: half the CPU; FAST_CXX below says why)

VERSION := 0.1.0
PREFIX ?= /usr/local
BUILD := build
BIN := bin
# A sanitized build is CPU-only (the sanitizers and the CUDA runtime do not
# mix) and has its own folders, so the main build stays as it is.
ifneq ($(SANITIZE),)
override NO_CUDA := 1
BUILD = build/san-$(firstword $(subst $(comma), ,$(SANITIZE)))
BIN = $(BUILD)/bin
endif

CXX ?= g++
ifeq ($(origin CXX),default)
CXX := g++
endif

# FAST_CXX: the compiler for the files whose own code declares, checks and
# prints (the programs' option files, the tests; the lists are below), and
# for the library but its kernels. They are template-heavy (CLI11,
# nlohmann/json, Boost.Test), where clang's front end and code generator take
# half of GCC's CPU time (BENCHMARKS.md, "Clang for the template-heavy
# files", "The library by clang"); it links against the same libstdc++, and
# the kernels, whose bits the tests pin, stay GCC's. clang++ when
# CXX is the default g++ and clang is installed; CXX otherwise, and always
# under a sanitizer (one compiler's runtime per binary). FAST_CXX=g++ opts out.
ifeq ($(origin FAST_CXX),undefined)
FAST_CXX := $(if $(SANITIZE)$(filter-out g++,$(CXX)),$(CXX),$(or $(shell command -v clang++ 2>/dev/null),$(CXX)))
endif
# clang's precompiled headers are NAME.pch, GCC's NAME.gch; each compiler finds
# its own beside the header that -include names.
PCH_EXT := $(if $(findstring clang,$(notdir $(FAST_CXX))),pch,gch)

Q := $(if $(V),,@)
# A command put before every compile and link (scripts/build-times.sh times them).
LAUNCH ?=

# Every core unless -j is given: `make test` and CI build twice as fast on 2 cores.
ifeq ($(MAKELEVEL)$(filter -j%,$(MAKEFLAGS)),0)
MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 1)
endif

# --- what this machine has ---------------------------------------------------
empty :=
space := $(empty) $(empty)
comma := ,
have = $(empty)  $(if $(1),✓,✗)

ifneq ($(NO_CUDA),1)
NVCC := $(or $(shell command -v nvcc 2>/dev/null),$(wildcard /usr/local/cuda/bin/nvcc))
endif
# The toolkit root is where cuda_runtime_api.h is, not where nvcc happens to
# be on PATH (a /usr/local/bin/nvcc wrapper script is common): try $CUDA_HOME,
# $CUDA_PATH, the folder above nvcc's real path and /usr/local/cuda, in order.
CUDA_CANDIDATES := $(CUDA_HOME) $(CUDA_PATH) $(if $(NVCC),$(patsubst %/bin/nvcc,%,$(realpath $(NVCC)))) /usr/local/cuda
CUDA_HOME := $(if $(NVCC),$(patsubst %/include/cuda_runtime_api.h,%,$(firstword $(wildcard $(CUDA_CANDIDATES:%=%/include/cuda_runtime_api.h)))))
ifeq ($(CUDA_HOME),)
ifneq ($(NVCC),)
$(if $(filter 0,$(MAKELEVEL)),$(warning nvcc at $(NVCC) but no cuda_runtime_api.h under $(CUDA_CANDIDATES); building without CUDA (set CUDA_HOME)))
NVCC :=
endif
endif
NCCL_H := $(if $(NVCC),$(firstword $(wildcard $(CUDA_HOME)/include/nccl.h /usr/include/nccl.h)))
ifneq ($(NO_MPI),1)
MPICXX := $(shell command -v mpicxx 2>/dev/null)
endif
OPENBLAS := $(shell pkg-config --exists openblas 2>/dev/null && echo yes)
# clang's runtimes (libclang-rt-dev): ThreadSanitizer for make test's
# sanitized subset, libFuzzer for make test's link of the fuzz targets.
CLANG_RT := $(if $(findstring clang,$(notdir $(FAST_CXX))),$(shell $(FAST_CXX) -print-runtime-dir 2>/dev/null))
CLANG_RT_TSAN := $(wildcard $(CLANG_RT)/libclang_rt.tsan-x86_64.a $(CLANG_RT)/libclang_rt.tsan.a)
FUZZ_LINKER := $(if $(wildcard $(CLANG_RT)/libclang_rt.fuzzer-x86_64.a $(CLANG_RT)/libclang_rt.fuzzer.a),$(FAST_CXX))
# SentencePiece (zinf-sample --tokenizer tokenizer.model): Debian's libsentencepiece-dev.
SENTENCEPIECE := $(firstword $(wildcard $(DEPS_PREFIX)/usr/include/sentencepiece_processor.h /usr/include/sentencepiece_processor.h))

# Required libraries: the build stops with a clear message when one is missing.
REQUIRED_HEADERS := liburing.h xxhash.h Random123/philox.h CLI/CLI.hpp nlohmann/json.hpp boost/test/unit_test.hpp pcre2.h utf8proc.h
MISSING_HEADERS := $(strip $(foreach h,$(REQUIRED_HEADERS),$(if $(wildcard /usr/include/$(h)),,$(h))))

ifeq ($(MAKELEVEL),0)
ifeq ($(filter clean deps help,$(MAKECMDGOALS)),)
$(info zinf $(VERSION) build:)
$(info $(call have,$(NVCC)) nvcc      $(or $(NVCC),not found$(if $(NO_CUDA), (NO_CUDA=1)))$(if $(NVCC), (toolkit $(CUDA_HOME); CUDA code compiles, runs only with a GPU)))
$(info $(call have,$(NCCL_H)) NCCL      $(or $(NCCL_H),not found))
$(info $(call have,$(MPICXX)) MPI       $(or $(MPICXX),not found$(if $(NO_MPI), (NO_MPI=1)))$(if $(MPICXX), (mpirun tests run)))
$(info $(call have,$(OPENBLAS)) OpenBLAS  $(if $(OPENBLAS),found,not found))
$(info $(call have,$(findstring clang,$(FAST_CXX))) clang     $(if $(findstring clang,$(FAST_CXX)),$(FAST_CXX) (the tests, the programs' option files, the library but its kernels),not used: $(FAST_CXX) builds everything))
$(info $(call have,$(FUZZ_LINKER)) libFuzzer $(if $(FUZZ_LINKER),found (make test links the fuzz targets),not found: make test does not link the fuzz targets (make deps installs libclang-rt-dev)))
$(info $(call have,$(SENTENCEPIECE)) SentencePiece $(if $(SENTENCEPIECE),found,not found (zinf-sample takes token ids then)))
endif
endif

# --- flags -----------------------------------------------------------------
CPPFLAGS := -Ilibzinf/include -DZINF_VERSION='"$(VERSION)"' -MMD -MP
CXXFLAGS := -std=c++20 -Wall -Wextra -Wshadow -Wno-missing-field-initializers -pthread
LDFLAGS := -pthread -fopenmp
LDLIBS := $(shell pkg-config --libs liburing libxxhash 2>/dev/null || echo -luring -lxxhash)
# The text module: tokenizer regexes (PCRE2, 8-bit) and Unicode normalization (utf8proc).
LDLIBS += $(shell pkg-config --libs libpcre2-8 libutf8proc 2>/dev/null || echo -lpcre2-8 -lutf8proc)

# -g1: line tables only (backtraces, perf and sanitizer reports still name
# file and line); full -g made every compile a third slower and libzinf.a
# 131 MB. DEBUG=1 for a debugger's view (-O0 -g3).
ifeq ($(DEBUG),1)
CXXFLAGS += -O0 -g3
else
CXXFLAGS += -O2 -g1 -march=x86-64-v2
endif
ifneq ($(SANITIZE),)
# -O1 under a sanitizer, as its manual advises: a fifth less compile than -O2,
# and no access it instruments optimised away (the -O3 files keep theirs).
CXXFLAGS += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer $(if $(filter 1,$(DEBUG)),,-O1)
LDFLAGS += -fsanitize=$(SANITIZE)
endif
# gold where the toolchain has it (binutils' second linker): a program's link
# 0.6 CPU-s against the default ld's 1.5, for the 40 links of a build.
LD_GOLD := $(shell $(CXX) -fuse-ld=gold -Wl,--version 2>/dev/null | grep -q '^GNU gold' && echo -fuse-ld=gold)
LDFLAGS += $(LD_GOLD)
ifneq ($(NVCC),)
CPPFLAGS += -DZINF_HAVE_CUDA=1
# The static runtime: binaries start on machines without CUDA and say so.
LDLIBS += -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt
$(BUILD)/%_cuda.o: CPPFLAGS += -isystem $(CUDA_HOME)/include
endif
ifneq ($(NCCL_H),)
# NCCL is opened at run time (dlopen), so nothing links against it.
CPPFLAGS += -DZINF_HAVE_NCCL=1
$(BUILD)/libzinf/src/comm/nccl.o: CPPFLAGS += -isystem $(CUDA_HOME)/include
endif
ifneq ($(MPICXX),)
# MPI's headers for the comm module only; its C library for every link.
CPPFLAGS += -DZINF_HAVE_MPI=1
$(BUILD)/libzinf/src/comm/mpi.o: CPPFLAGS += $(patsubst -I%,-isystem %,$(filter -I%,$(shell $(MPICXX) --showme:compile))) -DOMPI_SKIP_MPICXX=1
LDLIBS += $(filter-out -lmpi_cxx,$(shell $(MPICXX) --showme:link))
endif
ifneq ($(SENTENCEPIECE),)
CPPFLAGS += -DZINF_HAVE_SENTENCEPIECE=1
LDLIBS += -lsentencepiece
# test_text trains a small SentencePiece model of its own.
$(BUILD)/tests/test_text: LDLIBS += -lsentencepiece_train
endif
ifneq ($(OPENBLAS),)
CPPFLAGS += -DZINF_HAVE_OPENBLAS=1
LDLIBS += $(shell pkg-config --libs openblas)
endif

# --- DEPS_PREFIX=DIR: the dependencies from a private prefix -----------------
# A host without our Debian packages (an air-gapped GPU node) builds against
# their files unpacked under DIR (DIR/usr/include, DIR/usr/lib/<triplet>), as
# `scripts/gpu-check.sh --from` does with the bundle `--bundle` made. DIR's
# headers and libraries come before the system's, the programs and tests find
# its shared libraries through their run path, and the header check looks
# there too. Nothing else changes: pkg-config is still asked, with fallbacks.
ifneq ($(DEPS_PREFIX),)
override DEPS_PREFIX := $(abspath $(DEPS_PREFIX))
DEPS_LIBDIRS := $(wildcard $(DEPS_PREFIX)/usr/lib/*-linux-gnu) $(DEPS_PREFIX)/usr/lib
CPPFLAGS += -isystem $(DEPS_PREFIX)/usr/include
LDFLAGS += $(foreach d,$(DEPS_LIBDIRS),-L$(d) -Wl,-rpath,$(d))
MISSING_HEADERS := $(strip $(foreach h,$(REQUIRED_HEADERS),$(if $(wildcard $(DEPS_PREFIX)/usr/include/$(h) /usr/include/$(h)),,$(h))))
ifeq ($(MAKELEVEL)$(filter clean deps help,$(MAKECMDGOALS)),0)
$(info $(call have,$(wildcard $(DEPS_PREFIX)/usr/include)) deps      $(DEPS_PREFIX)$(if $(wildcard $(DEPS_PREFIX)/usr/include),, (no usr/include there)))
endif
endif

# Everything rebuilds when the flags change (DEBUG, SANITIZE, NO_CUDA, ...,
# and which files take a precompiled header, -O0 or -O1: written below, after
# those lists).
FLAGS_STAMP := $(BUILD)/flags

# --- sources ---------------------------------------------------------------
LIB := $(BUILD)/libzinf.a
# CUDA runtime calls live in *_cuda.cpp files, built with the toolkit; their
# *_none.cpp twins stand in without it (no #if needed anywhere else).
LIB_SRCS := $(filter-out $(if $(NVCC),%_none.cpp,%_cuda.cpp),$(sort $(wildcard libzinf/src/*/*.cpp)))
# The sanitized test builds (below) need only the modules their tests use.
ifneq ($(SANITIZED_MODULES),)
LIB_SRCS := $(filter $(foreach m,$(SANITIZED_MODULES),libzinf/src/$(m)/%),$(LIB_SRCS))
LIB := $(BUILD)/libzinf-$(subst $(space),-,$(strip $(SANITIZED_MODULES))).a
endif
LIB_OBJS := $(LIB_SRCS:%.cpp=$(BUILD)/%.o)

# --- the cuda device backend (libzinf/src/device/cuda/, docs/cuda-backend.md) --
# Kernels: .cu files built by nvcc for Hopper (sm_90 code, plus compute_90 PTX
# the driver compiles for anything newer), with -fmad=false (no fused
# multiply-add, as the cpu kernels' -ffp-contract=off) where a test pins a
# kernel of the file to the cpu backend's bits (tests/unit/test_cuda.cpp),
# with fused multiply-adds where the tests hold its kernels to a tolerance:
# NVCC_FMAD_FILES (docs/cuda-backend.md says which and why). Host side: .cpp built by g++ against the
# toolkit's headers. cuBLASLt is opened at run time (dlopen), so nothing links
# it. Without the toolkit, device/cuda_none.cpp stands in (it says why).
ifneq ($(NVCC),)
CUDA_DEVICE_SRCS := $(wildcard libzinf/src/device/cuda/*.cpp libzinf/src/device/cuda/*.cu)
CUDA_HOST_OBJS := $(patsubst %.cpp,$(BUILD)/%.o,$(filter %.cpp,$(CUDA_DEVICE_SRCS)))
LIB_OBJS += $(patsubst %,$(BUILD)/%.o,$(basename $(CUDA_DEVICE_SRCS)))
# The kernels' bodies are declared by the public kernels.def (libzinf/include).
NVCCFLAGS := -std=c++20 -O3 -lineinfo -gencode=arch=compute_90,code=sm_90 -gencode=arch=compute_90,code=compute_90 \
  -Xcompiler=-Wall,-Wextra -Ilibzinf/include
# Attention's softmax rows and decode (attention.cu) and flash attention
# (flash.cu): compared with the cpu within 1e-5, never bitwise.
NVCC_FMAD_FILES := attention flash
nvcc_fmad = $(if $(filter $(1),$(NVCC_FMAD_FILES)),-fmad=true,-fmad=false)
$(BUILD)/libzinf/src/device/cuda/%.o: CPPFLAGS += -isystem $(CUDA_HOME)/include
$(BUILD)/libzinf/src/device/cuda/%.o: libzinf/src/device/cuda/%.cu $(FLAGS_STAMP) Makefile
	@mkdir -p $(@D)
	@$(if $(Q),echo "  NVCC    $<")
	$(Q)$(LAUNCH) $(NVCC) $(NVCCFLAGS) $(call nvcc_fmad,$*) -MMD -MP -MF $(@:.o=.d) -c $< -o $@
endif

# One folder per program: main.cpp plus its own small files.
PROGRAM_DIRS := $(patsubst %/main.cpp,%,$(wildcard */main.cpp))
program_name = zinf-$(if $(filter trainer,$(1)),train,$(1))
PROGRAMS := $(foreach d,$(PROGRAM_DIRS),$(BIN)/$(call program_name,$(d)))

# bench/NAME.cpp -> bin/zinf-NAME
BENCH_SRCS := $(wildcard bench/*.cpp)
BENCHES := $(BENCH_SRCS:bench/%.cpp=$(BIN)/zinf-%)

PUBLIC_HEADERS := $(wildcard libzinf/include/zinf/*.hpp)
HEADER_CHECKS := $(PUBLIC_HEADERS:libzinf/include/zinf/%.hpp=$(BUILD)/headers/%.ok)

# tests/unit/test_NAME.cpp -> build/tests/test_NAME (Boost.Test, one per module);
# tests/unit/mpi_NAME.cpp -> build/tests/mpi_NAME, run under mpirun -np 2 and 4
# (built only with MPI).
TEST_SRCS := $(wildcard tests/unit/test_*.cpp) $(if $(MPICXX),$(wildcard tests/unit/mpi_*.cpp))
TESTS := $(TEST_SRCS:tests/unit/%.cpp=$(BUILD)/tests/%)

.PHONY: all bench tests deps deps-check test test-run demo demo-run install uninstall clean help
.DEFAULT_GOAL := all

all: check-headers $(PROGRAMS) $(BENCHES)
bench: $(BENCHES)
tests: $(TESTS) $(PROGRAMS) $(BENCHES) $(HEADER_CHECKS) sanitized-tests

# The tests also run under the sanitizers, each in build/san-<name>/:
#   make test      the suites below, built from only the modules they use
#                  (a library per module set, so sets never mix)
#   make sanitize  every unit and MPI suite under ASan+UBSan, and every suite
#                  whose code starts threads under ThreadSanitizer
#   make test SANITIZE=...   every unit and MPI suite under that one
# A report fails the suite (scripts/run-tests.sh sets halt_on_error).
# make test keeps ThreadSanitizer over the threaded core (the io queues, the
# pinned pool: test_io, test_mem), built from those 20 library files alone.
# Everything else runs in `make sanitize`: ASan+UBSan over every suite (what
# found the bugs RELIABILITY.md lists: test_optim, test_plan, mpi_comm, the MPI
# allgather), and TSan over test_device (which caught the SIMD resolvers dying
# before main) and the other threaded suites. The sanitized builds were 2 min 50 s
# of make test's 8-minute build on 2 cores; this one is about half of that.
SANITIZERS := thread
san_dir = $(BUILD)/san-$(firstword $(subst $(comma), ,$(1)))
SANITIZED_TESTS_thread := test_io test_mem
SANITIZED_MODULES_thread := util io mem
THREADED_SUITES := test_io test_mem test_device test_comm test_optimizer test_optimizer_faults test_engine \
  test_model test_sample $(if $(MPICXX),mpi_comm mpi_optim mpi_train)
# Built by clang where FAST_CXX is clang and clang's OpenMP runtime is there
# (libomp-dev, which scripts/deps.sh installs beside clang): the same
# ThreadSanitizer, 75 CPU-s to build the subset against GCC's 85, and its
# two suites 9 CPU-s against 14 (BENCHMARKS.md).
# (and clang's ThreadSanitizer runtime, libclang-rt-dev: without it nothing links)
SAN_CXX := $(if $(and $(findstring clang,$(notdir $(FAST_CXX))),$(wildcard /usr/lib/llvm-*/lib/libomp.so),$(CLANG_RT_TSAN)),$(FAST_CXX),$(CXX))
sanitized-tests:
ifeq ($(SANITIZE),)
	$(Q)$(foreach s,$(SANITIZERS),$(MAKE) --no-print-directory SANITIZE=$(s) CXX=$(SAN_CXX) BUILD=$(call san_dir,$(s)) \
	  SANITIZED_MODULES="$(SANITIZED_MODULES_$(firstword $(subst $(comma), ,$(s))))" \
	  $(SANITIZED_TESTS_$(firstword $(subst $(comma), ,$(s))):%=$(call san_dir,$(s))/tests/%) &&) true
endif
SANITIZED_RUN := $(foreach s,$(SANITIZERS),$(SANITIZED_TESTS_$(firstword $(subst $(comma), ,$(s))):%=$(call san_dir,$(s))/tests/%))

sanitize: deps-check
	$(Q)$(MAKE) --no-print-directory SANITIZE=address,undefined test-run
	$(Q)$(MAKE) --no-print-directory SANITIZE=thread SUITES="$(THREADED_SUITES)" test-run
.PHONY: sanitized-tests sanitize

# Each public header compiles on its own (docs/ARCHITECTURE.md): one stamp per header.
$(BUILD)/headers/%.ok: libzinf/include/zinf/%.hpp $(FLAGS_STAMP)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  HDR     $<")
	$(Q)echo '#include <zinf/$(notdir $<)>' | $(FAST_CXX) $(CPPFLAGS) $(CXXFLAGS) -fsyntax-only -x c++ - -MF /dev/null && touch $@

# Objects are kept between builds even when only a link needed them.
# (.PRECIOUS, not a bare .SECONDARY: that one also let make skip an object
# still missing, e.g. of a library file just added, when the library was newer.)
.PRECIOUS: $(BUILD)/%.o $(BUILD)/%.gch $(BUILD)/%.pch

check-headers:
ifneq ($(MISSING_HEADERS),)
	@echo "zinf: missing headers: $(MISSING_HEADERS)" >&2
	@echo "zinf: run 'make deps' to install the Debian packages that provide them" >&2
	@exit 1
endif
.PHONY: check-headers

$(BUILD)/%.o: %.cpp $(FLAGS_STAMP)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CXX     $<")
	$(Q)$(LAUNCH) $(OBJ_CXX) $(CPPFLAGS) $(CXXFLAGS) -c $< -o $@
OBJ_CXX = $(CXX)

$(LIB): $(LIB_OBJS)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  AR      $@")
	$(Q)rm -f $@ && ar rcs $@ $^

# The library's JSON code first in every link: the linker keeps the first
# copy it meets of each template function that several objects instantiate
# (nlohmann/json's lexer, parser and dumper), and the programs' and tests'
# own files, first on the line, are -O0, so the library's -O2 manifest
# reader ran on their -O0 copies: zinf-shard inspect of the 98,561 records
# of paper-1t at dp 16 took 2.85 CPU-s, 1.34 with util/json.o (-O1) first;
# layout 2.29 -> 0.74 (BENCHMARKS.md). (It is in $(LIB) too: the archive's
# member is then never pulled. A library of modules without util, as a
# sanitized subset may be, has none to put first.)
LINK_FIRST := $(filter $(BUILD)/libzinf/src/util/json.o,$(LIB_OBJS))

define program_rule
$(BIN)/$(call program_name,$(1)): $(patsubst %.cpp,$(BUILD)/%.o,$(wildcard $(1)/*.cpp)) $(LIB)
	@mkdir -p $$(@D)
	@$$(if $$(Q),echo "  LD      $$@")
	$$(Q)$$(LAUNCH) $$(CXX) $$(LDFLAGS) $$(LINK_FIRST) $$^ $$(LDLIBS) -o $$@
endef
$(foreach d,$(PROGRAM_DIRS),$(eval $(call program_rule,$(d))))

$(BIN)/zinf-%: $(BUILD)/bench/%.o $(LIB)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(LAUNCH) $(CXX) $(LDFLAGS) $(LINK_FIRST) $^ $(LDLIBS) -o $@

$(BUILD)/tests/%: $(BUILD)/tests/unit/%.o $(LIB)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(LAUNCH) $(CXX) $(LDFLAGS) $(LINK_FIRST) $^ $(LDLIBS) -lboost_unit_test_framework -o $@

# Precompiled headers: pch/NAME.hpp is compiled once per build folder into
# $(BUILD)/pch/NAME.hpp.gch with the flags of the objects that use it, and put
# before each of them with -include (GCC takes the .gch, or reads the text
# when it does not fit, and -Winvalid-pch says so). `private`: the objects'
# -include is not inherited by the .gch they depend on.
#   tests:    every unit and MPI test (Boost.Test, JSON, the public headers), -O0:
#             their own code is checks and small fixtures (the library they call
#             is built as always); -O0 compiles them a quarter faster than -O1.
#             Not the tests whose own code computes: test_llama's float64
#             reference model (21 CPU-s at -O1, 127 at -O0), test_shard_disk,
#             test_optim, test_optimizer_faults and mpi_comm (their -O0 runs cost more
#             than the compile saves): -O1, with the same header made at -O1
#             (tests-o1.hpp: a header must match its files' -O).
#   programs: every program and benchmark file that parses options (CLI11, JSON,
#             the public headers), -O0 like the tests: a program parses options,
#             calls the library and prints. CLI11 2.1 is header-only and builds
#             its validators in every file that includes it (3 s each), so the
#             programs' other files include only what they use, without it.
#             Not the files whose loops run over data (the pattern fills and
#             checks of pinstress and nvmebench, commbench's fills and checks,
#             optbench's OpenMP loops, bench/optbench/): -O2.
TEST_OBJS := $(TEST_SRCS:tests/unit/%.cpp=$(BUILD)/tests/unit/%.o)
TEST_O1_OBJS := $(patsubst %,$(BUILD)/tests/unit/%.o,test_llama test_shard_disk test_optim test_optimizer_faults mpi_comm)
TEST_O0_OBJS := $(filter-out $(TEST_O1_OBJS),$(TEST_OBJS))
PROGRAM_SRCS := $(foreach d,$(PROGRAM_DIRS),$(wildcard $(d)/*.cpp)) $(BENCH_SRCS)
PROGRAM_OBJS := $(patsubst %.cpp,$(BUILD)/%.o,$(shell grep -l '^#include <CLI/CLI.hpp>' $(PROGRAM_SRCS)))
PROGRAM_O0_OBJS := $(filter-out $(patsubst %,$(BUILD)/%.o,pinstress/stress nvmebench/sweep commbench/harness),\
  $(patsubst %.cpp,$(BUILD)/%.o,$(PROGRAM_SRCS)))
$(PROGRAM_O0_OBJS) $(BUILD)/pch/programs.hpp.$(PCH_EXT): private CXXFLAGS += -O0
$(TEST_OBJS) $(BUILD)/pch/tests.hpp.$(PCH_EXT) $(BUILD)/pch/tests-o1.hpp.$(PCH_EXT): private CPPFLAGS += -DBOOST_TEST_DYN_LINK
$(TEST_O0_OBJS) $(BUILD)/pch/tests.hpp.$(PCH_EXT): private CXXFLAGS += -O0
$(TEST_O1_OBJS) $(BUILD)/pch/tests-o1.hpp.$(PCH_EXT): private CXXFLAGS += -O1
define use_pch  # name, objects
$(2): private CPPFLAGS += -include $(BUILD)/pch/$(1).hpp -Winvalid-pch
$(2): $(BUILD)/pch/$(1).hpp.$(PCH_EXT)
endef
# (not in make test's sanitized builds: two test files do not pay for a header)
$(if $(SANITIZED_MODULES),,$(eval $(call use_pch,tests,$(TEST_O0_OBJS))))
$(if $(SANITIZED_MODULES),,$(eval $(call use_pch,tests-o1,$(TEST_O1_OBJS))))
$(eval $(call use_pch,programs,$(PROGRAM_OBJS)))
$(BUILD)/pch/%.hpp.$(PCH_EXT): pch/%.hpp $(FLAGS_STAMP)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  PCH     $<")
	$(Q)echo '#include "$(CURDIR)/$<"' >$(@:.$(PCH_EXT)=)
	$(Q)$(LAUNCH) $(OBJ_CXX) $(CPPFLAGS) $(CXXFLAGS) $(PCH_FLAGS) -x c++-header $(@:.$(PCH_EXT)=) -o $@
# clang's header also holds the templates it instantiates (what each file
# then need not instantiate again; the code is still each file's own): a
# tenth off a library file's compile, measured in pairs; a clean `make`
# 163 -> 140 s.
PCH_FLAGS := $(if $(filter pch,$(PCH_EXT)),-fpch-instantiate-templates)
$(TEST_OBJS) $(PROGRAM_O0_OBJS) $(BUILD)/pch/tests.hpp.$(PCH_EXT) $(BUILD)/pch/tests-o1.hpp.$(PCH_EXT) \
  $(BUILD)/pch/programs.hpp.$(PCH_EXT): private OBJ_CXX = $(FAST_CXX)

# The library's files that parse and print (JSON manifests, plans, configs,
# headers, locks, specs, the commit protocol, the pool's and arena's reports),
# no loops over data: -O1; the cli module's, which only declare and parse options (CLI11):
# -O0, as the programs. Their codegen is most of their compile time.
LIB_O0_OBJS := $(patsubst %,$(BUILD)/libzinf/src/cli/%.o,cli options device_options zero_options)
LIB_O1_OBJS := $(patsubst %,$(BUILD)/libzinf/src/%.o,util/json util/log util/error util/size util/sys util/proc \
  shard/manifest shard/safetensors shard/lock shard/commit shard/init shard/disk shard/verify shard/reshard \
  shard/hf shard/llmc shard/model shard/llama train/run plan/plan io/config mem/arena mem/pool)
$(LIB_O0_OBJS): CXXFLAGS += -O0
$(LIB_O0_OBJS): private OBJ_CXX = $(FAST_CXX)
$(LIB_O1_OBJS): CXXFLAGS += $(if $(filter 1,$(DEBUG)),,-O1)

# The rest of the library by clang too, where FAST_CXX is clang, with a
# precompiled header of nlohmann/json, the public headers and the standard
# library (pch/library.hpp; one per -O, which clang's header must match):
# half of such a file's compile was parsing those, and clang's header costs
# little to load (it reads what the file uses), where GCC's 120 MB one cost
# most of what it saved. A clean `make` went 221 -> 163 s, 432 -> 312 CPU-s
# (BENCHMARKS.md, "The library by clang"). GCC keeps what computes and whose
# bits the tests pin, with their own flags: the device kernels (device/, the
# .cu files nvcc's), the optimizer (optim/, zero/optimizer's OpenMP), the
# normal generator, bf16 and the host reductions; and util/json, whose copies
# of nlohmann/json's functions every link takes first (LINK_FIRST, below):
# clang's -O1 object left more of them to the programs' -O0 copies, and
# `zinf-shard layout` of paper-1t at dp 16 went 0.82 -> 1.3 CPU-s. None of
# the rest does floating point that the compiler may reorder: both compilers
# round each operation, and x86-64-v2 has no fused multiply-add (every
# suite's bits stayed the same).
ifneq ($(findstring clang,$(notdir $(FAST_CXX))),)
LIB_GCC_OBJS := $(filter-out $(CUDA_HOST_OBJS),\
  $(filter $(BUILD)/libzinf/src/device/% $(BUILD)/libzinf/src/optim/% %_cuda.o,$(LIB_OBJS))) \
  $(patsubst %,$(BUILD)/libzinf/src/%.o,shard/generate util/bf16 comm/host_math zero/optimizer util/json)
LIB_FAST_OBJS := $(filter-out $(LIB_GCC_OBJS) $(LIB_O0_OBJS),$(LIB_OBJS))
$(LIB_FAST_OBJS) $(BUILD)/pch/library.hpp.$(PCH_EXT) $(BUILD)/pch/library-o1.hpp.$(PCH_EXT): private OBJ_CXX = $(FAST_CXX)
$(BUILD)/pch/library-o1.hpp.$(PCH_EXT): private CXXFLAGS += $(if $(filter 1,$(DEBUG)),,-O1)
# (Under a sanitizer every file is -O1: one header serves them all.)
LIB_FAST_O1_OBJS := $(if $(SANITIZE),$(LIB_FAST_OBJS),$(filter $(LIB_O1_OBJS),$(LIB_FAST_OBJS)))
$(eval $(call use_pch,library,$(filter-out $(LIB_FAST_O1_OBJS),$(LIB_FAST_OBJS))))
$(eval $(call use_pch,library-o1,$(LIB_FAST_O1_OBJS)))
endif

# The stamp holds the per-file choices too: an object that leaves the
# precompiled header has a dependency file that names none of the headers the
# .gch held (GCC lists only what it read as text), so only a rebuild makes it
# whole again.
FLAGS_NOW := $(CXX) $(FAST_CXX) $(CPPFLAGS) $(CXXFLAGS) $(LDFLAGS) $(LDLIBS) pch: $(PROGRAM_OBJS) -O0: $(PROGRAM_O0_OBJS) $(TEST_O0_OBJS) $(LIB_O0_OBJS) -O1: $(TEST_O1_OBJS) $(LIB_O1_OBJS) clang: $(LIB_FAST_OBJS)
ifneq ($(file <$(FLAGS_STAMP)),$(FLAGS_NOW))
$(shell mkdir -p $(BUILD))
$(file >$(FLAGS_STAMP),$(FLAGS_NOW))
endif

# The normal generator: vectorised at -O3 with its own log and sincos, and no
# fused multiply-add, so its values are the same bits whichever clone runs.
$(BUILD)/libzinf/src/shard/generate.o: CXXFLAGS += -O3 -fno-math-errno -fno-trapping-math -ffp-contract=off
$(BUILD)/libzinf/src/util/bf16.o $(BUILD)/libzinf/src/comm/host_math.o: CXXFLAGS += -O3
# AdamW: -O3, OpenMP, and no fused multiply-add, so that every instruction-set
# path rounds as the portable one does (optim.hpp).
$(BUILD)/libzinf/src/optim/%.o: CXXFLAGS += -O3 -fopenmp -ffp-contract=off -fno-math-errno
# The device kernels: the same, so that a kernel's bits do not depend on the
# instruction set either (device.hpp: deterministic for any thread count);
# -fno-trapping-math lets GCC turn float compares into selects, which GELU's
# clamp needs to vectorise (no value changes: only FP exception flags).
# (Not the cuda backend's host files: they call CUDA's runtime and cuBLASLt,
# and compute nothing.)
$(filter-out $(CUDA_HOST_OBJS),$(filter $(BUILD)/libzinf/src/device/%,$(LIB_OBJS))): \
  CXXFLAGS += -O3 -fopenmp -ffp-contract=off -fno-math-errno -fno-trapping-math
# The optimizer step hashes what it writes on OpenMP threads.
$(BUILD)/libzinf/src/zero/optimizer.o: CXXFLAGS += -fopenmp
# zinf-optbench's OpenMP loops, in a file of their own (bench/optbench/loops.hpp).
$(BIN)/zinf-optbench: $(BUILD)/bench/optbench/loops.o
$(BUILD)/bench/optbench/loops.o: CXXFLAGS += -fopenmp

# The corpus tests/e2e/tokenize.sh tokenizes with zinf and with the reference
# tokenizers, and scripts/bench-tokenize.sh times (tests/tools/text_corpus.cpp).
tests: $(BUILD)/tests/text-corpus
$(BUILD)/tests/text-corpus: $(BUILD)/tests/tools/text_corpus.o $(LIB)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(LAUNCH) $(CXX) $(LDFLAGS) $(LINK_FIRST) $^ $(LDLIBS) -o $@

# The reference tokenizers (npm packages) in .cache/tokenizer-refs: `make test`
# tries first and goes on without them (scripts/tokenizer-refs.sh).
tokenizer-refs:
	scripts/tokenizer-refs.sh --strict
.PHONY: tokenizer-refs

# --- fuzzers (tests/fuzz/README.md) -------------------------------------------
# tests/fuzz/fuzz_NAME.cpp: one libFuzzer target each. `make test` replays
# every committed corpus through one g++ binary that holds them all
# (tests/e2e/fuzz.sh); `make fuzz` builds each target with clang, libFuzzer,
# ASan and UBSan in $(BUILD)/fuzz and runs it (tests/fuzz/run.sh).
FUZZ_SRCS := $(wildcard tests/fuzz/fuzz_*.cpp)
FUZZ_TARGETS := $(FUZZ_SRCS:tests/fuzz/fuzz_%.cpp=%)
FUZZ_SECONDS ?= 60
FUZZ_JOBS ?= 2
# The targets link the whole library: the linker takes what they call, so no
# list of modules can fall behind the code (plan/ calling into model/ and
# zero/ broke `make fuzz` unseen while such a list left them out).
tests: $(BUILD)/tests/fuzz-replay
$(BUILD)/tests/fuzz-replay: $(patsubst %.cpp,$(BUILD)/%.o,tests/fuzz/targets.cpp tests/fuzz/common.cpp tests/fuzz/replay.cpp) $(LIB)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(LAUNCH) $(CXX) $(LDFLAGS) $(LINK_FIRST) $^ $(LDLIBS) -o $@
$(BUILD)/tests/fuzz/targets.o: tests/fuzz/targets.cpp $(FUZZ_SRCS) $(FLAGS_STAMP)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CXX     $< ($(FUZZ_TARGETS))")
	$(Q)$(LAUNCH) $(FAST_CXX) $(CPPFLAGS) $(CXXFLAGS) $(FUZZ_SRCS:%=-include %) -c $< -o $@
ifeq ($(FUZZ_CLANG),1)
CXXFLAGS += -fsanitize=fuzzer-no-link -fno-sanitize-recover=all
$(BUILD)/tests/fuzz/fuzz_%.o: CPPFLAGS += -DZINF_LIBFUZZER
endif
$(BUILD)/fuzz-%: $(BUILD)/tests/fuzz/fuzz_%.o $(BUILD)/tests/fuzz/common.o $(LIB)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CXX) $(LDFLAGS) -fsanitize=fuzzer $^ $(LDLIBS) -o $@
# make test links every target's code with libFuzzer's driver and clang, as
# make fuzz does, against this build's library (the same objects, without the
# fuzz build's instrumentation, which changes no symbol): a target or a
# library change that would not link fails make test, not the next fuzz
# campaign. One binary holds them all (the replay build's targets.o, the first
# byte of an input picking the target): one link, where one compile and link a
# target took 3.3 CPU-s each. Where clang or libFuzzer's runtime is missing
# the build says so (above).
ifneq ($(FUZZ_LINKER),)
tests: $(BUILD)/fuzz-link/fuzz-all
$(BUILD)/fuzz-link/libfuzzer_all.o: tests/fuzz/libfuzzer_all.cpp $(FLAGS_STAMP)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CXX     $< (libFuzzer)")
	$(Q)$(LAUNCH) $(FUZZ_LINKER) $(CPPFLAGS) $(CXXFLAGS) -O0 -c $< -o $@
$(BUILD)/fuzz-link/fuzz-all: $(BUILD)/fuzz-link/libfuzzer_all.o $(BUILD)/tests/fuzz/targets.o $(BUILD)/tests/fuzz/common.o $(LIB)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(LAUNCH) $(FUZZ_LINKER) $(LDFLAGS) -fsanitize=fuzzer $(LINK_FIRST) $^ $(LDLIBS) -o $@
endif
# (the recipes name $(MAKE) themselves: make passes its jobs only to those)
FUZZ_MAKE := --no-print-directory FUZZ_CLANG=1 CXX=clang++ NO_CUDA=1 NO_MPI=1 SANITIZE=address,undefined \
  BUILD=$(BUILD)/fuzz
fuzz: deps-check
	$(Q)$(MAKE) $(FUZZ_MAKE) $(FUZZ_TARGETS:%=$(BUILD)/fuzz/fuzz-%)
	nice -n 10 tests/fuzz/run.sh --seconds $(FUZZ_SECONDS) --jobs $(FUZZ_JOBS) --bin $(BUILD)/fuzz $(FUZZ_TARGETS)
# What `make fuzz` compiles, parsed by clang with its flags and no code made
# (-fsyntax-only, a stamp a file, again only when the file or a header it
# includes changes): tests/e2e/targets.sh runs it in `make test`, so that a
# change clang 14 cannot build fails there, not on the next fuzz campaign
# (issue 29: __builtin_cpu_supports("x86-64-v4") broke make fuzz unseen).
# FUZZ_SYNTAX=quick (what make test runs) parses every header of the
# library, public and private, in one file, and the fuzz targets when the
# tests' build has not: where FAST_CXX is clang it compiles them all already
# (tests/fuzz/targets.o, for fuzz-replay), which the targets' own parse
# (about 20 CPU-s from a clean clone) only repeated with the fuzz build's
# flags. The 28 library files as well are 70 CPU-s more: a construct clang
# 14 refuses inside one of those is found by make fuzz-syntax or make fuzz,
# not by make test.
FUZZ_SYNTAX ?= all
fuzz-syntax:
	$(Q)$(MAKE) $(FUZZ_MAKE) FUZZ_SYNTAX=$(FUZZ_SYNTAX) FUZZ_REPLAY_CXX=$(FAST_CXX) fuzz-syntax-run
# (the list made by the inner make, whose NO_CUDA=1 picks the *_none.cpp twins)
FUZZ_SYNTAX_SRCS := $(if $(filter quick,$(FUZZ_SYNTAX)),$(if $(findstring clang,$(notdir $(FUZZ_REPLAY_CXX))),,$(FUZZ_SRCS)),\
  $(FUZZ_SRCS) $(LIB_SRCS))
fuzz-syntax-run: $(patsubst %.cpp,$(BUILD)/syntax/%.ok,$(FUZZ_SYNTAX_SRCS)) $(BUILD)/syntax/headers.ok
$(BUILD)/syntax/headers.ok: $(PUBLIC_HEADERS) $(wildcard libzinf/src/*/*.hpp) $(FLAGS_STAMP)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  SYNTAX  every header of libzinf")
	$(Q)printf '#include "%s"\n' $(abspath $(filter %.hpp,$^)) | $(CXX) $(CPPFLAGS) $(CXXFLAGS) -fsyntax-only -x c++ - -MF /dev/null && touch $@
$(BUILD)/syntax/%.ok: %.cpp $(FLAGS_STAMP)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  SYNTAX  $<")
	$(Q)$(CXX) $(CPPFLAGS) $(CXXFLAGS) -fsyntax-only -MMD -MP -MF $(@:.ok=.d) -MT $@ $< && touch $@
ifeq ($(FUZZ_CLANG),1)
$(BUILD)/syntax/tests/fuzz/fuzz_%.ok: CPPFLAGS += -DZINF_LIBFUZZER
endif
.PHONY: fuzz fuzz-syntax fuzz-syntax-run

# --- the two quick-start commands --------------------------------------------
deps:
	scripts/deps.sh
	scripts/tokenizer-refs.sh

# Installs packages only when something is missing, then re-enters make so
# that detection sees what was just installed.
deps-check:
	@scripts/deps.sh --check 2>/dev/null || scripts/deps.sh

test: deps-check
	@scripts/tokenizer-refs.sh
	@$(MAKE) --no-print-directory test-run

ifeq ($(SANITIZE),)
test-run: tests
	@ZINF_SANITIZED="$(SANITIZED_RUN)" scripts/run-tests.sh
else
# Every unit and MPI suite (or SUITES) under the sanitizer, with a longer
# limit each (a sanitizer runs them 2-15 times slower); no e2e.
SUITES ?= $(TEST_SRCS:tests/unit/%.cpp=%)
test-run: $(SUITES:%=$(BUILD)/tests/%)
	@ZINF_UNIT_TESTS="$(filter $(BUILD)/tests/test_%,$^)" ZINF_MPI_TESTS="$(filter $(BUILD)/tests/mpi_%,$^)" ZINF_E2E=0 \
	  ZINF_UNIT_TIMEOUT=$${ZINF_UNIT_TIMEOUT:-900} scripts/run-tests.sh
endif

demo: deps-check
	@$(MAKE) --no-print-directory demo-run

demo-run: all
	@scripts/demo.sh

# The reliability campaigns beyond `make test` (which runs 4 crash trials of
# each kind and the 8 dying-rank cases): N SIGKILL trials of each, and a soak
# of MINUTES minutes (nice'd: kills and resumes beside zinf-pinstress).
CRASH_TRIALS ?= 100
SOAK_MINUTES ?= 30
crash-trials: $(BIN)/zinf-shard $(BIN)/zinf-train $(BIN)/zinf-sample
	scripts/crash-trials.sh $(CRASH_TRIALS)
soak: $(BIN)/zinf-shard $(BIN)/zinf-train $(BIN)/zinf-pinstress
	nice scripts/soak.sh $(SOAK_MINUTES)
.PHONY: crash-trials soak

# --- install ---------------------------------------------------------------
install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig \
	  $(DESTDIR)$(PREFIX)/include/zinf $(DESTDIR)$(PREFIX)/share/man/man1 \
	  $(DESTDIR)$(PREFIX)/share/man/man5 $(DESTDIR)$(PREFIX)/share/man/man7
	install -m 755 $(PROGRAMS) $(BENCHES) $(DESTDIR)$(PREFIX)/bin/
	install -m 644 $(LIB) $(DESTDIR)$(PREFIX)/lib/
	install -m 644 libzinf/include/zinf/*.hpp libzinf/include/zinf/*.def $(DESTDIR)$(PREFIX)/include/zinf/
	for s in 1 5 7; do for f in $$(ls man/*.$$s 2>/dev/null); do \
	  install -m 644 $$f $(DESTDIR)$(PREFIX)/share/man/man$$s/; done; done
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' -e 's|@LIBS_PRIVATE@|$(LDLIBS)|g' scripts/zinf.pc.in \
	  > $(DESTDIR)$(PREFIX)/lib/pkgconfig/zinf.pc

uninstall:
	rm -f $(foreach p,$(PROGRAMS) $(BENCHES),$(DESTDIR)$(PREFIX)/bin/$(notdir $(p)))
	rm -f $(DESTDIR)$(PREFIX)/lib/libzinf.a $(DESTDIR)$(PREFIX)/lib/pkgconfig/zinf.pc
	rm -rf $(DESTDIR)$(PREFIX)/include/zinf
	rm -f $(foreach f,$(wildcard man/*.[157]),$(DESTDIR)$(PREFIX)/share/man/man$(subst .,,$(suffix $(f)))/$(notdir $(f)))

clean:
	rm -rf $(BUILD) $(BIN)

help:
	@sed -n '2,/^$$/p' Makefile | sed -e '/^$$/d' -e 's/^# \{0,1\}//'

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
