#!/usr/bin/env python3
"""pytrain: a deterministic example trainer protected by gorun (stdlib only).

Each rank fits a linear model of 4096 float32 parameters to a synthetic
least-squares data set made from the seed (64 examples, targets from a
hidden weight vector), with minibatch SGD and momentum. Ranks do not
communicate: each trains the same model on the same data, so every rank
ends with the same parameters.

Run it under gorun, protecting its state at every step:

    gorun -np 2 -- python3 examples/pytrain/pytrain.py --protect --steps 50

or alone (no state protection):

    python3 examples/pytrain/pytrain.py --steps 50

With --protect, the trainer protects three regions after every step:
"optimizer" (the momentum, float32), "params" (float32) and "meta" (the
step and the data RNG's state, JSON padded to 256 bytes). On start it asks
the rank service to restore; when there is a step to restore, it resumes
from the next one. --crash-at STEP kills the process with SIGKILL at the
start of that step on its first run only (GORUN_RESTART_COUNT "0" or
unset), for restart tests. Every value is rounded to float32 when stored,
and the state is restored bit for bit, so a run that crashed and resumed
ends with the same parameters as one that did not: rank 0 prints
"final hash <sha256 of the parameters' little-endian bytes>".
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import sys
from array import array
from typing import Any

DIM = 4096
EXAMPLES = 64
BATCH = 4
LR = 5e-4
MOMENTUM = 0.9
META_SIZE = 256
MASK64 = (1 << 64) - 1


class Rng:
    """xorshift64*: small state that fits in the meta region."""

    def __init__(self, state: int) -> None:
        self.state = state & MASK64 or 1

    def next(self) -> int:
        x = self.state
        x ^= x >> 12
        x ^= (x << 25) & MASK64
        x ^= x >> 27
        self.state = x
        return (x * 0x2545F4914F6CDD1D) & MASK64


def le_bytes(a: array) -> bytes:
    """The array's bytes, little-endian."""
    if sys.byteorder == "big":
        a = array(a.typecode, a)
        a.byteswap()
    return a.tobytes()


def from_le(data: bytes) -> array:
    a = array("f")
    a.frombytes(data)
    if sys.byteorder == "big":
        a.byteswap()
    return a


Dataset = list[tuple[array, float]]


def dataset(seed: int) -> Dataset:
    """EXAMPLES pairs (x, y = w·x) for hidden weights w, from the seed."""
    r = random.Random(seed)
    w = array("f", (r.uniform(-1.0, 1.0) for _ in range(DIM)))
    data = []
    for _ in range(EXAMPLES):
        x = array("f", (r.uniform(-1.0, 1.0) for _ in range(DIM)))
        data.append((x, sum(wi * xi for wi, xi in zip(w, x))))
    return data


def train_step(params: array, momentum: array, data: Dataset,
               rng: Rng) -> tuple[array, array, float]:
    """One step of SGD with momentum; returns new params, momentum, loss."""
    grad = [0.0] * DIM
    loss = 0.0
    for _ in range(BATCH):
        x, y = data[rng.next() % EXAMPLES]
        err = sum(p * xi for p, xi in zip(params, x)) - y
        loss += 0.5 * err * err / BATCH
        scale = err / BATCH
        grad = [g + scale * xi for g, xi in zip(grad, x)]
    momentum = array("f", (MOMENTUM * m + g for m, g in zip(momentum, grad)))
    params = array("f", (p - LR * m for p, m in zip(params, momentum)))
    return params, momentum, loss


def meta_bytes(step: int, seed: int, rng: Rng) -> bytes:
    meta = json.dumps({"step": step, "seed": seed, "rng": rng.state},
                      separators=(",", ":")).encode()
    if len(meta) > META_SIZE:
        raise ValueError("meta does not fit its region")
    return meta.ljust(META_SIZE, b" ")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--protect", action="store_true",
                    help="protect the state with gorun's rank service")
    ap.add_argument("--crash-at", type=int, default=-1, metavar="STEP",
                    help="SIGKILL self at STEP on the first run only")
    args = ap.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    restarts = int(os.environ.get("GORUN_RESTART_COUNT", "0") or "0")

    data = dataset(args.seed)
    params = array("f", bytes(4 * DIM))
    momentum = array("f", bytes(4 * DIM))
    rng = Rng(args.seed * 0x9E3779B97F4A7C15 + 1)
    start = 0
    prot: Any = None
    if args.protect:
        sys.path.insert(0, os.path.join(os.path.dirname(
            os.path.abspath(__file__)), "..", "..", "python"))
        import gorun_rank

        client = gorun_rank.Client()
        prot = client.protect({"optimizer": 4 * DIM, "params": 4 * DIM,
                               "meta": META_SIZE})
        step, saved = prot.restore()
        if saved is not None:
            meta = json.loads(saved["meta"])
            if meta["seed"] != args.seed or meta["step"] != step:
                raise SystemExit(f"pytrain: the restored state is of seed "
                                 f"{meta['seed']}, step {meta['step']}")
            momentum = from_le(saved["optimizer"])
            params = from_le(saved["params"])
            rng = Rng(meta["rng"])
            start = step + 1
            print(f"rank {rank}: restored step {step}", flush=True)

    total, count = 0.0, 0
    for step in range(start, args.steps):
        if step == args.crash_at and restarts == 0:
            print(f"rank {rank}: crashing at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        params, momentum, loss = train_step(params, momentum, data, rng)
        if prot is not None:
            # Snapshots (bytes) so the next step may go on meanwhile.
            prot.stage_async(step, {"optimizer": le_bytes(momentum),
                                    "params": le_bytes(params),
                                    "meta": meta_bytes(step, args.seed, rng)})
        total, count = total + loss, count + 1
        if rank == 0 and (step % 10 == 9 or step == args.steps - 1):
            print(f"step {step} loss {total / count:.6g} "
                  f"(mean of {count} steps)", flush=True)
            total, count = 0.0, 0
    if prot is not None:
        prot.wait()
        prot.close()
    if rank == 0:
        digest = hashlib.sha256(le_bytes(params)).hexdigest()
        print(f"final hash {digest}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
