"""Python client of gorun's state-protection protocol (stdlib only).

A rank started by gorun protects its training state by talking to its rank
service over the Unix socket named by ``GORUN_SOCKET``. The protocol is
described in ``internal/wire/PROTOCOL.md`` (framing, Hello/Welcome/Epoch/
Error) and ``protect/PROTOCOL.md`` (messages 16-27). The state's bytes never
cross the socket: the service creates shared-memory files holding two slots
per region, this module maps them, and the trainer's bytes are copied into
them between a Stage and a Commit request.

A plain trainer::

    import gorun_rank

    with gorun_rank.Client() as client:
        prot = client.protect({"params": len(params_bytes), "meta": 256})
        step, state = prot.restore()          # (-1, None) on a fresh start
        if state is not None:
            params_bytes = bytearray(state["params"])
        for s in range(step + 1, steps):
            ...                               # train step s
            prot.stage(s, {"params": params_bytes, "meta": meta_bytes})

A PyTorch trainer uses gorun_torch (beside this module), which protects a
model, its optimizer and scheduler in a few lines. Underneath, it writes
straight into the shared memory between begin() (Stage) and commit()
(Commit), and reads a restored slot in place (restore_slot())::

    import torch, gorun_rank

    client = gorun_rank.Client()
    prot = client.protect({"params": flat.numel() * 4, "meta": 256})
    step, slot = prot.restore_slot()          # (-1, -1) on a fresh start
    if step >= 0:
        flat.copy_(torch.frombuffer(prot.view("params", slot),
                                    dtype=torch.float32))
    for s in range(step + 1, steps):
        ...                                   # forward, backward, optimizer
        slot = prot.begin(s)
        torch.frombuffer(prot.view("params", slot),
                         dtype=torch.float32).copy_(flat)
        prot.view("meta", slot)[:len(meta)] = meta
        prot.commit(s)
    prot.close()

stage() and stage_async() do the same from bytes-like objects (stage_async
copies in a background thread while the next step computes).

Under ``gorun --recovery in-place`` the surviving ranks keep running when a
lost host is replaced: gorun moves the job to a new epoch. The client
learns it from the Epoch frames the agent pushes (``epoch``,
``master_addr`` and ``master_port`` follow them), wait_epoch(after,
timeout) waits for an epoch newer than ``after``, and a stage refused
because of the new placement raises EpochChanged; the rank then restores
again (every rank rolls back to G) and goes on. gorun_torch.Protector
.rejoin does all of that for a PyTorch script.

numpy and torch are never imported by this module; any object with the
buffer protocol (bytes, bytearray, memoryview, array.array, numpy arrays)
can be staged.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import select
import socket
import struct
import sys
import threading
import time
from array import array
from typing import Any, Iterable, Mapping, Sequence, Union

__all__ = ["Client", "Protection", "GorunError", "ProtocolError",
           "ServiceError", "EpochChanged", "EpochTimeout", "MAX_FRAME",
           "MAX_STEP"]

MAX_FRAME = 64 << 20
MAX_STEP = 2**53 - 1

# Message types (internal/wire/PROTOCOL.md, protect/PROTOCOL.md).
HELLO, WELCOME, ERROR, EPOCH = 1, 2, 5, 6
PROTECT_HELLO, PROTECT_WELCOME = 16, 17
STAGE, STAGED = 18, 19
COMMIT, COMMITTED = 20, 21
GRADIENT, GRADIENT_DONE = 22, 23
RESTORE, RESTORABLE = 24, 25
STATUS, STATUS_REPLY = 26, 27

_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}\Z")
_HEADER = struct.Struct(">I")

Buffer = Any  # an object with the buffer protocol
RegionData = Union[Buffer, Sequence[Buffer]]


class GorunError(Exception):
    """Base class of this module's errors."""


class ProtocolError(GorunError):
    """An Error frame, a malformed frame, or a lost connection.

    The connection is closed; a new Client may connect again.
    """


class ServiceError(GorunError):
    """An answer carrying ``err``: the request could not be done.

    The connection stays usable.
    """


class EpochChanged(ServiceError):
    """A stage refused because gorun moved the job to a new epoch.

    The answer said ``"new_placement": true`` (protect/PROTOCOL.md, "Stage and
    Commit"): a host was replaced under ``--recovery in-place``. The rank
    restores again (Protection.restore_slot: every rank rolls back to G)
    and goes on from there; the connection stays usable.
    """


class EpochTimeout(GorunError):
    """wait_epoch: no newer epoch within the timeout.

    The connection stays usable.
    """


def _check_step(step: int) -> int:
    if isinstance(step, bool) or not isinstance(step, int):
        raise TypeError(f"step must be an int, not {type(step).__name__}")
    if not 0 <= step <= MAX_STEP:
        raise ValueError(f"step {step} out of range [0, 2**53-1]")
    return step


def _field(obj: Mapping[str, Any], key: str, kind: type = int) -> Any:
    """obj[key], which must be of type kind, else ProtocolError."""
    value = obj.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ProtocolError(f"answer has no valid {key!r}: {obj!r}")
    return value


def _float32_bytes(floats: Union[Buffer, Iterable[float]]) -> memoryview:
    """floats as little-endian float32 bytes."""
    try:
        view: memoryview | None = memoryview(floats)  # type: ignore[arg-type]
    except TypeError:
        view = None
    if view is not None:
        if view.format in ("B", "b", "c"):
            raw = _bytes_view(view)
            if raw.nbytes % 4:
                raise ValueError("raw gradient bytes not a multiple of 4")
            return raw
        if view.format == "<f" or (view.format in ("f", "=f")
                                   and sys.byteorder == "little"):
            return _bytes_view(view)
        if view.ndim != 1:
            view = view.cast("B").cast(view.format)
        floats = view.tolist()
    values = array("f", floats)  # type: ignore[arg-type]
    if sys.byteorder == "big":
        values.byteswap()
    return memoryview(values).cast("B")


def _bytes_view(part: Buffer) -> memoryview:
    """A flat byte view of part (which must be C-contiguous)."""
    view = memoryview(part)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


class Client:
    """A session with the rank service on a rank's Unix socket.

    Attributes after the handshake: ``job``, ``rank``, ``version``,
    ``epoch`` and the epoch's torchrun rendezvous address ``master_addr``
    and ``master_port`` (None when gorun does not say), the three kept up
    to date by the Epoch frames the agent pushes (read while waiting for an
    answer, or by wait_epoch).
    """

    def __init__(self, socket_path: str | None = None,
                 timeout: float | None = None) -> None:
        path = socket_path or os.environ.get("GORUN_SOCKET")
        if not path:
            raise GorunError("GORUN_SOCKET is not set: run under gorun")
        self._lock = threading.Lock()
        self._protection: Protection | None = None
        self._sock: socket.socket | None = socket.socket(
            socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.settimeout(timeout)
            # gorun names a Linux abstract socket "@name" (Go's spelling);
            # Python's is a leading NUL.
            self._sock.connect("\0" + path[1:] if path.startswith("@")
                               else path)
            self._send(HELLO, {"v": 1, "pid": os.getpid()})
            welcome = self._await(WELCOME)
            self.version: int = _field(welcome, "v")
            self.job: str = _field(welcome, "job", str)
            self.rank: int = _field(welcome, "rank")
            self.epoch: int = _field(welcome, "epoch")
            self.master_addr: str | None = None
            self.master_port: int | None = None
            self._note_epoch(welcome)
        except BaseException:
            self.close()
            raise

    # Framing.

    def _send(self, mtype: int, obj: Mapping[str, Any]) -> None:
        sock = self._live()
        body = bytes([mtype]) + json.dumps(
            obj, separators=(",", ":")).encode()
        try:
            sock.sendall(_HEADER.pack(len(body)) + body)
        except OSError as e:
            self._drop()
            raise ProtocolError(f"connection lost: {e}") from e

    def _read_exact(self, n: int) -> bytes:
        sock = self._live()
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = sock.recv(min(n - len(buf), 1 << 20))
            except OSError as e:  # a reset, or the timeout given
                self._drop()
                raise ProtocolError(f"connection lost: {e}") from e
            if not chunk:
                self._drop()
                raise ProtocolError(
                    "connection closed" if not buf and n == _HEADER.size
                    else "connection closed mid-frame")
            buf += chunk
        return bytes(buf)

    def _recv(self) -> tuple[int, dict[str, Any]]:
        (length,) = _HEADER.unpack(self._read_exact(_HEADER.size))
        if not 1 <= length <= MAX_FRAME:
            self._drop()
            raise ProtocolError(f"frame length {length} out of [1, 64 MiB]")
        body = self._read_exact(length)
        try:
            obj = json.loads(body[1:])
        except (UnicodeDecodeError, ValueError) as e:
            self._drop()
            raise ProtocolError(f"frame of type {body[0]}: bad JSON") from e
        if not isinstance(obj, dict):
            self._drop()
            raise ProtocolError(f"frame of type {body[0]}: not an object")
        return body[0], obj

    def _note_epoch(self, obj: Mapping[str, Any]) -> None:
        """Take the epoch and its rendezvous address from a Welcome or an
        Epoch frame."""
        epoch = obj.get("epoch")
        if not isinstance(epoch, int) or isinstance(epoch, bool):
            return
        addr, port = obj.get("master_addr"), obj.get("master_port")
        self.epoch = epoch
        self.master_addr = addr if isinstance(addr, str) and addr else None
        self.master_port = (port if isinstance(port, int)
                            and not isinstance(port, bool)
                            and 0 < port < 65536 else None)

    def _await(self, answer: int) -> dict[str, Any]:
        """Read frames, noting Epoch ones, until the answer of type
        answer."""
        while True:
            mtype, obj = self._recv()
            if mtype == EPOCH:
                self._note_epoch(obj)
                continue
            if mtype == ERROR:
                self._drop()
                raise ProtocolError(f"refused by the service: "
                                    f"{obj.get('err', obj)}")
            if mtype != answer:
                self._drop()
                raise ProtocolError(f"got a frame of type {mtype}, "
                                    f"waiting for {answer}")
            if "err" in obj:
                if obj.get("new_placement") is True:
                    raise EpochChanged(str(obj["err"]))
                raise ServiceError(str(obj["err"]))
            return obj

    def _call(self, mtype: int, obj: Mapping[str, Any],
              answer: int) -> dict[str, Any]:
        """Send one request and return its answer (one at a time)."""
        with self._lock:
            self._send(mtype, obj)
            return self._await(answer)

    def _live(self) -> socket.socket:
        if self._sock is None:
            raise ProtocolError("the connection is closed")
        return self._sock

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    # Public API.

    def wait_epoch(self, after: int, timeout: float | None = None) -> int:
        """Wait until an epoch newer than after is known; return it.

        Reads the Epoch frames the agent pushes (no request may be in
        flight meanwhile: it waits for the one that is) until one is newer
        than after, then every frame already readable, so that the newest
        epoch gorun announced is returned, not the first one newer than
        after (epochs 4 and 5 pushed before a survivor looks: 5, whose
        rendezvous the moved ranks join). ``master_addr`` and
        ``master_port`` are then that epoch's. EpochTimeout when timeout
        seconds pass first (the connection stays usable), ProtocolError
        when the connection closes or anything but an Epoch frame arrives.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while True:
                sock = self._live()
                left: float | None = 0.0  # newer known: only what is there
                if self.epoch <= after and deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise EpochTimeout(
                            f"no epoch after {after} within {timeout} s "
                            f"(the current one is {self.epoch})")
                elif self.epoch <= after:
                    left = None
                ready, _, _ = select.select([sock], [], [], left)
                if not ready:
                    if self.epoch > after:
                        return self.epoch
                    continue
                mtype, obj = self._recv()
                if mtype == EPOCH:
                    self._note_epoch(obj)
                    continue
                self._drop()
                if mtype == ERROR:
                    raise ProtocolError(f"refused by the service: "
                                        f"{obj.get('err', obj)}")
                raise ProtocolError(f"got a frame of type {mtype} while "
                                    f"waiting for a new epoch")

    def protect(self, regions: Mapping[str, int],
                gradient: int = 0) -> Protection:
        """Declare the regions (name -> size in bytes, in order) and map them.

        gradient, when not 0, asks for a buffer of that many float32
        elements for Protection.gradient. Returns a Protection; one per
        Client.
        """
        if self._protection is not None:
            raise GorunError("protect was already called on this client")
        if not 1 <= len(regions) <= 16:
            raise ValueError("1 to 16 regions are needed")
        decl = []
        for name, size in regions.items():
            if not isinstance(name, str) or not _NAME.match(name):
                raise ValueError(f"bad region name {name!r}")
            if (isinstance(size, bool) or not isinstance(size, int)
                    or not 0 <= size <= 1 << 40):
                raise ValueError(f"bad size {size!r} of region {name}")
            decl.append({"name": name, "size": size})
        if (isinstance(gradient, bool) or not isinstance(gradient, int)
                or not 0 <= gradient <= 1 << 31):
            raise ValueError(f"bad gradient size {gradient!r}")
        welcome = self._call(PROTECT_HELLO,
                             {"v": 1, "regions": decl, "gradient": gradient},
                             PROTECT_WELCOME)
        self._protection = Protection(self, decl, gradient, welcome)
        return self._protection

    def close(self) -> None:
        """Unmap the protection's files, if any, and close the socket."""
        prot, self._protection = self._protection, None
        if prot is not None:
            prot._unmap()
        self._drop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Region:
    """One region's mapped file: slot i is size bytes at i*stride."""

    def __init__(self, name: str, size: int, path: str, stride: int) -> None:
        self.name, self.size, self.stride = name, size, stride
        self.map: mmap.mmap | None = None
        if stride < size or stride < 0:
            raise ProtocolError(f"region {name}: stride {stride} < {size}")
        fd = os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
        try:
            actual = os.fstat(fd).st_size
            if actual != 2 * stride:
                raise GorunError(f"region {name}: {path} is {actual} bytes, "
                                 f"not 2*{stride}")
            if stride:
                self.map = mmap.mmap(fd, 2 * stride, mmap.MAP_SHARED,
                                     mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)

    def offset(self, slot: int) -> int:
        if slot not in (0, 1):
            raise ValueError(f"slot {slot!r} is not 0 or 1")
        return slot * self.stride


def _close_map(m: mmap.mmap | None) -> None:
    if m is None:
        return
    try:
        m.close()
    except BufferError:
        pass  # views handed out are still alive: unmapped once they go


class _Pending:
    """A stage running in the background."""

    def __init__(self) -> None:
        self.wait_ns = 0
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None


class Protection:
    """A rank's protected regions, mapped; made by Client.protect.

    Attributes: ``committed`` (newest step committed locally, or -1), ``g``
    (the globally recoverable step known, or -1; refreshed by status()),
    ``replicas``, ``regions`` (the names, in order) and ``sizes``.
    """

    def __init__(self, client: Client, decl: list[dict[str, Any]],
                 gradient: int, welcome: dict[str, Any]) -> None:
        self._client = client
        self.committed: int = _field(welcome, "committed")
        self.g: int = _field(welcome, "g")
        self.replicas: int = _field(welcome, "replicas")
        got = _field(welcome, "regions", list)
        if len(got) != len(decl):
            raise ProtocolError("welcome has a different number of regions")
        self._regions: dict[str, _Region] = {}
        self._grad: mmap.mmap | None = None
        self._grad_n = 0
        self._pending: _Pending | None = None
        self.last_wait_ns = 0
        try:
            for want, r in zip(decl, got):
                if not isinstance(r, dict) or r.get("name") != want["name"] \
                        or r.get("size") != want["size"]:
                    raise ProtocolError(f"welcome region {r!r} is not "
                                        f"the declared {want!r}")
                self._regions[want["name"]] = _Region(
                    want["name"], want["size"], _field(r, "path", str),
                    _field(r, "stride"))
            if gradient:
                self._map_gradient(gradient, welcome.get("gradient"))
        except BaseException:
            self._unmap()
            raise
        self.regions: tuple[str, ...] = tuple(self._regions)
        self.sizes: dict[str, int] = {n: r.size
                                      for n, r in self._regions.items()}

    def _map_gradient(self, n: int, g: Any) -> None:
        if not isinstance(g, dict):
            raise ProtocolError("welcome has no gradient buffer")
        size = _field(g, "size")
        if size < 4 * n:
            raise ProtocolError(f"gradient buffer of {size} bytes < {n}*4")
        fd = os.open(_field(g, "path", str),
                     os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
        try:
            if os.fstat(fd).st_size < size:
                raise GorunError("the gradient file is shorter than its size")
            self._grad = mmap.mmap(fd, size, mmap.MAP_SHARED,
                                   mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._grad_n = n

    def _region(self, name: str) -> _Region:
        try:
            return self._regions[name]
        except KeyError:
            raise KeyError(f"no region {name!r}") from None

    def view(self, name: str, slot: int) -> memoryview:
        """A writable view of exactly the region's bytes in slot (0 or 1).

        Release the views (or drop them) before close() for the files to be
        unmapped at once.
        """
        r = self._region(name)
        off = r.offset(slot)
        if r.map is None:
            return memoryview(bytearray(0))
        return memoryview(r.map)[off:off + r.size]

    def _prepare(self, data: Mapping[str, RegionData]) -> dict[str, list]:
        """Byte views of every region's parts, checked against the sizes."""
        extra = set(data) - set(self._regions)
        if extra:
            raise ValueError(f"unknown regions {sorted(extra)}")
        out: dict[str, list[memoryview]] = {}
        for name, r in self._regions.items():
            if name not in data:
                raise ValueError(f"no data for region {name!r}")
            parts = data[name]
            if isinstance(parts, (list, tuple)):
                views = [_bytes_view(p) for p in parts]
            else:
                views = [_bytes_view(parts)]
            total = sum(v.nbytes for v in views)
            if total != r.size:
                raise ValueError(f"region {name!r}: {total} bytes given, "
                                 f"its size is {r.size}")
            out[name] = views
        return out

    def _begin(self, step: int) -> tuple[int, int]:
        """Stage step: (slot, wait_ns)."""
        staged = self._client._call(STAGE, {"step": step}, STAGED)
        slot = _field(staged, "slot")
        wait_ns = _field(staged, "wait_ns")
        if slot not in (0, 1) or staged.get("step") != step:
            raise ProtocolError(f"bad Staged answer {staged!r}")
        self.last_wait_ns = wait_ns
        return slot, wait_ns

    def _commit(self, step: int) -> None:
        done = self._client._call(COMMIT, {"step": step}, COMMITTED)
        if done.get("step") != step:
            raise ProtocolError(f"bad Committed answer {done!r}")
        self.committed = step

    def _stage(self, step: int, parts: dict[str, list[memoryview]]) -> int:
        slot, wait_ns = self._begin(step)
        for name, views in parts.items():
            r = self._regions[name]
            if r.map is None:
                continue
            off = r.offset(slot)
            for v in views:
                r.map[off:off + v.nbytes] = v
                off += v.nbytes
        self._commit(step)
        return wait_ns

    def begin(self, step: int) -> int:
        """Stage step and return the slot (0 or 1) to write it into.

        The low-level half of stage(): the caller then writes every
        region's bytes into ``view(name, slot)`` (for instance with
        ``torch.frombuffer(view).copy_(tensor)``, no intermediate copy) and
        calls commit(step). The wait at the overwrite rule, in nanoseconds,
        is left in ``last_wait_ns``. Waits for a pending stage_async first.
        EpochChanged when a new placement (a new epoch, ``--recovery
        in-place``) refused the stage: restore again.
        """
        _check_step(step)
        self.wait()
        return self._begin(step)[0]

    def commit(self, step: int) -> None:
        """Commit step, staged by begin(step) and written into its slot."""
        _check_step(step)
        self._commit(step)

    def stage(self, step: int, data: Mapping[str, RegionData]) -> int:
        """Protect step: Stage, copy every region's bytes, Commit.

        data maps every region name to a bytes-like object or a list of
        them (concatenated); the total must be the region's size, else
        ValueError before any request. Returns the wait at the overwrite
        rule, in nanoseconds. Waits for a pending stage_async first.
        """
        _check_step(step)
        self.wait()
        parts = self._prepare(data)
        try:
            return self._stage(step, parts)
        finally:
            for views in parts.values():
                for v in views:
                    v.release()

    def stage_async(self, step: int, data: Mapping[str, RegionData]) -> None:
        """Like stage(), in a background thread; wait() gives the result.

        The caller must not modify the data buffers until wait() returns
        (pass snapshots, such as bytes, to go on training meanwhile). A
        stage still pending is waited for first, and its error raised.
        """
        _check_step(step)
        self.wait()
        parts = self._prepare(data)
        pending = _Pending()

        def run() -> None:
            try:
                pending.wait_ns = self._stage(step, parts)
            except BaseException as e:  # handed to wait()
                pending.error = e
            finally:
                for views in parts.values():
                    for v in views:
                        v.release()

        pending.thread = threading.Thread(
            target=run, name=f"gorun-stage-{step}", daemon=True)
        self._pending = pending
        pending.thread.start()

    def wait(self) -> int:
        """Wait for the pending stage_async: its wait_ns, or its error.

        Returns 0 when nothing is pending.
        """
        pending, self._pending = self._pending, None
        if pending is None:
            return 0
        assert pending.thread is not None
        pending.thread.join()
        if pending.error is not None:
            raise pending.error
        return pending.wait_ns

    def gradient(self, step: int,
                 floats: Union[Buffer, Iterable[float]]) -> int:
        """Write the gradient of step as float32 and send it.

        floats: an array('f'), a buffer of float32 (or raw bytes of
        little-endian float32), or any sequence of numbers. Returns the
        compressed size the service reports.
        """
        _check_step(step)
        if self._grad is None:
            raise GorunError("no gradient buffer: protect(gradient=n)")
        raw = _float32_bytes(floats)
        n = raw.nbytes // 4
        if n > self._grad_n:
            raise ValueError(f"{n} gradient elements, the buffer holds "
                             f"{self._grad_n}")
        self._grad[:raw.nbytes] = raw
        done = self._client._call(GRADIENT, {"step": step, "n": n},
                                  GRADIENT_DONE)
        return _field(done, "bytes")

    def restore_slot(self) -> tuple[int, int]:
        """Restore: the step to resume from and the slot holding it.

        Returns (-1, -1) on a fresh start. The caller reads the state
        through ``view(name, slot)`` (no copy) and continues by staging
        step+1; the slot must not be written. A pending stage_async is
        waited for first: its EpochChanged is dropped (this restore is what
        that error asks for), any other error of it raised as by wait().
        """
        try:
            self.wait()
        except EpochChanged:
            pass
        ans = self._client._call(RESTORE, {}, RESTORABLE)
        step = _field(ans, "step")
        if step == -1:
            return -1, -1
        slot = _field(ans, "slot")
        if step < 0 or slot not in (0, 1):
            raise ProtocolError(f"bad Restorable answer {ans!r}")
        self.committed = step
        return step, slot

    def restore(self) -> tuple[int, dict[str, bytes] | None]:
        """The step to resume from and a copy of every region's bytes.

        Returns (-1, None) when there is nothing to restore. A pending
        stage_async is handled as by restore_slot().
        """
        step, slot = self.restore_slot()
        if step == -1:
            return -1, None
        out = {}
        for name, r in self._regions.items():
            off = r.offset(slot)
            out[name] = (r.map[off:off + r.size] if r.map is not None
                         else b"")
        return step, out

    def status(self) -> dict[str, Any]:
        """The service's StatusReply (committed, replicated, g, …)."""
        ans = self._client._call(STATUS, {}, STATUS_REPLY)
        g = ans.get("g")
        if isinstance(g, int) and not isinstance(g, bool):
            self.g = g
        return ans

    def _unmap(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None and pending.thread is not None:
            pending.thread.join()
        for r in self._regions.values():
            _close_map(r.map)
            r.map = None
        _close_map(self._grad)
        self._grad = None

    def close(self) -> None:
        """Wait for a pending stage, unmap the files, close the socket."""
        self._client.close()
        self._unmap()

    def __enter__(self) -> Protection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
