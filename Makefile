# gorun — see README.md.
GO      ?= go
BIN     := bin
PKGS    := ./...

.PHONY: all build test test-short race bench bench-launch bench-rendezvous fuzz lint demo clean

all: build

build:
	$(GO) build -o $(BIN)/gorun ./cmd/gorun
	$(GO) build -o $(BIN)/hello ./examples/hello

# The full suite, as CI runs it (multi-host tests need root and ip netns;
# they skip elsewhere unless GORUN_TESTCLUSTER_REQUIRE=1).
test: lint
	$(GO) test -count=1 -timeout 20m $(PKGS)
	$(GO) test -count=1 -race -timeout 20m $(PKGS)

test-short:
	$(GO) test -short $(PKGS)

bench: bench-rendezvous bench-launch

# Launch-to-exit time against Open MPI and MPICH Hydra (installs them with apt-get if missing).
bench-launch: build
	./scripts/bench-launch.sh
	$(MAKE) --no-print-directory bench-rendezvous

# 1,024 simulated agents × 8 ranks against the real embedded server.
bench-rendezvous:
	$(GO) test -run '^$$' -bench BenchmarkRendezvous -benchtime 5x ./comm/

# Short fuzzing of every parser (go test -fuzz runs one target at a time).
FUZZTIME ?= 20s
fuzz:
	@for t in FuzzParseHostfile FuzzExpandNodeList FuzzParseHostList; do \
		$(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) ./topology/ || exit 1; done
	@for t in $$($(GO) test -list '^Fuzz' ./internal/wire/ | grep ^Fuzz); do \
		$(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) ./internal/wire/ || exit 1; done

lint:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

# A job of four ranks on this host.
demo: build
	$(BIN)/gorun -np 4 --oversubscribe $(BIN)/hello

clean:
	rm -rf $(BIN)
