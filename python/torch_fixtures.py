"""What the torch tests (test_gorun_torch, test_gorun_torch_gloo) share:
whether torch imports (TORCH_ERROR: why not, or ""), a small model with
AdamW and a scheduler, a training step that draws from every global RNG,
the state's digests, and a run of steps protected through gorun_torch.

Without torch the rest is unusable and the tests skip, unless
GORUN_TORCH_REQUIRE=1: then importing this module fails.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
from typing import Any

try:
    import torch
    from torch import nn
    TORCH_ERROR = ""
except ImportError as e:  # the pyenv python3 has no torch
    TORCH_ERROR = f"torch does not import under {sys.executable}: {e}"
    if os.environ.get("GORUN_TORCH_REQUIRE") == "1":
        raise

if not TORCH_ERROR:
    import numpy  # torch imports it anyway: its RNG is protected too

    import gorun_torch


def build(seed: int = 0, width: int = 16,
          transpose: bool = False) -> tuple:
    """A model with parameters and buffers, AdamW, a scheduler.

    transpose: one weight of the same size but another shape.
    """
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, width), nn.BatchNorm1d(width),
                          nn.GELU(), nn.Dropout(0.2), nn.Linear(width, 8),
                          nn.Linear(8, 4))
    if transpose:
        model[4].weight = nn.Parameter(model[4].weight.detach().t())
    groups = [{"params": list(model[0].parameters())
               + list(model[1].parameters())},
              {"params": list(model[4].parameters())
               + list(model[5].parameters()), "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=1e-2, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.9 ** s)
    return model, opt, sched


def train_step(model, opt, sched, step: int) -> None:
    """One step drawing from torch's, Python's and NumPy's global RNGs."""
    x = torch.randn(32, 8) * (1 + random.random())
    x = x + float(numpy.random.rand())
    y = torch.sin(x[:, :4] * (step + 1))
    opt.zero_grad(set_to_none=True)
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    sched.step()


def digest(model, opt, sched) -> dict[str, Any]:
    """sha256 of the state (params, buffers, optimizer, scheduler)."""
    def h(tensors) -> str:
        d = hashlib.sha256()
        for t in tensors:
            t = t.detach().contiguous()
            buf = bytearray(t.numel() * t.element_size())
            if buf:
                torch.frombuffer(buf, dtype=torch.uint8).copy_(
                    t.reshape(-1).view(torch.uint8))
            d.update(repr((tuple(t.shape), t.dtype)).encode() + buf)
        return d.hexdigest()
    sd = opt.state_dict()
    opt_tensors = [v for i in sorted(sd["state"])
                   for _, v in sorted(sd["state"][i].items())]
    return {"model": h(model.state_dict().values()),
            "optimizer": h(opt_tensors),
            "optimizer_keys": {str(i): sorted(s) for i, s in
                               sd["state"].items()},
            "param_groups": repr([{k: v for k, v in g.items()
                                   if k != "params"}
                                  for g in sd["param_groups"]]),
            "scheduler": repr(sched.state_dict())}


def draws() -> list:
    """Numbers drawn from every global RNG (consumes them)."""
    return [torch.rand(3).tolist(), random.random(),
            float(numpy.random.rand())]


def seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    numpy.random.seed(seed)


def run(svc_path: str | None, steps: int, start_seed: int = 7,
        crash_after: int = -1, **kw) -> dict[str, Any]:
    """Train steps steps (protected when svc_path); the state's digests.

    With crash_after, return right after save(crash_after) (the draws
    then are those the restored run must see).
    """
    model, opt, sched = build(**kw)
    seed_all(start_seed)
    prot = None
    start, data = 0, None
    if svc_path is not None:
        prot = gorun_torch.Protector(model, opt, sched,
                                     socket_path=svc_path, timeout=30)
        start, data = prot.restore()
    for step in range(start, steps):
        train_step(model, opt, sched, step)
        if prot is not None:
            prot.save(step, {"epoch": step // 5, "batch": step % 5 + 1})
        if step == crash_after:
            break
    out = digest(model, opt, sched)
    out.update(start=start, data=data, draws=draws())
    if prot is not None:
        prot.close()
    return out
