# Entry points; CMake + Ninja do the real work.
#   make demo           setup, build, train 2 slots on Fashion-MNIST (tandem train), then a 2-rank all-reduce sweep
#   make test           setup, build, quick test tier (what CI runs)
#   make test-full      every test label
#   make test-tsan      the gradient-sync engine, the flight recorder and the engine's inline claim under ThreadSanitizer (CI runs it)
#   make test-gpu       tests/gpu: every CUDA kernel checked on the GPU and timed (needs only a CUDA toolkit)
#   make fuzz           libFuzzer targets (clang, ASan+UBSan), FUZZ_SECONDS each from the checked-in corpus (CI runs it)
#   make bench-kernels  reduction-kernel microbenchmarks
#   make install        PREFIX=/usr/local: libtandem.so, headers, CMake and pkg-config packages, tandem
#   make build | configure | setup | clean
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
CTEST_FLAGS ?= --output-on-failure -j1

# CUDA is auto-detected by CMake; make a toolkit in the usual place visible to it.
ifneq ($(wildcard /usr/local/cuda/bin/nvcc),)
export PATH := $(PATH):/usr/local/cuda/bin
endif

TANDEM := $(BUILD_DIR)/bin/tandem

.PHONY: all setup configure build demo test test-full test-tsan test-gpu fuzz bench-kernels install clean

all: build

setup:
	./scripts/setup.sh

# Configure once; afterwards ninja re-runs CMake itself when a CMakeLists changes.
$(BUILD_DIR)/build.ninja: | setup
	cmake -S . -B $(BUILD_DIR) -G Ninja $(CMAKE_FLAGS)

configure: setup
	cmake -S . -B $(BUILD_DIR) -G Ninja $(CMAKE_FLAGS)

build: $(BUILD_DIR)/build.ninja
	ninja -C $(BUILD_DIR) -j $(JOBS)

demo: build
	@if [ -x $(BUILD_DIR)/bin/tandem-train ]; then \
	  $(TANDEM) train trainer/examples/fashion_mnist.yaml --output $(BUILD_DIR)/demo-train; \
	else echo "tandem-train not built (needs libtorch-dev): skipping the training demo"; fi
	$(TANDEM) launch -n 2 -- $(TANDEM) bench allreduce -b 4K -e 64M -f 4 -n 20 -w 5 -c 1 \
	  --plot $(BUILD_DIR)/allreduce_busbw.png

test: build
	ctest --test-dir $(BUILD_DIR) -L quick $(CTEST_FLAGS)

test-full: build
	ctest --test-dir $(BUILD_DIR) $(CTEST_FLAGS)

# ThreadSanitizer build of the engine's tests (ranks as threads, no UCX traffic)
# and the flight recorder's. UCX's memory hooks crash TSan-built programs at
# thread exit, so they are switched off. (-Wno-tsan: the fences tandem uses on
# purpose, which TSan does not model, need no warning.)
TSAN_DIR ?= $(BUILD_DIR)-tsan
TSAN_ENV := UCX_MEM_EVENTS=no UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none TSAN_OPTIONS=halt_on_error=1
test-tsan: setup
	cmake -S . -B $(TSAN_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTANDEM_WITH_CUDA=OFF -DTANDEM_BUILD_BENCH=OFF \
	  -DCMAKE_CXX_FLAGS="-fsanitize=thread -O1 -Wno-tsan"
	ninja -C $(TSAN_DIR) -j $(JOBS) fusion_test flight_recorder_test allreduce_test
	$(TSAN_ENV) $(TSAN_DIR)/tests/fusion_test
	$(TSAN_ENV) $(TSAN_DIR)/tests/flight_recorder_test --gtest_filter='*DumpWhileRecording*'
	$(TSAN_ENV) $(TSAN_DIR)/tests/allreduce_test --gtest_filter='*KeepOrder*:*TwoOutstanding*'

# The GPU tier: a project of its own (nvcc, CMake, Ninja; none of tandem's other
# dependencies), so no setup. Without a GPU it builds and says so.
test-gpu:
	JOBS=$(JOBS) TANDEM_GPU_BUILD=$(abspath $(BUILD_DIR))-gpu ./tests/gpu/run.sh $(GPU_FLAGS)

# Fuzzing: every parser of outside bytes, with the seed corpus in fuzz/corpus (see fuzz/run.sh).
FUZZ_SECONDS ?= 25
fuzz: setup
	FUZZ_BUILD_DIR=$(BUILD_DIR)-fuzz JOBS=$(JOBS) ./fuzz/run.sh $(FUZZ_SECONDS)

bench-kernels: $(BUILD_DIR)/build.ninja
	ninja -C $(BUILD_DIR) -j $(JOBS) tandem-kernels-bench
	@bin=$$(find $(BUILD_DIR) -name tandem-kernels-bench -type f -perm -u+x | head -n 1); \
	  test -n "$$bin" || { echo "tandem-kernels-bench not found under $(BUILD_DIR)" >&2; exit 1; }; \
	  echo "$$bin"; "$$bin"

# Library, headers, CMake package, pkg-config file and the tandem executable.
PREFIX ?= /usr/local
install: build
	cmake --install $(BUILD_DIR) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD_DIR)
