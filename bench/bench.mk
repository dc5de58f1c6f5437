# Benchmark suite targets (docs/benchmarks.md). Included from the Makefile with
#   include bench/bench.mk
# `make bench-suite` runs the quick suite (under 3 minutes on 2 cores), writes
# bench/results/{report.md,results.json,*.svg} and prints the headline table;
# `make bench-full` runs the full suite (up to 100k concurrent rooms; long).
# `make bench-sglang` runs the fourth engine: SGLang 0.5.18's own Python
# prefill against kvxferd -nixl-backend nixl (tests/sglang/prefill_bench.py;
# about 10 minutes: 1,000 rooms a run, kvxfer at two spin windows), into bench/results/sglang-{report.md,results.json}. The
# quick suite does not run it (it needs the SGLang venv and takes longer than
# the quick suite's budget); it says so.
GO ?= go
BENCH_OUT ?= bench/results
BENCH_FULL_OUT ?= bench/results/full
SGLANG_BENCH_PY ?= /opt/kvxfer-sglang/0.5.18/bin/python
SGLANG_BENCH_ARGS ?= --reps 3 --rooms 1000 --concurrency 32

.PHONY: bench-suite bench-full bench-sglang

bench-suite:
	$(GO) run ./cmd/kvxfer-bench -suite quick -out $(BENCH_OUT)
	@if [ -x $(SGLANG_BENCH_PY) ]; then \
		echo "SGLang engine skipped in the quick suite: run 'make bench-sglang' (SGLang 0.5.18's prefill vs kvxferd -nixl-backend nixl)"; \
	else \
		echo "SGLang engine skipped: $(SGLANG_BENCH_PY) is absent (make deps-sglang, then make bench-sglang)"; \
	fi

bench-full:
	$(GO) run ./cmd/kvxfer-bench -suite full -out $(BENCH_FULL_OUT)

bench-sglang:
	@if [ ! -x $(SGLANG_BENCH_PY) ]; then \
		echo "bench-sglang: $(SGLANG_BENCH_PY) is absent; run 'make deps-sglang' first"; exit 1; fi
	$(GO) build -o bin/kvxferd ./cmd/kvxferd
	$(SGLANG_BENCH_PY) tests/sglang/prefill_bench.py --engine both --kvxferd bin/kvxferd $(SGLANG_BENCH_ARGS) --out $(BENCH_OUT)
