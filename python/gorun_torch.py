"""Protect a PyTorch trainer's state with gorun, in memory, at every step.

The recipe (a DDP trainer started by ``gorun -np N -- python3 train.py``)::

    import gorun_torch

    prot = gorun_torch.Protector(model, optimizer, scheduler)
    start, data = prot.restore()        # (0, None) on a fresh start
    pos = data or {"epoch": 0, "batch": 0}
    for step in range(start, steps):
        ...                             # forward, backward (uses pos)
        optimizer.step(); scheduler.step()
        prot.save(step, {"epoch": ..., "batch": ...})  # the next position
    prot.close()

Run it under ``gorun --max-restarts 1`` and a rank that dies restarts in
place (every rank of the job restarts) and continues from G, the newest
step every rank committed, without reading anything from disk; with spares
(``--spares 1``) a lost host's ranks restart on the spare and restore from
their replica holders and a data-parallel peer.

What is protected, in the rank's regions (python/gorun_rank.py,
protect/PROTOCOL.md):

- ``params``: every parameter of the model (and of the optimizer, if it
  has some that are not the model's) and, by default, the
  optimizer's tensor state (Adam's exp_avg, exp_avg_sq, step, ...). Under
  DDP with a plain optimizer these are the same on every data-parallel
  rank, so gorun does not replicate them: a replacement rank copies them
  from a data-parallel peer. Only rank-unique state is replicated.
- ``buffers`` (replicated; absent when the model has none): the model's
  buffers. They are not the same on every data-parallel rank: DDP
  broadcasts rank 0's before each forward, then each rank's forward
  updates them from its own batch (BatchNorm's running statistics).
- ``optimizer`` (with ``rank_unique_optimizer=True``): the optimizer's
  tensor state, replicated to other hosts. Use it when the optimizer state
  differs between ranks: a sharded optimizer (pass the local optimizer,
  ``ZeroRedundancyOptimizer.optim``), or a layout without data parallelism.
- ``model`` (with ``replicate_params=True``): the model's parameters,
  replicated, for parameters that differ between ranks (no data
  parallelism, a model-parallel layout). Both options are on by default
  when the model given is not a DistributedDataParallel, off when it is.
  The meta document records a digest of the rank's ``params`` region
  at each save (the sum of its 64-bit words mod 2^64: 1.5 ms for 38 MiB
  here, where zlib.crc32 took 10.7 ms); restore() refuses (LayoutError)
  a region that does not match it, as a peer's differing state would not.
- ``meta`` (replicated): a length-prefixed JSON document (an 8-byte
  little-endian length, then UTF-8 JSON): the format version, the step, a
  fingerprint of the layout (every tensor's name, shape and dtype, the
  optimizer's class, the world size: a restore into another model,
  optimizer or world is refused with LayoutError), the caller's data
  position (any JSON dict given to save()), the optimizer's param_groups
  hyper-parameters (the lr a scheduler changed) and non-tensor state, the
  scheduler's state_dict (without its callables and weak references, which
  the live scheduler keeps), and the RNG states of torch (CPU, and CUDA when
  available), Python's ``random`` and NumPy's global RandomState when numpy
  is imported (this module never imports it). Its size is fixed at
  construction (``meta_size``, 64 KiB by default); MetaTooLarge says when
  the document does not fit.

Optimizer state is created by torch at the first step, but the regions are
declared before the restore: the layout is found by probing, a second
optimizer of the same class over zero tensors shaped like the parameters,
with zero gradients, stepped once (on the meta device, which allocates
nothing, where the optimizer supports it; the real optimizer is never
stepped here). On a restore the real optimizer's state entries are created from
that layout and the bytes copied in. A fresh start touches nothing, so a
protected run is bitwise the same as an unprotected one.

Data position and RNG: save(step, data) records where the next batch
comes from; restore() hands it back. A recovered rank must neither repeat
nor skip a batch: derive the loader's position from it (for a
DistributedSampler: set_epoch(data["epoch"]) and skip data["batch"]
batches), and keep the global RNG out of data loading (a DataLoader
without ``generator=`` draws its base seed from torch's global RNG each
time an iterator is made, which a resumed run does at a different point).
A DataLoader(shuffle=True, generator=g) draws each epoch's order from g,
which advances every epoch: pass it, ``Protector(...,
generators=[g])``, and its state is saved and restored with the others
(a DistributedSampler's order depends only on its seed and epoch).

``--recovery in-place``: the surviving ranks keep running while a lost
host's ranks move to a spare (new processes, which restore at start as
above); gorun moves the job to a new epoch with a new rendezvous address.
A surviving rank notices when a collective fails (a RuntimeError from
gloo: at once when the peer's process died, only at the process group's
timeout when the peer went silent) or when a save() is refused because
the epoch changed (EpochChanged), and then calls rejoin(), which waits for
the new epoch, destroys the process group, creates it for the new epoch's
rendezvous (``tcp://MASTER_ADDR:MASTER_PORT`` of the epoch, as gorun's
Epoch frame says), wraps the module again (a new DDP) and restores (every
rank rolls back to G)::

    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    net = Net()
    model = DDP(net)
    ...                                  # optimizer, scheduler, Protector
    step, data = prot.restore()
    while step < steps:
        failed = False
        try:
            ...                          # forward, backward, optimizer
            prot.save(step, {"epoch": ..., "batch": ...})
        except (RuntimeError, gorun_torch.EpochChanged):
            failed = True
        if failed:                       # the traceback held the old DDP
            model = None                 # the old DDP must go first
            model, step, data = prot.rejoin(lambda: DDP(net),
                                            group_timeout=30)
            ...                          # the data loader from data
            continue
        step += 1

Give the process group a short timeout (torch's default is 30 minutes): a
peer that went silent (a host stopped, not dead) holds every collective
until then. gloo in torch 1.13 allows a group destroyed and made again
(measured: destroy and a new group on a new port with a new peer worked
in every one of 27 cycles, with the lost peer rank 0, which held the
TCPStore, or rank 1); a collective with a killed peer fails at once (under
2 ms; a DDP step in 30-50 ms), one with a silent (stopped) peer only after
the group's timeout (5.0 s and 20.0 s measured for 5 and 20). See
examples/torch/train.py --in-place.

Determinism (what a bitwise resume needs besides this module): a
DataLoader with its own ``generator=``, and with more than 2 ranks
``DDP(..., find_unused_parameters=True)``, which keeps DDP from rebuilding
its gradient buckets after a process's first step (the bucket offsets set
gloo's summation order: resumed world-4 runs ended on other bits without
it). See examples/torch/train.py.

Only the standard library, torch and gorun_rank are imported.
"""

from __future__ import annotations

import base64
import datetime
import gc
import hashlib
import json
import os
import random
import struct
import sys
import weakref
from typing import Any, Callable, Optional, Sequence

import torch

import gorun_rank
from gorun_rank import EpochChanged, EpochTimeout, GorunError

__all__ = ["Protector", "GorunError", "LayoutError", "MetaTooLarge",
           "EpochChanged", "EpochTimeout", "FORMAT"]

FORMAT = 1
META_SIZE = 64 << 10
_ALIGN = 64
_LEN = struct.Struct("<Q")
_CRC_HOLE = "sum64:????????????????"


class LayoutError(GorunError):
    """The protected state is not of this model, optimizer or world."""


class MetaTooLarge(GorunError):
    """The meta document does not fit the meta region."""


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _check_like(t: Any, e: "_Entry", what: str, expected: str) -> None:
    """LayoutError unless t is a tensor of e's shape and dtype."""
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != e.shape \
            or t.dtype != e.dtype:
        raise LayoutError(f"{what} is {type(t).__name__} "
                          f"{tuple(getattr(t, 'shape', ()))} "
                          f"{getattr(t, 'dtype', '')}, {expected} "
                          f"{e.shape} {e.dtype}")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _encode(obj: Any, where: str) -> Any:
    """obj as JSON-able data; tuples and tensors are tagged."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, where) for v in obj]}
    if isinstance(obj, list):
        return [_encode(v, where) for v in obj]
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):
            return {"__items__": [[_encode(k, where), _encode(v, where)]
                                  for k, v in obj.items()]}
        return {k: _encode(v, where) for k, v in obj.items()}
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        return {"__tensor__": _dtype_name(t.dtype), "shape": list(t.shape),
                "b64": base64.b64encode(_tensor_bytes(t)).decode()}
    raise GorunError(f"{where}: cannot record a {type(obj).__name__} "
                     f"({obj!r:.60}) in the meta document")


def _decode(obj: Any) -> Any:
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    if isinstance(obj, dict):
        if "__tuple__" in obj:
            return tuple(_decode(v) for v in obj["__tuple__"])
        if "__items__" in obj:
            return {_decode(k): _decode(v) for k, v in obj["__items__"]}
        if "__tensor__" in obj:
            dtype = getattr(torch, obj["__tensor__"])
            raw = bytearray(base64.b64decode(obj["b64"]))
            t = (torch.frombuffer(raw, dtype=dtype) if raw
                 else torch.empty(0, dtype=dtype))
            return t.reshape(obj["shape"]).clone()
        return {k: _decode(v) for k, v in obj.items()}
    return obj


def _tensor_bytes(t: torch.Tensor) -> bytes:
    """The bytes of a contiguous CPU tensor."""
    n = t.numel() * t.element_size()
    buf = bytearray(n)
    if n:
        torch.frombuffer(buf, dtype=torch.uint8).copy_(
            t.reshape(-1).view(torch.uint8))
    return bytes(buf)


class _Entry:
    """One tensor's place in a region."""

    __slots__ = ("region", "name", "shape", "dtype", "device", "offset",
                 "nbytes", "itemsize", "param", "key", "buffer")

    def __init__(self, region: str, name: str, t: torch.Tensor,
                 param: int = -1, key: str = "") -> None:
        self.region, self.name = region, name
        self.shape = tuple(t.shape)
        self.dtype, self.device = t.dtype, t.device
        self.itemsize = t.element_size()
        self.nbytes = t.numel() * self.itemsize
        self.offset = 0
        self.buffer = False
        self.param, self.key = param, key  # optimizer state: index, key

    def describe(self) -> list:
        return [self.region, self.name, list(self.shape),
                _dtype_name(self.dtype)]


def _sched_state(scheduler: Any) -> dict:
    """scheduler's state_dict without callables and weak references
    (OneCycleLR's anneal_func, CyclicLR's _scale_fn_ref): they are not
    state, and load_state_dict keeps the live object's for keys missing."""
    return {k: v for k, v in scheduler.state_dict().items()
            if not (callable(v) or isinstance(v, weakref.ref))}


def _world_size() -> int:
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1") or "1")


def _zero_groups(optimizer: torch.optim.Optimizer,
                 device: Optional[str]) -> list[dict[str, Any]]:
    """optimizer's param_groups over zero tensors (on device, if given)
    shaped like its parameters, with zero gradients."""
    groups = []
    for g in optimizer.param_groups:
        ps = []
        for p in g["params"]:
            c = torch.zeros_like(p, device=device)
            c.grad = torch.zeros_like(c)
            ps.append(c)
        groups.append(dict(g, params=ps))
    return groups


def _probe(optimizer: torch.optim.Optimizer,
           make: Callable[[list], torch.optim.Optimizer]
           ) -> torch.optim.Optimizer:
    """A copy of optimizer, made by make and stepped once over zeros.

    On the meta device first (no memory; AdamW, Adam, SGD and most
    optimizers step there), else over zeros on the parameters' devices.
    """
    try:
        probed = make(_zero_groups(optimizer, "meta"))
        probed.step()
        return probed
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        pass
    try:
        probed = make(_zero_groups(optimizer, None))
        probed.step()
    except Exception as e:
        raise GorunError(
            f"cannot find the state layout of {type(optimizer).__name__} "
            f"by probing a copy ({type(e).__name__}: {e}): pass "
            f"Protector(probe=...), a function of param_groups returning "
            f"an optimizer with the same state whose step() takes no "
            f"arguments") from e
    return probed


class Protector:
    """Per-step protection of a model, its optimizer and scheduler.

    model: the module trained (a DistributedDataParallel wrapper or the
    module). optimizer: a torch optimizer whose state is created lazily by
    its step() (AdamW, Adam, SGD, ...). scheduler: an LR scheduler, or None.

    rank_unique_optimizer: put the optimizer's tensor state in the
    replicated ``optimizer`` region instead of ``params`` (sharded
    optimizers, no data parallelism). replicate_params: put the model's
    parameters in the replicated ``model`` region instead of ``params``
    (parameters that differ per rank: no data parallelism, a
    model-parallel layout). Both default to True when model is not a
    DistributedDataParallel, False when it is. generators: torch.Generator
    objects whose states are saved and restored with the global RNGs (a
    DataLoader's ``generator=``, which orders a shuffled loader's batches
    and advances every epoch). meta_size: the meta region's size in
    bytes. probe: builds the optimizer used to find the state's layout from
    param_groups of zero tensors (default: ``type(optimizer)(groups,
    **optimizer.defaults)``); it is stepped once with zero gradients, on
    the meta device (no memory) where the optimizer supports it.
    socket_path: the
    rank's socket (default: GORUN_SOCKET; GorunError when not under gorun).

    Attributes: ``model`` (the module: a DDP wrapper's ``module``, which
    the Protector keeps instead of the wrapper so that rejoin's caller can
    drop an old wrapper), ``optimizer``, ``scheduler``, ``regions``, and
    ``group_epoch``, the gorun epoch whose rendezvous the process group
    uses (GORUN_EPOCH at start; rejoin sets it).
    """

    def __init__(self, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer,
                 scheduler: Any = None, *,
                 rank_unique_optimizer: Optional[bool] = None,
                 replicate_params: Optional[bool] = None,
                 generators: Sequence[torch.Generator] = (),
                 meta_size: int = META_SIZE,
                 probe: Optional[Callable[[list], torch.optim.Optimizer]]
                 = None,
                 socket_path: Optional[str] = None,
                 timeout: Optional[float] = None) -> None:
        if meta_size < 64:
            raise ValueError(f"meta_size {meta_size} < 64")
        self.model = (model.module if isinstance(
            model, torch.nn.parallel.DistributedDataParallel) else model)
        self.optimizer, self.scheduler = optimizer, scheduler
        self.meta_size = meta_size
        self.generators = list(generators)
        for g in self.generators:
            if not isinstance(g, torch.Generator):
                raise TypeError(f"generators: a {type(g).__name__}, not a "
                                f"torch.Generator")
        self._client: Optional[gorun_rank.Client] = None
        self._prot: Optional[gorun_rank.Protection] = None
        self._dst: dict[int, list[torch.Tensor]] = {}

        ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel)
        if replicate_params is None:
            replicate_params = not ddp
        if rank_unique_optimizer is None:
            rank_unique_optimizer = not ddp
        opt_region = "optimizer" if rank_unique_optimizer else "params"
        param_region = "model" if replicate_params else "params"
        # The model's tensors are looked up again by name at every save()
        # and restore() (a module may reassign a buffer); optimizer
        # parameters that are not the model's by their index.
        self._model_entries: list[_Entry] = []
        seen: set[int] = set()
        for kind, named in (("param", self.model.named_parameters()),
                            ("buffer", self.model.named_buffers())):
            for name, t in named:
                if id(t) in seen:
                    continue
                seen.add(id(t))
                # Buffers (BatchNorm's running statistics) differ per
                # rank under DDP: replicated, never taken from a peer.
                e = _Entry("buffers" if kind == "buffer" else param_region,
                           name, t)
                e.buffer = kind == "buffer"
                self._model_entries.append(e)
        self._opt_params: list[torch.Tensor] = [
            p for g in optimizer.param_groups for p in g["params"]]
        if len({id(p) for p in self._opt_params}) != len(self._opt_params):
            raise GorunError("a parameter is in two param_groups")
        # The optimizer's parameters that are not the model's (a separate
        # temperature, say): their values too, after the model's.
        for i, p in enumerate(self._opt_params):
            if id(p) not in seen:
                seen.add(id(p))
                e = _Entry(param_region, f"optimizer.param[{i}]", p, i)
                self._model_entries.append(e)
        names = {id(t): n for n, t in self.model.named_parameters()}
        probed = _probe(optimizer, probe or (
            lambda groups: type(optimizer)(groups, **optimizer.defaults)))
        probed_params = [p for g in probed.param_groups
                         for p in g["params"]]
        if len(probed_params) != len(self._opt_params):
            raise GorunError("the probe optimizer has other parameters")
        self._opt_entries: list[_Entry] = []
        self._opt_scalar_keys: list[list[str]] = []
        for i, p in enumerate(probed_params):
            st = probed.state.get(p, {})
            scal = []
            for key in sorted(st):
                v = st[key]
                pname = names.get(id(self._opt_params[i]), f"#{i}")
                if isinstance(v, torch.Tensor):
                    e = _Entry(opt_region, f"{pname}.{key}", v, i, key)
                    if v.device.type == "meta":  # probed on meta
                        e.device = self._opt_params[i].device
                    self._opt_entries.append(e)
                else:
                    scal.append(key)
            self._opt_scalar_keys.append(scal)
        del probed, probed_params

        sizes: dict[str, int] = {}
        for e in self._model_entries + self._opt_entries:
            e.offset = sizes.get(e.region, 0)
            sizes[e.region] = _align(e.offset + e.nbytes)
        regions = {}
        if rank_unique_optimizer:
            regions["optimizer"] = sizes.get("optimizer", 0)
        if replicate_params:
            regions["model"] = sizes.get("model", 0)
        if sizes.get("buffers"):
            regions["buffers"] = sizes["buffers"]
        if not (replicate_params and rank_unique_optimizer):
            regions["params"] = sizes.get("params", 0)
        regions["meta"] = meta_size
        self.regions = regions
        layout = [e.describe() for e in
                  self._model_entries + self._opt_entries]
        self.world_size = _world_size()
        self.fingerprint = hashlib.sha256(json.dumps(
            {"layout": layout, "optimizer": type(optimizer).__name__,
             "groups": [len(g["params"]) for g in optimizer.param_groups],
             "scheduler": type(scheduler).__name__ if scheduler else None,
             "generators": len(self.generators),
             "world": self.world_size},
            separators=(",", ":")).encode()).hexdigest()

        self._client = gorun_rank.Client(socket_path, timeout)
        try:
            try:
                self._prot = self._client.protect(regions)
            except gorun_rank.ServiceError as e:
                raise LayoutError(
                    f"gorun refused the regions {regions} (this model or "
                    f"optimizer is not the one protected before, or "
                    f"--resume stored other regions): {e}") from e
        except BaseException:
            self._client.close()
            raise
        env_epoch = os.environ.get("GORUN_EPOCH", "")
        self.group_epoch: int = (int(env_epoch) if env_epoch.isdigit()
                                 else self._client.epoch)

    # Layout helpers.

    def _dst_tensors(self, slot: int) -> list[torch.Tensor]:
        """Tensors over the slot's bytes, one per entry (made once)."""
        got = self._dst.get(slot)
        if got is not None:
            return got
        assert self._prot is not None
        views = {name: self._prot.view(name, slot) for name in self.regions}
        out = []
        for e in self._model_entries + self._opt_entries:
            if e.nbytes == 0:
                out.append(torch.empty(e.shape, dtype=e.dtype))
                continue
            t = torch.frombuffer(views[e.region], dtype=e.dtype,
                                 count=e.nbytes // e.itemsize,
                                 offset=e.offset)
            out.append(t.view(e.shape))
        self._dst[slot] = out
        return out

    def _model_sources(self) -> list[torch.Tensor]:
        """The model's tensors now, in layout order (LayoutError if one is
        gone or has another shape or dtype than at construction)."""
        params = dict(self.model.named_parameters())
        buffers = dict(self.model.named_buffers())
        opt_params = [p for g in self.optimizer.param_groups
                      for p in g["params"]]
        out = []
        for e in self._model_entries:
            if e.param >= 0:
                t = (opt_params[e.param] if e.param < len(opt_params)
                     else None)
            else:
                t = (buffers if e.buffer else params).get(e.name)
            _check_like(t, e, f"the model's "
                        f"{'buffer' if e.buffer else 'parameter'} {e.name}",
                        "the layout has")
            out.append(t)
        return out

    def _opt_sources(self) -> tuple[list[Optional[torch.Tensor]], list[int]]:
        """The optimizer's state tensors in layout order; absent params."""
        state = self.optimizer.state
        out: list[Optional[torch.Tensor]] = []
        absent = set()
        for e in self._opt_entries:
            st = state.get(self._opt_params[e.param])
            if not st:
                absent.add(e.param)
                out.append(None)
                continue
            v = st.get(e.key)
            _check_like(v, e, f"optimizer state {e.name}", "the probe found")
            out.append(v)
        for i, p in enumerate(self._opt_params):
            st = state.get(p)
            if st:
                want = {e.key for e in self._opt_entries if e.param == i} | \
                    set(self._opt_scalar_keys[i])
                if set(st) != want:
                    raise LayoutError(f"optimizer state of parameter {i} "
                                      f"has keys {sorted(st)}, the probe "
                                      f"found {sorted(want)}")
        return out, sorted(absent)

    # Meta.

    def _meta(self, step: int, data: Optional[dict],
              absent: list[int]) -> bytes:
        opt = self.optimizer
        groups = [{k: _encode(v, f"param_groups[{i}][{k!r}]")
                   for k, v in g.items() if k != "params"}
                  for i, g in enumerate(opt.param_groups)]
        scalars = {}
        for i, keys in enumerate(self._opt_scalar_keys):
            st = opt.state.get(self._opt_params[i])
            if st and keys:
                scalars[str(i)] = {k: _encode(st[k], f"state {i} {k}")
                                   for k in keys}
        rng: dict[str, Any] = {
            "torch": _encode(torch.get_rng_state(), "torch RNG"),
            "python": _encode(random.getstate(), "random"),
        }
        if self.generators:
            rng["generators"] = [_encode(g.get_state(), "generator")
                                 for g in self.generators]
        if torch.cuda.is_available():
            rng["cuda"] = [_encode(s, "CUDA RNG")
                           for s in torch.cuda.get_rng_state_all()]
        np = sys.modules.get("numpy")
        if np is not None:
            st = np.random.get_state()
            rng["numpy"] = [st[0], base64.b64encode(
                st[1].astype("<u4").tobytes()).decode(), int(st[2]),
                int(st[3]), float(st[4])]
        doc = {
            "format": FORMAT, "step": step, "fingerprint": self.fingerprint,
            "world": self.world_size, "data": _encode(data, "data"),
            "param_groups": groups, "optimizer_scalars": scalars,
            "absent": absent,
            "scheduler": (_encode(_sched_state(self.scheduler), "scheduler")
                          if self.scheduler is not None else None),
            "rng": rng,
        }
        if "params" in self.regions:
            # The digest of this rank's params region, filled in by save()
            # once the slot is written: checked at a restore, where the
            # region may come from a data-parallel peer.
            doc["digest"] = {"params": _CRC_HOLE}
        body = json.dumps(doc, separators=(",", ":")).encode()
        if _LEN.size + len(body) > self.meta_size:
            raise MetaTooLarge(
                f"the meta document is {_LEN.size + len(body)} bytes, the "
                f"meta region {self.meta_size}: Protector(meta_size=...)")
        return _LEN.pack(len(body)) + body

    def _read_meta(self, slot: int) -> dict[str, Any]:
        assert self._prot is not None
        view = self._prot.view("meta", slot)
        try:
            (n,) = _LEN.unpack(view[:_LEN.size])
            if not 0 < n <= len(view) - _LEN.size:
                raise LayoutError(f"the meta region holds no document "
                                  f"(length {n})")
            try:
                doc = json.loads(bytes(view[_LEN.size:_LEN.size + n]))
            except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
                raise LayoutError(f"the meta document is not JSON: "
                                  f"{e}") from e
        finally:
            view.release()
        if not isinstance(doc, dict):
            raise LayoutError(f"the meta document is a "
                              f"{type(doc).__name__}, not an object")
        return doc

    # Public API.

    def restore(self) -> tuple[int, Optional[dict]]:
        """Ask gorun for the state to resume from and put it back.

        Returns (next_step, data): on a restore of step G every tensor,
        the optimizer's state and hyper-parameters, the scheduler and the
        RNG states are those saved at G, and (G+1, the data given to
        save(G)) is returned; on a fresh start (0, None), nothing touched.
        """
        prot = self._live()
        step, slot = prot.restore_slot()
        if step == -1:
            return 0, None
        doc = self._read_meta(slot)
        if doc.get("format") != FORMAT:
            raise LayoutError(f"meta format {doc.get('format')!r}, this "
                              f"module reads {FORMAT}")
        if doc.get("fingerprint") != self.fingerprint:
            raise LayoutError(
                f"the state gorun holds (step {step}, world "
                f"{doc.get('world')}) is of another model, optimizer or "
                f"world size than this one (world {self.world_size}): "
                f"its layout fingerprint differs")
        if doc.get("step") != step:
            raise LayoutError(f"the meta document is of step "
                              f"{doc.get('step')}, gorun restored {step}")
        if "params" in self.regions:
            digest = doc.get("digest")
            want = digest.get("params") if isinstance(digest, dict) else None
            got = self._digest(slot)
            if want != got:
                raise LayoutError(
                    f"the parameters restored from a data-parallel peer are "
                    f"not this rank's: the params region of step {step} "
                    f"has {got}, this rank saved {want} (parameters or "
                    f"optimizer state that differ per rank: "
                    f"Protector(replicate_params=True, "
                    f"rank_unique_optimizer=True))")
        model_tensors = self._model_sources()
        try:  # everything decoded before anything is touched
            absent = set(doc["absent"])
            scalars = {int(i): _decode(v)
                       for i, v in doc["optimizer_scalars"].items()}
            groups = [{k: _decode(v) for k, v in g.items()}
                      for g in doc["param_groups"]]
            sched = _decode(doc["scheduler"])
            rng = doc["rng"]
            rng_torch, rng_python = (_decode(rng["torch"]),
                                     _decode(rng["python"]))
            rng_gens = [_decode(s) for s in rng.get("generators", [])]
            rng_cuda = [_decode(s) for s in rng.get("cuda", [])]
            rng_numpy = rng.get("numpy")
            data = _decode(doc["data"])
            if len(groups) != len(self.optimizer.param_groups) or \
                    len(rng_gens) != len(self.generators):
                raise ValueError("param_groups or generators miscounted")
        except (KeyError, TypeError, ValueError, AttributeError,
                RuntimeError) as e:
            raise LayoutError(f"the meta document of step {step} is "
                              f"corrupt: {type(e).__name__}: {e}") from e
        src = self._dst_tensors(slot)
        n_model = len(self._model_entries)
        opt = self.optimizer
        with torch.no_grad():
            for t, s in zip(model_tensors, src[:n_model]):
                t.copy_(s)
            opt.state.clear()
            for e, s in zip(self._opt_entries, src[n_model:]):
                if e.param in absent:
                    continue
                p = self._opt_params[e.param]
                st = opt.state[p]
                st[e.key] = torch.empty(e.shape, dtype=e.dtype,
                                        device=e.device).copy_(s)
        for i, vals in scalars.items():
            opt.state[self._opt_params[i]].update(vals)
        for g, saved in zip(opt.param_groups, groups):
            g.update(saved)
        if self.scheduler is not None and sched is not None:
            self.scheduler.load_state_dict(sched)
        torch.set_rng_state(rng_torch)
        random.setstate(rng_python)
        for g, st in zip(self.generators, rng_gens):
            g.set_state(st)
        if rng_cuda and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng_cuda)
        np = sys.modules.get("numpy")
        if np is not None and rng_numpy is not None:
            name, keys, pos, has_gauss, gauss = rng_numpy
            np.random.set_state((name, np.frombuffer(
                base64.b64decode(keys), dtype="<u4").astype(np.uint32),
                pos, has_gauss, gauss))
        return step + 1, data

    def save(self, step: int, data: Optional[dict] = None) -> None:
        """Protect step: call it after optimizer.step() (and scheduler.step()).

        data: the position of the next batch (a JSON-able dict), returned
        by restore(). Stage, copy every tensor into the slot, write the
        meta document, Commit. (A copy in a background thread, overlapped
        with the next forward and backward, was tried: on 2 cores, 12 MiB
        of state, save() went from 3.0 to 2.0 ms but the step from 53.2 to
        55.0 ms, the copy competing with the compute: no gain, not kept.)
        """
        prot = self._live()
        model_tensors = self._model_sources()
        srcs, absent = self._opt_sources()
        meta = self._meta(step, data, absent)  # before Stage: may refuse
        slot = prot.begin(step)
        dst = self._dst_tensors(slot)
        with torch.no_grad():
            for d, src in zip(dst, model_tensors + srcs):
                if src is None:
                    d.zero_()  # a parameter without state (no grad yet)
                else:
                    d.copy_(src)
        if "params" in self.regions:
            at = meta.rindex(_CRC_HOLE.encode())  # the last key's value
            meta = (meta[:at] + self._digest(slot).encode()
                    + meta[at + len(_CRC_HOLE):])
        mv = prot.view("meta", slot)
        try:
            mv[:len(meta)] = meta
        finally:
            mv.release()
        prot.commit(step)

    def rejoin(self, wrap: Optional[Callable[[], Any]] = None, *,
               timeout: Optional[float] = 120.0,
               group_timeout: Optional[float] = None,
               backend: Optional[str] = None) -> tuple[Any, int,
                                                       Optional[dict]]:
        """Join gorun's new epoch in place: (model, next_step, data).

        For ``gorun --recovery in-place``, on a surviving rank whose
        collective failed or whose save() raised EpochChanged. It waits up
        to timeout seconds for an epoch newer than ``group_epoch``
        (EpochTimeout: the failure was not a host gorun replaced), destroys
        the process group, creates it again for the new epoch's rendezvous
        (``tcp://master_addr:master_port``, this rank and world size,
        group_timeout seconds: pass the one the group was made with;
        default torch's 30 minutes), calls wrap() (which returns the new
        DDP wrapper of the module: model is what it returns, None without
        wrap) and restores as restore() does: every rank rolls back to G.
        ``group_epoch`` is set to the epoch joined once all of that
        succeeded. Before G exists (a host lost before every rank's first
        save() was committed) there is nothing to roll back to: the moved
        ranks start from their initial state and this one cannot,
        GorunError (use ``--recovery restart``).

        When the new group's rendezvous, wrap() or the restore fails with a
        RuntimeError (gloo: a peer lost or silent) or a ServiceError
        (EpochChanged: gorun moved on again, a second host lost during the
        rejoin), it waits up to timeout seconds for an epoch newer than
        the one it tried, destroys the half-made group and tries that one;
        when none comes, that failure is raised (``group_epoch`` unchanged).

        The new wrapper is made before the restore because DDP's
        constructor broadcasts rank 0's parameters: a rank 0 that moved to
        a spare makes its wrapper before its own restore, with its initial
        parameters, and the survivors' restored ones would be overwritten.
        The caller must drop its references to the old wrapper before
        (gc.collect() runs here): its gradient hooks would still fire.
        """
        dist = torch.distributed
        client = self._client
        if client is None:
            raise GorunError("the Protector is closed")
        if dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
            backend = backend or dist.get_backend()
        else:
            rank = int(os.environ["RANK"])
            world = int(os.environ["WORLD_SIZE"])
        kw: dict[str, Any] = {}
        if group_timeout is not None:
            kw["timeout"] = datetime.timedelta(seconds=group_timeout)
        tried = self.group_epoch
        failure: Optional[BaseException] = None
        while True:
            try:
                epoch: Optional[int] = client.wait_epoch(tried, timeout)
            except EpochTimeout:
                if failure is None:
                    raise
                epoch = None
            if epoch is None:
                # The try failed and gorun moved on to no newer epoch:
                # that failure is the one to report.
                assert failure is not None
                raise failure
            failure = None
            addr, port = client.master_addr, client.master_port
            if addr is None or port is None:
                raise GorunError(f"gorun did not say epoch {epoch}'s "
                                 f"rendezvous address (MASTER_ADDR, "
                                 f"MASTER_PORT): its agent is older than "
                                 f"this module")
            if dist.is_initialized():  # the old one, or a try's half-made
                dist.destroy_process_group()
            gc.collect()  # an old DDP wrapper in a reference cycle
            host = f"[{addr}]" if ":" in addr else addr
            model = None
            try:
                dist.init_process_group(backend or "gloo",
                                        init_method=f"tcp://{host}:{port}",
                                        rank=rank, world_size=world, **kw)
                model = wrap() if wrap is not None else None
                step, data = self.restore()
            except (RuntimeError, gorun_rank.ServiceError) as e:
                # A second host lost, or a peer gone silent, while this
                # rank rejoined epoch: gorun's next epoch is tried (the
                # half-made group destroyed first); EpochChanged is a
                # ServiceError.
                failure, tried, model = e, epoch, None
                continue
            if step == 0:  # restore() of G >= 0 gives G + 1
                raise GorunError(
                    f"rejoining epoch {epoch}: no step is protected yet on "
                    f"every rank (G = -1), so gorun cannot roll the job "
                    f"back: this rank's trained state would go on beside "
                    f"the moved ranks' initial one. Run with --recovery "
                    f"restart (the default: every rank starts again, from "
                    f"the start while G = -1), or the failure ends the "
                    f"job")
            self.group_epoch = epoch
            return model, step, data

    def _digest(self, slot: int) -> str:
        """The params region's digest in slot: "sum64:" and the sum of its
        64-bit words (native order) mod 2^64 (a tail shorter than a word
        zero-padded), in hex. Any order of summation gives the same value
        (integer addition mod 2^64), and it runs at memory speed, where
        zlib.crc32 costs 7 times as much: it tells a peer's differing
        parameters from this rank's, not a checksum against corruption
        (gorun's CRC32C of every region does that)."""
        assert self._prot is not None
        view = self._prot.view("params", slot)
        try:
            whole = len(view) // 8 * 8
            total = 0
            if whole:
                words = torch.frombuffer(view[:whole], dtype=torch.int64)
                total = int(words.sum()) & (2**64 - 1)
                del words
            tail = bytes(view[whole:]).ljust(8, b"\0") if whole < len(view) \
                else b""
            if tail:
                total = (total + int.from_bytes(tail, "little")) & (2**64 - 1)
            return "sum64:%016x" % total
        finally:
            view.release()

    def _live(self) -> gorun_rank.Protection:
        if self._prot is None:
            raise GorunError("the Protector is closed")
        return self._prot

    @property
    def protection(self) -> gorun_rank.Protection:
        """The gorun_rank.Protection underneath (status(), committed)."""
        return self._live()

    def close(self) -> None:
        """Unmap the regions and disconnect."""
        self._dst.clear()
        if self._client is not None:
            self._client.close()
        self._client, self._prot = None, None

    def __enter__(self) -> "Protector":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
