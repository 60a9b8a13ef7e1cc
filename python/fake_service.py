"""A fake rank service in Python, for the tests of the Python clients
(test_gorun_rank, test_gorun_torch and test_gorun_torch_gloo): the
service side of protect/PROTOCOL.md for one rank, on a Unix socket.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import tempfile
import threading
import zlib
from typing import Any, Callable

# A hook sees (session, type, payload) and returns True when it answered.
Hook = Callable[["Session", int, dict], bool]


def frame(mtype: int, obj: Any) -> bytes:
    body = bytes([mtype]) + json.dumps(obj).encode()
    return struct.pack(">I", len(body)) + body


class FakeService:
    """A rank service for one rank, serving a Unix socket in a temp dir,
    or with abstract, a Linux abstract socket ("@name", as gorun names it).

    Its state (the regions, the files, which slot holds which committed
    step) outlives connections, as the real service's does for a restarted
    rank. G is the newest committed step (no replicas).
    """

    def __init__(self, epoch_frames: bool = False,
                 abstract: bool = False) -> None:
        self.dir = tempfile.mkdtemp(prefix="gorun-fake-")
        self.path = os.path.join(self.dir, "rank.sock")
        bind_to = self.path
        if abstract:
            self.path = "@gorun-fake-" + os.urandom(8).hex()
            bind_to = "\0" + self.path[1:]
        self.epoch_frames = epoch_frames  # an Epoch before every answer
        self.hooks: list[Hook] = []
        self.log: list[tuple[int, dict]] = []  # every request received
        self.hellos: list[dict] = []
        self.gradients: list[tuple[int, bytes]] = []
        self.regions: list[dict] | None = None  # as declared
        self.slot_step: list[int | None] = [None, None]
        self.slot_crc: list[dict[str, int]] = [{}, {}]
        self.staged: tuple[int, int] | None = None  # (step, slot)
        self.last = -1  # newest step committed since the last restore
        self.stages = 0
        # The epoch and its rendezvous address, as Welcome and Epoch say.
        self.epoch, self.master = 3, ("10.0.0.1", 29500)
        # A new placement since the last restore: stages are refused with
        # new_placement (protect/PROTOCOL.md), as the real service's that
        # would wait at the overwrite rule.
        self.placed_anew = False
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.sessions: list[Session] = []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(bind_to)
        self.listener.listen()
        self.listener.settimeout(0.05)
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            s = Session(self, conn)
            self.sessions.append(s)
            s.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.listener.close()
        for s in self.sessions:
            s.shut()
        for s in self.sessions:
            s.thread.join()
        shutil.rmtree(self.dir)

    def requests(self) -> list[int]:
        return [t for t, _ in self.log]

    def push_epoch(self, epoch: int, addr: str | None, port: int | None,
                   new_placement: bool = True) -> None:
        """Move to a new epoch: an Epoch frame to every session, unasked
        (and, with new_placement, stages refused until a restore)."""
        with self.lock:
            self.epoch, self.master = epoch, (addr, port)
            self.placed_anew = self.placed_anew or new_placement
            push = self.epoch_frame()
        for s in self.sessions:
            s.send_raw(frame(6, push))

    def epoch_frame(self) -> dict:
        out: dict[str, Any] = {"v": 1, "job": "fakejob", "epoch": self.epoch,
                               "data_key": "00", "table": ""}
        addr, port = self.master
        if addr is not None:
            out["master_addr"] = addr
        if port is not None:
            out["master_port"] = port
        return out

    # The service's side of each request; each returns (type, answer).

    def region_path(self, name: str) -> str:
        return os.path.join(self.dir, f"gorun-fake-r0-{name}")

    @staticmethod
    def stride(size: int) -> int:
        return (size + 4095) // 4096 * 4096

    def protect_hello(self, req: dict) -> tuple[int, dict]:
        regions, n = req["regions"], req["gradient"]
        if self.regions is None:
            self.regions = regions
            for r in regions:
                with open(self.region_path(r["name"]), "wb") as f:
                    f.truncate(2 * self.stride(r["size"]))
        elif regions != self.regions:
            return 17, {"err": "different regions"}
        ans: dict[str, Any] = {
            "v": 1, "job": "fakejob", "rank": 0, "replicas": 0,
            "regions": [{"name": r["name"], "size": r["size"],
                         "path": self.region_path(r["name"]),
                         "stride": self.stride(r["size"])}
                        for r in regions],
            "committed": self.newest()[0], "g": self.newest()[0]}
        if n:
            gpath = self.region_path("gradient")
            with open(gpath, "wb") as f:
                f.truncate(4 * n)
            ans["gradient"] = {"path": gpath, "size": 4 * n}
        return 17, ans

    def newest(self) -> tuple[int, int]:
        """(step, slot) of the newest committed step, or (-1, -1)."""
        best = (-1, -1)
        for slot, step in enumerate(self.slot_step):
            if step is not None and step > best[0]:
                best = (step, slot)
        return best

    def checksums(self, slot: int) -> dict[str, int]:
        assert self.regions is not None
        out = {}
        for r in self.regions:
            with open(self.region_path(r["name"]), "rb") as f:
                f.seek(slot * self.stride(r["size"]))
                out[r["name"]] = zlib.crc32(f.read(r["size"]))
        return out

    def stage(self, req: dict) -> tuple[int, dict]:
        step = req["step"]
        if self.placed_anew:
            return 19, {"step": step, "new_placement": True,
                        "err": "waiting for step 1 to be recoverable "
                               "everywhere: a new placement (epoch) "
                               "began: restore from G"}
        if step <= self.last:
            return 19, {"err": f"step {step} does not increase"}
        newest_step, newest_slot = self.newest()
        slot = 0 if newest_slot == -1 else 1 - newest_slot  # ping-pong
        self.slot_step[slot] = None  # staging: never valid until committed
        self.staged = (step, slot)
        self.stages += 1
        return 19, {"step": step, "slot": slot, "wait_ns": 0}

    def commit(self, req: dict) -> tuple[int, dict] | None:
        if self.staged is None or self.staged[0] != req["step"]:
            # internal/keeper/service.go: an err answer, the connection kept.
            return 21, {"step": req["step"],
                        "err": f"step {req['step']} is not the step staged"}
        step, slot = self.staged
        self.staged = None
        self.slot_crc[slot] = self.checksums(slot)
        self.slot_step[slot] = step
        self.last = step
        return 21, {"step": step}

    def restore(self) -> tuple[int, dict]:
        self.staged = None
        self.placed_anew = False
        step, slot = self.newest()
        if step == -1:
            return 25, {"step": -1}
        if self.checksums(slot) != self.slot_crc[slot]:
            return 25, {"err": "checksum mismatch"}
        self.last = step
        return 25, {"step": step, "slot": slot, "tier": 1}

    def gradient(self, req: dict) -> tuple[int, dict]:
        n = req["n"]
        with open(self.region_path("gradient"), "rb") as f:
            self.gradients.append((req["step"], f.read(4 * n)))
        return 23, {"step": req["step"], "bytes": n + 8}

    def status(self) -> tuple[int, dict]:
        c = self.newest()[0]
        return 27, {"committed": c, "replicated": c, "g": c,
                    "stages": self.stages, "wait_ns": 0, "holders": []}


class Session:
    """One connection to the fake service."""

    def __init__(self, svc: FakeService, conn: socket.socket) -> None:
        self.svc, self.conn = svc, conn
        self.wlock = threading.Lock()  # answers and pushes
        self.thread = threading.Thread(target=self.serve, daemon=True)

    def shut(self) -> None:
        try:
            self.conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def read(self) -> tuple[int, dict] | None:
        head = self.conn.recv(4, socket.MSG_WAITALL)
        if len(head) < 4:
            return None
        (n,) = struct.unpack(">I", head)
        body = self.conn.recv(n, socket.MSG_WAITALL)
        if len(body) < n:
            return None
        return body[0], json.loads(body[1:])

    def send(self, mtype: int, obj: Any) -> None:
        with self.wlock:
            if self.svc.epoch_frames:
                self.conn.sendall(frame(6, {"v": 1, "job": "fakejob",
                                            "epoch": 7, "table": ""}))
            self.conn.sendall(frame(mtype, obj))

    def send_raw(self, data: bytes) -> None:
        with self.wlock:
            self.conn.sendall(data)

    def serve(self) -> None:
        try:
            self._serve()
        except OSError:
            pass
        finally:
            self.conn.close()

    def _serve(self) -> None:
        svc = self.svc
        msg = self.read()
        if msg is None or msg[0] != 1:
            return
        svc.hellos.append(msg[1])
        with svc.lock:
            self.send(2, dict(svc.epoch_frame(), rank=0))
        protected = False
        while (msg := self.read()) is not None:
            mtype, req = msg
            with svc.lock:
                svc.log.append((mtype, req))
                if any(hook(self, mtype, req) for hook in svc.hooks):
                    continue
                ans = self.answer(mtype, req, protected)
            if ans is None:
                self.send(5, {"err": f"bad request of type {mtype}"})
                return
            protected = protected or ans[0] == 17
            self.send(*ans)

    def answer(self, mtype: int, req: dict,
               protected: bool) -> tuple[int, dict] | None:
        svc = self.svc
        if mtype == 16 and not protected:
            return svc.protect_hello(req)
        if not protected:
            return None
        if mtype == 18:
            return svc.stage(req)
        if mtype == 20:
            return svc.commit(req)
        if mtype == 22:
            return svc.gradient(req)
        if mtype == 24:
            return svc.restore()
        if mtype == 26:
            return svc.status()
        return None
