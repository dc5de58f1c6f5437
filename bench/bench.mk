# Benchmark suite targets (issue 5). Included from the Makefile with
#   include bench/bench.mk
# `make bench-suite` runs the quick suite (under 3 minutes on 2 cores), writes
# bench/results/{report.md,results.json,*.svg} and prints the headline table;
# `make bench-full` runs the full suite (up to 100k concurrent rooms; long).
GO ?= go
BENCH_OUT ?= bench/results
BENCH_FULL_OUT ?= bench/results/full

.PHONY: bench-suite bench-full

bench-suite:
	$(GO) run ./cmd/kvxfer-bench -suite quick -out $(BENCH_OUT)

bench-full:
	$(GO) run ./cmd/kvxfer-bench -suite full -out $(BENCH_FULL_OUT)
