"""A deterministic PyTorch DDP trainer (gloo, CPU) for gorun.

An MLP of residual blocks (LayerNorm, Linear, GELU, dropout) regressing a
random teacher network's outputs on synthetic inputs, AdamW with a warm-up
and cosine LR schedule, a DistributedSampler (shuffle=True, set_epoch)
over the dataset, one thread, deterministic algorithms. Same
--steps/--seed/--width/--layers and world size: the same final checksum,
with or without --protect, a crash and restore, or a torch.save reload.

    bin/gorun -np 2 -- /usr/bin/python3 examples/torch/train.py
    bin/gorun -np 2 --max-restarts 1 -- /usr/bin/python3 \\
        examples/torch/train.py --protect --crash-at 30

It reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT as torchrun sets
them (gorun sets them too). --protect imports gorun_torch (python/): every
step's state is protected in gorun's memory and restored from it at start.
With --in-place too, under ``gorun --recovery in-place --spares 1``, the
ranks that survive a lost host keep running: a failed collective or a save
refused by the new epoch makes them rejoin it (a new process group on the
epoch's rendezvous, a new DDP wrapper, every rank back to G) and go on.
"""

import argparse
import datetime
import hashlib
import itertools
import math
import os
import random
import signal
import sys
import time

# DDP warns once per rank, in C++, that find_unused_parameters found none
# (see below): shown only when asked for.
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # c10 logging
os.environ.setdefault("GLOG_minloglevel", "2")  # Debian's torch: glog

import torch  # noqa: E402
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

EXAMPLES = 4096
BATCH = 32  # per rank
IN, OUT = 32, 8


class Block(nn.Module):
    def __init__(self, width: int, norm: str = "layer") -> None:
        super().__init__()
        # batch: BatchNorm1d, whose running statistics (buffers) differ
        # per rank under DDP (each rank's forward updates them with its
        # own batch after DDP broadcast rank 0's). momentum=None: a
        # cumulative average, so a wrong buffer at a resume stays in the
        # final checksum (an exponential one with the default 0.1 forgets
        # it in bits within the run: a host loss that restored a peer's
        # buffers still ended on the same checksum).
        self.norm = (nn.BatchNorm1d(width, momentum=None)
                     if norm == "batch" else nn.LayerNorm(width))
        self.fc = nn.Linear(width, width)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(nn.functional.gelu(self.fc(self.norm(x))))


class Net(nn.Module):
    def __init__(self, width: int, layers: int, norm: str = "layer") -> None:
        super().__init__()
        self.inp = nn.Linear(IN, width)
        self.blocks = nn.Sequential(*[Block(width, norm)
                                      for _ in range(layers)])
        self.norm = nn.LayerNorm(width)
        self.out = nn.Linear(width, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(self.blocks(self.inp(x))))


def dataset(seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(EXAMPLES, IN, generator=g)
    teacher = torch.randn(IN, OUT, generator=g) / math.sqrt(IN)
    y = torch.tanh(x @ teacher) + 0.05 * torch.randn(EXAMPLES, OUT,
                                                     generator=g)
    return TensorDataset(x, y)


def checksum(model: nn.Module) -> str:
    h = hashlib.sha256()
    for t in model.state_dict().values():
        t = t.detach().contiguous()
        buf = bytearray(t.numel() * t.element_size())
        if buf:
            torch.frombuffer(buf, dtype=torch.uint8).copy_(
                t.reshape(-1).view(torch.uint8))
        h.update(buf)
    return h.hexdigest()


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def save_checkpoint(path: str, step: int, model: nn.Module, opt, sched,
                    data: dict) -> None:
    """torch.save to path atomically; the previous one kept as .prev."""
    tmp = path + ".tmp"
    torch.save({"step": step, "model": model.state_dict(),
                "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                "data": data, "rng": rng_state()}, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    if os.path.exists(path):
        os.replace(path, path + ".prev")
    os.replace(tmp, path)


def load_checkpoint(path: str, model: nn.Module, opt, sched):
    """The checkpoint every rank has (the newest step all reached)."""
    ckpts = []
    for p in (path, path + ".prev"):
        if os.path.exists(p):
            ckpts.append(torch.load(p))
    mine = torch.tensor([ckpts[0]["step"] if ckpts else -1])
    dist.all_reduce(mine, op=dist.ReduceOp.MIN)
    step = int(mine.item())
    if step < 0:
        return None
    ck = next((c for c in ckpts if c["step"] == step), None)
    if ck is None:
        raise SystemExit(f"train.py: no checkpoint of step {step} in "
                         f"{path}[.prev]")
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["optimizer"])
    sched.load_state_dict(ck["scheduler"])
    torch.set_rng_state(ck["rng"]["torch"])
    random.setstate(ck["rng"]["python"])
    return step, ck["data"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--norm", choices=("layer", "batch"), default="layer",
                    help="the blocks' normalisation (batch: BatchNorm1d, "
                    "buffers that differ per rank)")
    ap.add_argument("--protect", action="store_true",
                    help="protect the state with gorun (gorun_torch)")
    ap.add_argument("--crash-at", type=int, default=-1, metavar="STEP",
                    help="SIGKILL at the start of STEP, first run only")
    ap.add_argument("--crash-rank", type=int, default=0)
    ap.add_argument("--save-every", type=int, default=0, metavar="K",
                    help="torch.save a checkpoint every K steps")
    ap.add_argument("--save-dir", default="")
    ap.add_argument("--report-steps", action="store_true",
                    help="rank 0 prints 'step S done T' after every step")
    ap.add_argument("--in-place", action="store_true",
                    help="with --protect: on a failed collective or a new "
                    "gorun epoch, rejoin it in place (gorun --recovery "
                    "in-place)")
    ap.add_argument("--timeout", type=float, default=None, metavar="S",
                    help="the process group's timeout in seconds (default "
                    "30 with --in-place, else torch's 30 minutes)")
    args = ap.parse_args()
    if args.save_every and not args.save_dir:
        ap.error("--save-every needs --save-dir")
    if args.in_place and not args.protect:
        ap.error("--in-place needs --protect")
    if args.timeout is None and args.in_place:
        args.timeout = 30.0

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    if args.timeout is not None:
        dist.init_process_group(
            "gloo", timeout=datetime.timedelta(seconds=args.timeout))
    else:
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    restarts = os.environ.get("GORUN_RESTART_COUNT",
                              os.environ.get("TORCHELASTIC_RESTART_COUNT",
                                             "0")) or "0"

    torch.manual_seed(args.seed)  # the same initial weights on every rank
    # find_unused_parameters=True keeps DDP's gradient buckets as built
    # here: without it DDP rebuilds them after a process's first step, in
    # gradient-ready order, and with more than 2 ranks gloo's ring
    # allreduce sums an element in an order set by its offset in its
    # bucket, so the first step after any restart (from gorun or from a
    # torch.save file) would round differently from the uninterrupted run
    # (measured: another final checksum at world 4, the same at world 2).
    # Its cost: one autograd-graph traversal per step.
    net = Net(args.width, args.layers, args.norm)
    model = DDP(net, find_unused_parameters=True)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    warm = 10

    def lr_at(s: int) -> float:
        if s < warm:
            return (s + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * (s - warm)
                                   / max(1, args.steps - warm)))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    data = dataset(args.seed)
    sampler = DistributedSampler(data, world, rank, shuffle=True,
                                 seed=args.seed, drop_last=True)
    # The loader's own generator: an iterator made at a resume does not
    # draw from the global RNG (which dropout uses).
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler,
                        drop_last=True,
                        generator=torch.Generator().manual_seed(args.seed))
    per_epoch = len(loader)
    # Dropout and the input jitter differ per rank: rank-unique RNG state.
    torch.manual_seed(args.seed * 1000 + rank + 1)
    random.seed(args.seed * 1000 + rank + 1)

    start, pos = 0, {"epoch": 0, "batch": 0}
    prot = None
    if args.protect:
        sys.path.insert(0, os.path.join(os.path.dirname(
            os.path.abspath(__file__)), "..", "..", "python"))
        import gorun_torch
        prot = gorun_torch.Protector(model, opt, sched)
        if args.in_place:
            print(f"rank {rank}: pid {os.getpid()} epoch "
                  f"{prot.group_epoch}", flush=True)
        start, saved = prot.restore()
        if saved is not None:
            pos = saved
            print(f"rank {rank}: resumed at step {start} from gorun",
                  flush=True)
    ckpt = (os.path.join(args.save_dir, f"rank{rank}.pt")
            if args.save_every else "")
    if ckpt and start == 0:
        got = load_checkpoint(ckpt, model, opt, sched)
        if got is not None:
            start, pos = got[0] + 1, got[1]
            print(f"rank {rank}: resumed at step {start} from "
                  f"{args.save_dir}", flush=True)

    def batches(epoch: int, skip: int):
        sampler.set_epoch(epoch)
        return itertools.islice(iter(loader), skip, None)

    it = batches(pos["epoch"], pos["batch"])
    epoch, index = pos["epoch"], pos["batch"]
    loss_fn = nn.MSELoss()
    total, count, times = 0.0, 0, []
    # What makes a surviving rank rejoin gorun's new epoch: a collective
    # that failed (gloo raises RuntimeError) or a save refused because of
    # the new epoch. Without --in-place, nothing: the error ends the run.
    recoverable: tuple = ((RuntimeError, gorun_torch.EpochChanged)
                          if args.in_place else ())
    step = start
    while step < args.steps:
        if step == args.crash_at and rank == args.crash_rank \
                and restarts == "0":
            print(f"rank {rank}: crashing at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        t0 = time.perf_counter()
        if index == per_epoch:
            epoch, index = epoch + 1, 0
            it = batches(epoch, 0)
        x, y = next(it)
        index += 1
        x = x + 0.01 * random.random() * torch.randn_like(x)
        failed = None
        try:
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            sched.step()
            if prot is not None:
                prot.save(step, {"epoch": epoch, "batch": index})
        except recoverable as e:
            failed = f"{type(e).__name__}: {e}".splitlines()[0]
        if failed is not None:
            # Out of the except block: the traceback held the old DDP
            # wrapper, which must be gone before the new one is made.
            loss = model = None
            print(f"rank {rank}: step {step} failed ({failed:.200}); "
                  f"rejoining", file=sys.stderr, flush=True)
            try:
                model, step, pos = prot.rejoin(
                    lambda: DDP(net, find_unused_parameters=True),
                    group_timeout=args.timeout)
            except gorun_torch.GorunError as e:
                # No newer epoch, or none to roll back to (a host lost
                # before every rank's first save): this rank ends.
                print(f"rank {rank}: cannot rejoin: {e}", file=sys.stderr,
                      flush=True)
                return 1
            print(f"rank {rank}: rejoined epoch {prot.group_epoch} at step "
                  f"{step}", flush=True)
            it = batches(pos["epoch"], pos["batch"])
            epoch, index = pos["epoch"], pos["batch"]
            total, count = 0.0, 0
            continue
        if ckpt and (step + 1) % args.save_every == 0:
            save_checkpoint(ckpt, step, model, opt, sched,
                            {"epoch": epoch, "batch": index})
        times.append(time.perf_counter() - t0)
        total, count = total + loss.item(), count + 1
        if rank == 0 and args.report_steps:
            print(f"step {step} done {time.time():.6f}", flush=True)
        if rank == 0 and (step % 10 == 9 or step == args.steps - 1):
            print(f"step {step} loss {total / count:.6g}", flush=True)
            total, count = 0.0, 0
        step += 1
    if prot is not None:
        prot.close()
    if rank == 0:
        print(f"final checksum {checksum(model.module)}", flush=True)
        steady = times[3:] or times
        mean = sum(steady) / len(steady) if steady else 0.0
        print(f"mean step time {mean:.6f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
