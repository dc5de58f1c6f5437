# kvxfer — prefill-side KV-cache transfer engine.
# The two commands a user needs: `make demo` (the main job) and `make test` (everything CI runs).
GO    ?= go
PKGS  ?= ./...
BIN   ?= bin

.PHONY: wheel all deps deps-serving test-serving test-serving-smoke bench-serving deps-nixl deps-sglang bench bench-sglang bench-go build test test-sglang test-hosts unit race vet fmt-check fmt bench fuzz-smoke demo clean telemetry-counts

all: build

# Debian packages needed by cgo (pebbe/zmq4). Safe to re-run; skipped when already present.
deps:
	@if ! pkg-config --exists libzmq 2>/dev/null; then \
		apt-get update && apt-get install -y --no-install-recommends libzmq3-dev pkg-config; \
	fi

# NIXL's wheel in /opt/kvxfer-nixl, for the libnixl backend and its tests.
deps-nixl:
	@scripts/install-nixl.sh

# SGLang 0.5.18 and 0.5.23 (their real decode transfer code, --no-deps, import
# stubs for torch & co.) in cached venvs under /opt/kvxfer-sglang, for sgltest.
deps-sglang: deps-nixl
	@scripts/install-sglang.sh

# Where the libnixl backend finds NIXL's Python package (and so the library).
export KVXFER_NIXL_PYTHON ?= /opt/kvxfer-nixl/bin/python

build: deps
	$(GO) build $(PKGS)
	$(GO) build -o $(BIN)/ ./cmd/...

# The kvxfer wheel (python/): the SGLang plug-in with this platform's kvxferd
# inside (kvxfer/bin/kvxferd), in dist/. `pip install dist/kvxfer-*.whl` into
# SGLang's environment; see docs/sglang-plugin.md ("The wheel").
# Where SGLang runs there is no libzmq, so the wheel's kvxferd links a static
# libzmq (and libstdc++) built once into $(WHEEL_LIBZMQ) by
# scripts/build-libzmq-static.sh; glibc stays dynamic (kvxferd dlopens libnixl
# and libcuda). Only this target points pkg-config there: `make build` and the
# tests keep the system's shared libzmq. The binary goes to $(BIN)/wheel/ so
# that it is not mixed up with the dynamic $(BIN)/kvxferd. CGO_CFLAGS carries
# the static build's key because cmd/go does not hash pkg-config's output:
# without it, cgo packages built against the system libzmq would be reused.
# check-wheel-libs.sh then fails the build if kvxferd needs a library outside
# the manylinux set or a glibc newer than WHEEL_GLIBC, the glibc of the tag
# (manylinux_2_34: Go's cgo runtime needs GLIBC_2.34 when linked on glibc >= 2.34).
WHEEL_LIBZMQ ?= /opt/kvxfer-libzmq
WHEEL_GLIBC  ?= 2.34
wheel:
	KVXFER_LIBZMQ=$(WHEEL_LIBZMQ) scripts/build-libzmq-static.sh
	PKG_CONFIG_PATH=$(WHEEL_LIBZMQ)/lib/pkgconfig CGO_ENABLED=1 \
		CGO_CFLAGS="-O2 -g -DKVXFER_STATIC_LIBZMQ=$$(cat $(WHEEL_LIBZMQ)/cache-key)" \
		$(GO) build -trimpath -o $(BIN)/wheel/kvxferd ./cmd/kvxferd
	scripts/check-wheel-libs.sh $(BIN)/wheel/kvxferd $(WHEEL_GLIBC)
	python3 scripts/build-wheel.py $(BIN)/wheel/kvxferd dist $(WHEEL_GLIBC)

# Real SGLang servers end to end (serving/, docs/serving.md): full SGLang
# 0.5.23 and 0.5.18 venvs under /opt/kvxfer-serving (about 11 GB each, cached),
# a tiny Llama model made by the suite, the kvxfer wheel pip-installed into
# each venv as the README tells users. Monolithic vs PD with SGLang's own NIXL
# prefill vs PD with kvxfer's: token identity, a client-abort storm through
# SGLang's router, kvxferd SIGKILL and a decode restart under load.
# test-serving-smoke is CI's subset (one release, 20 prompts, 100 requests).
SERVING_PY ?= /opt/kvxfer-serving/0.5.23/bin/python
deps-serving:
	@scripts/install-serving.sh

test-serving: wheel deps-serving
	$(SERVING_PY) serving/suite.py --versions 0.5.23,0.5.18

test-serving-smoke: wheel
	@KVXFER_SERVING_VERSIONS=0.5.23 scripts/install-serving.sh
	$(SERVING_PY) serving/suite.py --versions 0.5.23 --prompts 20 --after 20 --storm 100 --smoke

# SGLang's own bench_serving against the router, SGLang's NIXL prefill and
# kvxfer's alternating (docs/benchmarks.md, "Served requests").
bench-serving: wheel deps-serving
	$(SERVING_PY) serving/bench.py

vet:
	$(GO) vet $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

fmt-check:
	@out="$$(gofmt -l $$(git ls-files '*.go'))"; \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

unit:
	$(GO) test -count=1 -timeout 10m $(PKGS)

race:
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

# Short runs of every fuzz target over its checked-in corpus plus a count of new
# inputs (a count, not a duration: see scripts/fuzz-smoke.sh for why).
fuzz-smoke:
	@./scripts/fuzz-smoke.sh 200000x

# `make test` is what CI runs: formatting, vet, the race-enabled test suite
# (SGLang's own decode classes against kvxferd included: sgltest) and a fuzz smoke.
test: deps-sglang fmt-check vet race fuzz-smoke

# SGLang's real decode code against kvxferd over NIXL, every release × scenario,
# with the matrix printed; fails (not skips) when the venvs are missing.
test-sglang: deps-sglang
	KVXFER_REQUIRE_SGLANG=1 $(GO) test -count=1 -v -timeout 20m -run TestSGLangDecode ./sgltest/

# The benchmark suite against the dict-based design: `make bench` is the quick
# suite (under 3 minutes on 2 cores; report in bench/results), `make bench-full`
# the rest, `make bench-sglang` SGLang's own Python prefill against kvxferd
# (bench/bench.mk). `make bench-go` runs the Go micro-benchmarks
# (Step cost, actor throughput, poll latency, loopback vs memcpy, ...).
include bench/bench.mk

bench: bench-suite

bench-go:
	$(GO) test -run='^$$' -bench=. -benchmem -count=3 $(PKGS)

# Telemetry's cost per room counted under cachegrind (instructions, cache
# misses): figures that do not move with the machine's load. Needs valgrind.
telemetry-counts:
	scripts/telemetry-counts.sh

# kvxferd (auto-detecting each decode's SGLang release), the prefill scheduler
# emulator and a mixed fleet of decode emulators (0.5.18, 0.5.22, 0.5.23) as
# separate processes, all built from emul/*.
demo: deps
	$(GO) build -o $(BIN)/ ./cmd/kvxferd ./cmd/kvxfer-sched ./cmd/kvxfer-decode ./cmd/kvxfer-demo
	$(BIN)/kvxfer-demo

clean:
	rm -rf $(BIN)

# The hostile suite (hostile/, docs/hostile.md): every attack F1-F10 replayed against a
# real kvxferd process while an honest workload runs; figures printed as a table
# (KVXFER_HOSTILE_DOC=docs/hostile.md writes them there). CI runs it after `make test`.
# `make soak` is the 5-minute soak (not in CI; KVXFER_SOAK_DURATION=1m shortens it).
.PHONY: test-hostile soak
test-hostile: deps
	$(GO) build -o $(BIN)/ ./cmd/kvxferd ./cmd/kvxfer-sched ./cmd/kvxfer-decode
	KVXFER_HOSTILE=1 $(GO) test -count=1 -v -timeout 20m ./hostile/

soak: deps
	$(GO) build -o $(BIN)/ ./cmd/kvxferd ./cmd/kvxfer-sched ./cmd/kvxfer-decode
	KVXFER_SOAK=1 $(GO) test -count=1 -v -timeout 30m -run TestSoak ./hostile/

# The two-host suite (hosts/, docs/hosts.md): kvxferd and its decodes
# in two network namespaces joined by a veth pair (192.0.2.1 / 192.0.2.2, made
# and removed by the test; skipped with the reason where namespaces cannot be
# created), real NIXL over UCX_TLS=tcp, SGLang's own decode and kvxfer-decode:
# one chunk, 200 rooms, aborts both ways, decode kill -9, a 10 s link cut,
# -host 0.0.0.0. KVXFER_HOSTS_DOC=docs/hosts.md writes the table there. CI runs it.
.PHONY: test-hosts
test-hosts: deps deps-sglang
	$(GO) build -o $(BIN)/ ./cmd/kvxferd ./cmd/kvxfer-sched ./cmd/kvxfer-decode
	KVXFER_HOSTS=1 $(GO) test -count=1 -v -timeout 10m ./hosts/
