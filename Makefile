# gorun — see README.md.
GO      ?= go
BIN     := bin
PKGS    := ./...
# Packages with vector kernels built under GOEXPERIMENT=simd.
SIMD_PKGS := ./replay/ ./examples/dptrain/

.PHONY: all build pmi-lib bench-mpi-ompi test test-short bench bench-launch bench-rendezvous bench-comm bench-hotswap bench-placement bench-replay bench-protect bench-tier2 bench-ec bench-mpi bench-recovery bench-persist bench-torch chaos fuzz lint demo demo-hotswap demo-hello demo-train clean

all: build

# gorun links go-nvml (cgo), which resolves NVML's symbols when it loads
# libnvidia-ml.so.1: lazy binding lets the binary start on hosts without
# the driver even where the toolchain binds at load time by default.
GORUN_LDFLAGS := -extldflags=-Wl,-z,lazy

# gorun (whose agents replay differentials, --protect-mode diff) and dptrain
# (whose optimizer is replay's Adam kernel) get replay's AVX-512 kernels
# (GOEXPERIMENT=simd) where the toolchain has them: SIMD_PROBE succeeds.
# Elsewhere (another architecture, a Go without the experiment) they are
# built plainly and run the portable kernels, which give the same bits; a
# plain go build always works. Experiments already in GOEXPERIMENT are kept.
SIMD_PROBE := GOEXPERIMENT=simd $(GO) list simd/archsimd >/dev/null 2>&1

build:
	@if $(SIMD_PROBE); then simd=$${GOEXPERIMENT:+$$GOEXPERIMENT,}simd; else simd=$$GOEXPERIMENT; \
		echo "make build: this toolchain has no GOEXPERIMENT=simd for $$($(GO) env GOARCH): replay's portable kernels"; fi; \
	set -x; \
	GOEXPERIMENT=$$simd $(GO) build -ldflags='$(GORUN_LDFLAGS)' -o $(BIN)/gorun ./cmd/gorun && \
	GOEXPERIMENT=$$simd $(GO) build -o $(BIN)/dptrain ./examples/dptrain
	$(GO) build -o $(BIN)/hello ./examples/hello
	@$(MAKE) --no-print-directory pmi-lib

# The PMI-1 client library Open MPI 4 ranks load (libpmi/, issue 19),
# beside gorun, where its agents look for it. Without gcc it is skipped:
# the Go build never depends on it.
PMI_CC     ?= gcc
PMI_CFLAGS := -O2 -fPIC -shared -fvisibility=hidden -Wall
pmi-lib:
	@if command -v $(PMI_CC) >/dev/null; then set -x; mkdir -p $(BIN) && \
		$(PMI_CC) $(PMI_CFLAGS) -o $(BIN)/libgorun-pmi.so $(wildcard libpmi/*.c) -lpthread; \
	else echo "make build: no $(PMI_CC): $(BIN)/libgorun-pmi.so not built (Open MPI programs need it)"; fi

# The full suite, as CI runs it (multi-host tests need root and ip netns;
# they skip elsewhere unless GORUN_TESTCLUSTER_REQUIRE=1), then the
# packages with AVX-512 kernels built with them (GOEXPERIMENT=simd), which
# must give the portable code's bits, and the cgo-free build (CPU-only:
# no NVML).
test: lint
	$(GO) test -count=1 -timeout 20m $(PKGS)
	$(GO) test -count=1 -race -timeout 20m $(PKGS)
	GOEXPERIMENT=simd $(GO) test -count=1 -timeout 20m $(SIMD_PKGS)
	GOEXPERIMENT=simd $(GO) test -count=1 -race -short -timeout 20m $(SIMD_PKGS)
	CGO_ENABLED=0 $(GO) test -count=1 ./gpu/
	CGO_ENABLED=0 $(GO) build -o $(BIN)/gorun-static ./cmd/gorun
	$(BIN)/gorun-static -np 2 --oversubscribe true
	cd python && python3 -m unittest -q test_gorun_rank
	cd python && /usr/bin/python3 -m unittest -q test_gorun_torch test_gorun_torch_gloo

test-short:
	$(GO) test -short $(PKGS)

bench: bench-rendezvous bench-launch bench-comm bench-hotswap bench-placement bench-replay bench-protect bench-mpi bench-recovery bench-persist bench-torch

# Launch-to-exit time against Open MPI and MPICH Hydra (installs them with apt-get if missing).
bench-launch: build
	./scripts/bench-launch.sh
	$(MAKE) --no-print-directory bench-rendezvous

# An MPICH-built MPI hello (MPI_Init, a barrier, MPI_Finalize) under gorun
# -np 16 and 64 beside mpiexec.hydra, through gorun's PMI server (needs
# mpicc.mpich: apt-get install mpich libmpich-dev).
bench-mpi: build
	mpicc.mpich -O1 -o $(BIN)/mpi-hello cmd/gorun/testdata/mpi/hello.c
	$(GO) run ./internal/benchlaunch -gorun $(BIN)/gorun -prog $(BIN)/mpi-hello -mpich -n 16,64 -rounds 5 -timeout 60s -hang-runs 10 -mpi-hang-runs 5
	@$(MAKE) --no-print-directory bench-mpi-ompi

# The same hello built with Open MPI 4 (mpicc.openmpi: apt-get install
# openmpi-bin libopenmpi-dev) under gorun, through libgorun-pmi.so, beside
# mpirun.openmpi (target: no slower at 16 and 64, no gorun hang in 20 runs
# at 64).
bench-mpi-ompi: build
	mpicc.openmpi -O1 -o $(BIN)/mpi-hello-ompi cmd/gorun/testdata/mpi/hello.c
	$(GO) run ./internal/benchlaunch -gorun $(BIN)/gorun -prog $(BIN)/mpi-hello-ompi -openmpi -n 16,64 -rounds 5 -timeout 60s -hang-runs 20 -mpi-hang-runs 20

# 1,024 simulated agents × 8 ranks against the real embedded server.
bench-rendezvous:
	$(GO) test -run '^$$' -bench BenchmarkRendezvous -benchtime 5x ./internal/control/

# Ring Allreduce bus bandwidth for 1-256 MiB over 2 and 4 local ranks, beside
# single-stream loopback TCP and memcpy measured in the same run.
bench-comm:
	$(GO) test -run '^$$' -bench BenchmarkAllreduce -benchtime 5x -timeout 30m ./comm/

# The failure decisions (hotswap/): one host-loss cycle at 2,560 and 10,240
# ranks, per event, beside copying the rank table in the same run.
bench-hotswap:
	$(GO) test -run '^$$' -bench 'BenchmarkHostLoss|BenchmarkHeartbeat' ./hotswap/

# Replica placement and erasure-coding groups for 16,384 ranks on 2,048
# hosts in 64 racks (target: placement under 100 ms), beside MapRanks.
bench-placement:
	$(GO) test -run '^$$' -bench 'BenchmarkPlace|BenchmarkPlanEC' -benchtime 5x ./topology/

# Gradient compression beside copy(), the optimizer step, and fused against
# sequential replay of 4, 16 and 64 steps on 64M parameters (needs ~8 GiB),
# with the AVX-512 kernels.
bench-replay:
	GOEXPERIMENT=simd $(GO) test -run '^$$' -bench 'BenchmarkCompress|BenchmarkExpandRange|BenchmarkStep' -benchtime 3x -timeout 30m ./replay/
	GOEXPERIMENT=simd $(GO) test -run '^$$' -bench 'BenchmarkFusedKernel' -benchtime 2000x ./replay/
	GOEXPERIMENT=simd $(GO) test -run '^$$' -bench 'BenchmarkReplay' -benchtime 3x -timeout 30m ./replay/

# State protection: dptrain on 4 ranks over two namespace hosts (needs root
# and ip netns), 256 MiB of optimizer state per rank, step time with --protect
# --replicas 1 against without at --device-ms 500 and with CPU arithmetic
# instead; staging, commit, replication and overwrite-rule wait per step, and
# replication beside single-stream TCP (about 8 minutes).
# Host replacement: 8 ranks on 4 namespace hosts + 1 spare, 64 MiB of
# optimizer state per rank, 500 ms steps, one host killed at a random step:
# the recovery's phases and the time lost per failure, beside a
# checkpoint-restart baseline (checkpoint files every 100 steps) in the same
# run. Some minutes; root and ip netns needed. Then the control plane's
# cost of one recovery epoch (fence, publish, every agent's table, the new
# address fence) with 1,024 and 8,192 simulated ranks against the real
# server, beside the job's initial rendezvous at the same scale.
bench-recovery: build
	GORUN_BENCH_RECOVERY=1 $(GO) test -count=1 -run '^TestBenchRecovery$$' -v -timeout 40m ./cmd/gorun/
	$(GO) test -run '^$$' -bench BenchmarkRecoveryEpoch -benchtime 3x -timeout 20m ./internal/control/

# PyTorch (issue 18): examples/torch/train.py, 4 ranks on 2 namespace hosts
# + 1 spare, 38 MB of parameters and AdamW state per rank: the protected
# script's mean step time beside the plain one's, and the time from a host
# loss to the first new step after resume under gorun (spare, state from
# memory) beside a torchrun-style restart reloading a torch.save checkpoint
# written every 10 steps, in one run (needs /usr/bin/python3 with torch:
# apt-get install python3-torch; root and ip netns; a few minutes).
bench-torch: build
	GORUN_BENCH_TORCH=1 $(GO) test -count=1 -run '^TestBenchTorch$$' -v -timeout 30m ./cmd/gorun/

bench-protect: build
	$(GO) run ./internal/benchprotect -gorun $(BIN)/gorun -dptrain $(BIN)/dptrain
	@$(MAKE) --no-print-directory bench-tier2

# A restore from another host (Tier 2) at 256 MiB of optimizer state: full
# mode's beside diff mode's with 1 and 16 differentials replayed (with the
# AVX-512 kernels where the toolchain has them, as make build).
bench-tier2:
	@if $(SIMD_PROBE); then simd=$${GOEXPERIMENT:+$$GOEXPERIMENT,}simd; else simd=$$GOEXPERIMENT; fi; \
	GOEXPERIMENT=$$simd GORUN_BENCH_STATE_MIB=256 $(GO) test -run '^$$' -bench BenchmarkTier2Restore -benchtime 5x -timeout 20m -v ./internal/keeper/ | grep -v '^=== '

# The durable tier (--ckpt-dir, issue 17): one 1 GiB checkpoint saved by
# package durable beside dd if=/dev/zero bs=4M conv=fsync of 1 GiB to the
# same directory, alternating in one run (target: the save at ≥ 90% of dd's
# throughput), at 1 to 8 writers and 1 to 16 MiB chunks. GORUN_BENCH_DIR
# picks the directory (default: a temporary one under /tmp, removed after).
# Then dptrain's step time on 2 namespace hosts of 2 ranks with 256 MiB of
# optimizer state each, protected (full mode), without --ckpt-dir and with
# a base every 10 steps at the automatic concurrency and at
# --ckpt-concurrency 1, 2 and 4, in one run: 2 rounds of the 5 runs, each
# run compared with the run without --ckpt-dir of its round, after a
# warm-up run (benchprotect -ckpt; target: at most 3% more, PCcheck's
# figure; root, ~10 min). The checkpoint directories go under
# GORUN_BENCH_DIR too (default: the temporary directory).
# Last, the resume time from disk, what each agent does per rank in gorun
# --resume (cascade.Load): a 256 MiB dptrain state's committed base loaded
# and 0, 16 and 64 lossless differentials replayed, each beside the base's
# load alone in the same iterations (ratio), with the AVX-512 replay
# kernels where the toolchain has them, as make build (the files were just
# written: mostly read from the page cache). cascade.Load reads the log one
# batch at a time and no further than the target: B/op is about one batch
# (16 differentials, ~1.4 GiB), whatever the number replayed, and the time
# grows with it.
bench-persist: build
	$(GO) test -run '^$$' -bench BenchmarkPersist -benchtime 3x -timeout 30m ./durable/ | grep -v '^=== '
	$(GO) run ./internal/benchprotect -gorun $(BIN)/gorun -dptrain $(BIN)/dptrain -ckpt auto,1,2,4 -ckpt-every 10 -steps 60 -cpu-compute 0 $${GORUN_BENCH_DIR:+-ckpt-dir $$GORUN_BENCH_DIR}
	@if $(SIMD_PROBE); then simd=$${GOEXPERIMENT:+$$GOEXPERIMENT,}simd; else simd=$$GOEXPERIMENT; fi; \
	GOEXPERIMENT=$$simd GORUN_BENCH_STATE_MIB=256 $(GO) test -run '^$$' -bench BenchmarkResume -benchtime 3x -timeout 30m -v ./internal/cascade/ | grep -v '^=== '

# Erasure coding (--redundancy ec:2+2) against replicas:1 on 4 namespace
# hosts of one rank with 256 MiB of optimizer state each, full mode, beside
# ckpt.Codec's throughput over the same bytes, in one run (benchprotect
# -redundancy); then the codec's Go benchmark, and a restore from another
# host (Tier 2) beside the decode of two lost hosts' state where
# BenchmarkECRestore exists.
bench-ec: build
	$(GO) run ./internal/benchprotect -gorun $(BIN)/gorun -dptrain $(BIN)/dptrain -hosts 4 -ranks 4 -modes full -redundancy replicas:1,ec:2+2 -cpu-compute 0
	$(GO) run ./internal/benchprotect -gorun $(BIN)/gorun -dptrain $(BIN)/dptrain -hosts 4 -ranks 4 -modes diff -redundancy replicas:2,ec:2+2 -base-every 8 -state-mib 128 -cpu-compute 0
	GORUN_BENCH_STATE_MIB=256 $(GO) test -run '^$$' -bench BenchmarkCodecEncode -benchtime 3x ./ckpt/ | grep -v '^=== '
	GORUN_BENCH_STATE_MIB=256 $(GO) test -run '^$$' -bench BenchmarkECPipeline -benchtime 5x ./internal/keeper/ | grep -v '^=== '
	@if $(SIMD_PROBE); then simd=$${GOEXPERIMENT:+$$GOEXPERIMENT,}simd; else simd=$$GOEXPERIMENT; fi; \
	GOEXPERIMENT=$$simd GORUN_BENCH_STATE_MIB=256 $(GO) test -run '^$$' -bench 'BenchmarkTier2Restore$$|BenchmarkECRestore' -benchtime 5x -timeout 20m -v ./internal/keeper/ | grep -v '^=== '

# The chaos suite (internal/chaos, issue 21): RUNS jobs on namespace hosts
# (root and ip netns) under random configurations, each with one random
# fault, judged against what the configuration promises (README, "Chaos
# testing"). SEED picks the draws (default: derived from the commit, printed);
# ONLY=i,j replays those runs alone; KINDS=k1,k2 draws only those fault
# kinds; JSON=file writes the summary with every run's record. 40 runs
# took 203 s on this 2-core machine (seed 2026): RUNS=200 about 17 min.
RUNS    ?= 3
CHAOS_TIMEOUT ?= 180m
chaos:
	GORUN_TESTCLUSTER_REQUIRE=1 GORUN_CHAOS_SEED=$(SEED) GORUN_CHAOS_RUNS=$(RUNS) GORUN_CHAOS_ONLY=$(ONLY) \
		GORUN_CHAOS_KINDS=$(KINDS) GORUN_CHAOS_JSON=$(abspath $(JSON)) \
		$(GO) test -count=1 -v -run '^TestChaos$$' -timeout $(CHAOS_TIMEOUT) ./internal/chaos/

# Short fuzzing of every parser: every package with a Fuzz test (go test
# -fuzz runs one target at a time).
FUZZTIME ?= 20s
fuzz:
	@for p in $$(grep -rl --include='*_test.go' '^func Fuzz' . | xargs -n1 dirname | sort -u); do for t in $$($(GO) test -list '^Fuzz' $$p | grep ^Fuzz); do \
		$(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) $$p || exit 1; done; done

lint:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	GOEXPERIMENT=simd $(GO) vet $(SIMD_PKGS)
	CGO_ENABLED=0 $(GO) vet ./gpu/

# gorun's main job on this host: a protected dptrain with one rank killed
# mid-run, recovered, its final hash beside a failure-free run's.
demo: build
	BIN=$(BIN) scripts/demo.sh

# The same with a whole host lost and a spare spliced in: five namespace
# hosts (root and ip netns needed).
demo-hotswap: build
	BIN=$(BIN) scripts/demo-hotswap.sh

# A job of four ranks on this host.
demo-hello: build
	$(BIN)/gorun -np 4 --oversubscribe $(BIN)/hello

# The deterministic data-parallel trainer on four ranks.
demo-train: build
	$(BIN)/gorun -np 4 --oversubscribe -- $(BIN)/dptrain --params 1M --steps 50 --seed 1

clean:
	rm -rf $(BIN)
