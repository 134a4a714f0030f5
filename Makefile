# The two commands a newcomer needs: `make serve` and `make test`.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all bootstrap configure build test sanitize tsan serve bench format clean

all: build

bootstrap:
	@scripts/bootstrap.sh

configure: bootstrap
	@if [ ! -f $(BUILD_DIR)/build.ninja ]; then \
	  cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS); \
	fi

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	@ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

# $(call sanitized_build,DIR,FLAGS): the CPU build (no CUDA, no benchmarks) in DIR with
# FLAGS on every compile and link, configured on first use.
define sanitized_build
	@if [ ! -f $(1)/build.ninja ]; then \
	  cmake -S . -B $(1) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPAGELLM_CUDA=OFF \
	    -DPAGELLM_BUILD_BENCH=OFF -DCMAKE_CXX_FLAGS="$(2)" -DCMAKE_EXE_LINKER_FLAGS="$(2)"; \
	fi
	@cmake --build $(1) -j $(JOBS)
endef

# Every CPU test under AddressSanitizer and UBSan (build-asan/, about 20 minutes on 2
# cores); the servers the integration tests start run sanitized too.
ASAN_FLAGS = -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
sanitize: bootstrap
	$(call sanitized_build,build-asan,$(ASAN_FLAGS))
	@ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --test-dir build-asan --output-on-failure -j $(JOBS)

# The same under ThreadSanitizer (build-tsan/). libgomp is not instrumented, so OpenMP
# runs on one thread, and the six tests that start OpenMP teams of their own are left
# out (their barriers are invisible to TSan, which reports the writes of the team's threads
# against the reads after the region); tests/tsan.supp holds what is reported from inside
# the uninstrumented cpp-httplib.
TSAN_SKIPPED = CpuMatmul.ThreadCountDoesNotChangeResults|CpuMatmul.CallsFromInsideAParallelRegionComputeEveryOutput|CpuAttention.DecodeMatchesReferenceAndGeneralKernel|CpuKvCache.RopeWriteKvEqualsRopeThenWriteKv|CpuSample.RowsWithoutATemperatureAreLeftUntouched|CpuSample.MatchesAFullSortOnRandomRowsAndBatchesRowByRow
TSAN_FLAGS = -fsanitize=thread -fno-omit-frame-pointer
tsan: bootstrap
	$(call sanitized_build,build-tsan,$(TSAN_FLAGS))
	@OMP_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1 suppressions=$(CURDIR)/tests/tsan.supp" \
	  ctest --test-dir build-tsan --output-on-failure -j $(JOBS) -E '$(TSAN_SKIPPED)'

serve: build
	@$(BUILD_DIR)/pagellm serve $(ARGS)

bench: build
	@$(BUILD_DIR)/bench/pagellm_kv_memory_report
	@$(BUILD_DIR)/bench/pagellm_paging_bench
	@$(BUILD_DIR)/bench/pagellm_scheduler_bench
	@$(BUILD_DIR)/bench/pagellm_model_bench

format:
	@git ls-files '*.h' '*.cpp' '*.cu' '*.cuh' | xargs clang-format -i

clean:
	@rm -rf $(BUILD_DIR)
