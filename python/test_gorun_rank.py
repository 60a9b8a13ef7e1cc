"""Tests of gorun_rank against a fake rank service written in Python.

Run with: cd python && python3 -m unittest -v test_gorun_rank
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import threading
import unittest
from array import array
from typing import Any, Callable

from fake_service import FakeService, Session, frame
from gorun_rank import (Client, EpochChanged, EpochTimeout, GorunError,
                        ProtocolError, ServiceError, MAX_FRAME)

HERE = os.path.dirname(os.path.abspath(__file__))
PYTRAIN = os.path.join(HERE, "..", "examples", "pytrain", "pytrain.py")


REGIONS = {"optimizer": 5000, "params": 4096, "meta": 256}


def state(seed: int) -> dict[str, bytes]:
    return {name: bytes((seed + i) % 251 for i in range(size))
            for name, size in REGIONS.items()}


class GorunRankTest(unittest.TestCase):
    def setUp(self) -> None:
        self.svc = FakeService()
        self.addCleanup(self.svc.close)

    def client(self) -> Client:
        c = Client(self.svc.path, timeout=10)
        self.addCleanup(c.close)
        return c

    def hook(self, mtype: int, reply: Callable[[Session], None]) -> None:
        """Answer the next request of type mtype with reply."""
        def h(session: Session, t: int, req: dict) -> bool:
            if t != mtype:
                return False
            self.svc.hooks.remove(h)
            reply(session)
            return True
        self.svc.hooks.append(h)

    def test_handshake(self) -> None:
        c = self.client()
        self.assertEqual((c.job, c.rank, c.epoch, c.version),
                         ("fakejob", 0, 3, 1))
        self.assertEqual(self.svc.hellos, [{"v": 1, "pid": os.getpid()}])

    def test_socket_from_environment(self) -> None:
        old = os.environ.get("GORUN_SOCKET")
        os.environ["GORUN_SOCKET"] = self.svc.path
        try:
            with Client() as c:
                self.assertEqual(c.job, "fakejob")
            del os.environ["GORUN_SOCKET"]
            with self.assertRaises(GorunError):
                Client()
        finally:
            if old is not None:
                os.environ["GORUN_SOCKET"] = old

    def test_abstract_socket(self) -> None:
        svc = FakeService(abstract=True)
        self.addCleanup(svc.close)
        with Client(svc.path, timeout=10) as c:
            self.assertEqual((c.job, c.rank, c.epoch), ("fakejob", 0, 3))
        self.assertEqual(os.listdir(svc.dir), [])  # no file
        self.assertEqual(svc.hellos, [{"v": 1, "pid": os.getpid()}])

    def test_welcome_master(self) -> None:
        c = self.client()
        self.assertEqual((c.epoch, c.master_addr, c.master_port),
                         (3, "10.0.0.1", 29500))

    def test_welcome_without_master(self) -> None:
        self.svc.master = (None, None)
        c = self.client()
        self.assertEqual((c.epoch, c.master_addr, c.master_port),
                         (3, None, None))

    def test_wait_epoch_current_is_newer(self) -> None:
        c = self.client()
        self.assertEqual(c.wait_epoch(2, timeout=0), 3)

    def test_wait_epoch_reads_pushes(self) -> None:
        c = self.client()
        prot = c.protect(REGIONS)
        # Two pushes, unread: the client still knows epoch 3.
        self.svc.push_epoch(4, "10.0.0.2", 29600)
        self.svc.push_epoch(5, "10.0.0.3", 29601)
        self.assertEqual(c.epoch, 3)
        # Both read: the newest epoch and its rendezvous, not epoch 4's
        # (whose rendezvous the moved ranks never join).
        self.assertEqual(c.wait_epoch(3, timeout=10), 5)
        self.assertEqual((c.master_addr, c.master_port),
                         ("10.0.0.3", 29601))
        self.assertEqual(c.wait_epoch(4, timeout=0), 5)
        # A push behind a known newer epoch is read too.
        self.svc.push_epoch(6, "10.0.0.4", 29602)
        self.assertEqual(c.wait_epoch(3, timeout=0), 6)
        self.assertEqual(c.master_port, 29602)
        # The session goes on.
        self.assertEqual(prot.status()["committed"], -1)

    def test_wait_epoch_while_pushed(self) -> None:
        c = self.client()
        got: list[Any] = []
        t = threading.Thread(target=lambda: got.append(
            c.wait_epoch(3, timeout=30)))
        t.start()
        self.svc.push_epoch(4, "10.0.0.2", 29600)
        t.join()
        self.assertEqual(got, [4])
        self.assertEqual(c.master_port, 29600)

    def test_epoch_frame_in_answer_updates_master(self) -> None:
        c = self.client()
        prot = c.protect(REGIONS)
        self.svc.push_epoch(4, "10.0.0.2", 29600, new_placement=False)
        prot.status()  # reads the push before its answer
        self.assertEqual((c.epoch, c.master_addr, c.master_port),
                         (4, "10.0.0.2", 29600))
        self.assertEqual(c.wait_epoch(3, timeout=0), 4)

    def test_wait_epoch_timeout(self) -> None:
        c = self.client()
        prot = c.protect(REGIONS)
        with self.assertRaises(EpochTimeout):
            c.wait_epoch(3, timeout=0.05)
        # The connection stays usable.
        prot.stage(0, state(1))
        self.assertEqual(prot.status()["committed"], 0)

    def test_wait_epoch_connection_closed(self) -> None:
        c = self.client()
        c.protect(REGIONS)
        for s in self.svc.sessions:
            s.shut()
        with self.assertRaises(ProtocolError):
            c.wait_epoch(3, timeout=30)

    def test_wait_epoch_other_frame(self) -> None:
        c = self.client()
        c.protect(REGIONS)
        for s in self.svc.sessions:
            s.send_raw(frame(5, {"err": "go away"}))
        with self.assertRaisesRegex(ProtocolError, "go away"):
            c.wait_epoch(3, timeout=30)

    def test_stage_refused_by_new_placement(self) -> None:
        c = self.client()
        prot = c.protect(REGIONS)
        prot.stage(0, state(1))
        prot.stage(1, state(2))
        self.svc.push_epoch(4, "10.0.0.2", 29600)
        with self.assertRaises(EpochChanged) as cm:
            prot.stage(2, state(3))
        self.assertIsInstance(cm.exception, ServiceError)
        self.assertEqual(c.epoch, 4)
        # Restored in place: back to G, and stages go on.
        step, got = prot.restore()
        self.assertEqual((step, got), (1, state(2)))
        prot.stage(2, state(3))

    def test_restore_after_stage_async_refused_by_new_placement(
            self) -> None:
        c = self.client()
        prot = c.protect(REGIONS)
        prot.stage(0, state(1))
        prot.stage(1, state(2))
        self.svc.push_epoch(4, "10.0.0.2", 29600)
        prot.stage_async(2, state(3))  # refused: EpochChanged pending
        # The restore that error asks for: done, the error dropped.
        self.assertEqual(prot.restore(), (1, state(2)))
        self.assertEqual(prot.wait(), 0)
        prot.stage_async(2, state(3))
        prot.wait()
        self.svc.push_epoch(5, "10.0.0.3", 29601)
        prot.stage_async(3, state(4))  # refused
        self.assertEqual(prot.restore_slot()[0], 2)
        # Other errors of the pending stage are raised, as by wait().
        prot.stage_async(2, state(3))  # does not increase
        with self.assertRaises(ServiceError) as cm:
            prot.restore()
        self.assertNotIsInstance(cm.exception, EpochChanged)

    def test_other_stage_refusal_is_not_epoch_changed(self) -> None:
        c = self.client()
        prot = c.protect(REGIONS)
        prot.stage(0, state(1))
        with self.assertRaises(ServiceError) as cm:
            prot.stage(0, state(1))  # does not increase
        self.assertNotIsInstance(cm.exception, EpochChanged)

    def test_epoch_frames_skipped(self) -> None:
        self.svc.epoch_frames = True
        c = self.client()
        self.assertEqual(c.rank, 0)
        prot = c.protect(REGIONS)
        prot.stage(0, state(1))
        self.assertEqual(prot.status()["committed"], 0)
        self.assertEqual(c.epoch, 7)

    def test_stage_then_restore(self) -> None:
        c = self.client()
        prot = c.protect(REGIONS)
        self.assertEqual((prot.committed, prot.g, prot.replicas), (-1, -1, 0))
        self.assertEqual(prot.regions, ("optimizer", "params", "meta"))
        self.assertEqual(prot.restore(), (-1, None))
        for step in range(3):
            self.assertEqual(prot.stage(step, state(step)), 0)
            self.assertEqual(prot.committed, step)
        self.assertEqual(self.svc.slot_step, [2, 1])  # ping-pong
        # Parts are concatenated.
        s3 = state(3)
        s3["optimizer"] = [s3["optimizer"][:1000],
                           bytearray(s3["optimizer"][1000:])]
        prot.stage(3, s3)
        self.assertEqual(prot.restore(), (3, state(3)))
        self.assertEqual(bytes(prot.view("params", 1)), state(3)["params"])
        self.assertEqual(bytes(prot.view("params", 0)), state(2)["params"])
        self.assertEqual(len(prot.view("meta", 0)), 256)
        c.close()
        # A restarted rank gets the state back.
        with self.client() as c2:
            p2 = c2.protect(REGIONS)
            self.assertEqual(p2.committed, 3)
            self.assertEqual(p2.restore(), (3, state(3)))

    def test_begin_commit_restore_slot(self) -> None:
        c = self.client()
        prot = c.protect(REGIONS)
        self.assertEqual(prot.restore_slot(), (-1, -1))
        for step in range(3):
            slot = prot.begin(step)
            self.assertEqual(slot, self.svc.staged[1])
            self.assertEqual(self.svc.slot_step[slot], None)  # staging
            for name, data in state(step).items():
                v = prot.view(name, slot)
                v[:] = data
                v.release()
            prot.commit(step)
            self.assertEqual(prot.committed, step)
            self.assertEqual(self.svc.slot_step[slot], step)
            self.assertEqual(prot.last_wait_ns, 0)
        self.assertEqual(self.svc.requests()[-6:], [18, 20] * 3)
        # The fake checksums the slot at Commit: the bytes were there.
        step, slot = prot.restore_slot()
        self.assertEqual((step, slot), (2, self.svc.newest()[1]))
        self.assertEqual({n: bytes(prot.view(n, slot)) for n in REGIONS},
                         state(2))
        self.assertEqual(prot.restore(), (2, state(2)))
        # A commit of a step not staged: the service's err (as
        # internal/keeper/service.go answers it), the connection kept.
        with self.assertRaisesRegex(ServiceError, "not the step staged"):
            prot.commit(9)
        self.assertEqual(prot.restore_slot(), (2, self.svc.newest()[1]))
        c.close()
        with self.client() as c2:
            p2 = c2.protect(REGIONS)
            step, slot = p2.restore_slot()
            self.assertEqual(step, 2)
            self.assertEqual(bytes(p2.view("optimizer", slot)),
                             state(2)["optimizer"])
            # Stage after a restore must increase: the service's err.
            with self.assertRaises(ServiceError):
                p2.begin(2)
            self.assertEqual(p2.begin(3), 1 - slot)
            for bad in (-1, 2**53, 1.0):
                with self.assertRaises((ValueError, TypeError)):
                    p2.begin(bad)  # type: ignore[arg-type]

    def test_begin_waits_for_stage_async(self) -> None:
        prot = self.client().protect(REGIONS)
        prot.stage_async(0, state(0))
        slot = prot.begin(1)  # step 0 committed first, in its slot
        self.assertEqual(self.svc.slot_step[1 - slot], 0)
        prot.commit(1)
        self.assertEqual(prot.restore(), (1, {n: bytes(len(d)) for n, d
                                              in state(0).items()}))

    def test_view_is_writable(self) -> None:
        prot = self.client().protect(REGIONS)
        v = prot.view("meta", 0)
        v[:3] = b"abc"
        v.release()
        self.assertEqual(prot.view("meta", 0).tobytes()[:3], b"abc")
        with self.assertRaises(ValueError):
            prot.view("meta", 2)
        with self.assertRaises(KeyError):
            prot.view("nope", 0)

    def test_stage_async(self) -> None:
        prot = self.client().protect(REGIONS)
        self.assertEqual(prot.wait(), 0)
        prot.stage_async(0, state(0))
        prot.stage_async(1, state(1))  # waits for step 0 first
        self.assertEqual(prot.wait(), 0)
        self.assertEqual(self.svc.slot_step, [0, 1])
        self.assertEqual(prot.restore(), (1, state(1)))
        prot.stage_async(1, state(1))  # not increasing: error in wait()
        with self.assertRaises(ServiceError):
            prot.wait()
        prot.stage_async(2, state(2))
        prot.close()  # waits for it
        self.assertEqual(self.svc.slot_step, [2, 1])

    def test_wrong_size_refused_before_sending(self) -> None:
        prot = self.client().protect(REGIONS)
        before = len(self.svc.log)
        bad = state(0)
        bad["meta"] = b"x" * 255
        with self.assertRaises(ValueError):
            prot.stage(0, bad)
        with self.assertRaises(ValueError):
            prot.stage_async(0, bad)
        with self.assertRaises(ValueError):
            prot.stage(0, {"params": state(0)["params"]})
        with self.assertRaises(ValueError):
            prot.stage(0, dict(state(0), extra=b""))
        for step in (-1, 2**53):
            with self.assertRaises(ValueError):
                prot.stage(step, state(0))
        self.assertEqual(len(self.svc.log), before)

    def test_error_frame(self) -> None:
        c = self.client()
        prot = c.protect(REGIONS)
        self.hook(26, lambda s: s.send(5, {"err": "no"}))
        with self.assertRaises(ProtocolError) as cm:
            prot.status()
        self.assertIn("no", str(cm.exception))
        self.assertIsInstance(cm.exception, GorunError)
        with self.assertRaises(ProtocolError):  # the connection is closed
            prot.status()

    def test_request_before_protect_hello(self) -> None:
        c = self.client()
        c._send(18, {"step": 0})
        with self.assertRaises(ProtocolError):
            c._await(19)

    def test_err_answer(self) -> None:
        prot = self.client().protect(REGIONS)
        prot.stage(5, state(5))
        with self.assertRaises(ServiceError):
            prot.stage(5, state(5))
        self.assertEqual(prot.restore(), (5, state(5)))  # still usable
        with self.client() as c2:
            with self.assertRaises(ServiceError):
                c2.protect({"params": 8})

    def test_frame_too_long(self) -> None:
        prot = self.client().protect(REGIONS)
        # The client refuses the length at once, without reading on.
        self.hook(26, lambda s: s.send_raw(struct.pack(">I", MAX_FRAME + 1)))
        with self.assertRaisesRegex(ProtocolError, "length"):
            prot.status()

    def test_bad_frames(self) -> None:
        bad = {
            "zero length": struct.pack(">I", 0),
            "short": struct.pack(">I", 100) + b"\x1b{}",
            "short header": b"\x00\x00",
            "no json": struct.pack(">I", 1) + b"\x1b",
            "garbled": struct.pack(">I", 5) + b"\x1b{\xff\xfe}",
            "not an object": frame(27, [1, 2]),
            "wrong type": frame(21, {"step": 1}),
            "bad field": frame(25, {"step": "x"}),
        }
        for name, data in bad.items():
            with self.subTest(name):
                prot = self.client().protect(REGIONS)
                mtype = 24 if name == "bad field" else 26

                def reply(s: Session, data: bytes = data) -> None:
                    s.send_raw(data)
                    s.shut()
                self.hook(mtype, reply)
                with self.assertRaises(ProtocolError):
                    if mtype == 24:
                        prot.restore()
                    else:
                        prot.status()

    def test_gradient(self) -> None:
        prot = self.client().protect(REGIONS, gradient=8)
        values = [1.0, -2.5, 0.1, 3e38]
        want = struct.pack("<4f", *values)
        self.assertEqual(prot.gradient(0, values), 12)
        self.assertEqual(prot.gradient(1, array("f", values)), 12)
        self.assertEqual(prot.gradient(2, memoryview(want)), 12)
        self.assertEqual(self.svc.gradients,
                         [(0, want), (1, want), (2, want)])
        with self.assertRaises(ValueError):
            prot.gradient(3, [0.0] * 9)
        no_grad = self.client()
        self.svc.regions = None
        with self.assertRaises(GorunError):
            no_grad.protect({"meta": 16}).gradient(0, [1.0])

    def test_zero_size_region(self) -> None:
        prot = self.client().protect({"meta": 16, "empty": 0})
        prot.stage(0, {"meta": b"m" * 16, "empty": b""})
        self.assertEqual(prot.restore(),
                         (0, {"meta": b"m" * 16, "empty": b""}))
        self.assertEqual(len(prot.view("empty", 0)), 0)

    def test_bad_declarations(self) -> None:
        c = self.client()
        for regions, grad in [({}, 0), ({"Bad": 1}, 0), ({"a": -1}, 0),
                              ({"a": 1 << 41}, 0), ({"a": 1}, -1),
                              ({f"r{i}": 1 for i in range(17)}, 0)]:
            with self.assertRaises(ValueError):
                c.protect(regions, grad)
        self.assertEqual(self.svc.log, [])


class PytrainTest(unittest.TestCase):
    """pytrain.py gives the same hash whether or not it crashes."""

    def run_pytrain(self, svc: FakeService, *args: str,
                    restarts: int = 0) -> subprocess.CompletedProcess:
        env = dict(os.environ, GORUN_SOCKET=svc.path, RANK="0",
                   GORUN_RESTART_COUNT=str(restarts))
        return subprocess.run(
            [sys.executable, PYTRAIN, "--steps", "20", "--seed", "7", *args],
            env=env, capture_output=True, text=True, timeout=120)

    @staticmethod
    def final_hash(out: str) -> str:
        lines = [ln for ln in out.splitlines() if ln.startswith("final hash")]
        assert len(lines) == 1, out
        return lines[0].split()[-1]

    def test_crash_and_restore(self) -> None:
        svc1, svc2 = FakeService(), FakeService()
        self.addCleanup(svc1.close)
        self.addCleanup(svc2.close)
        plain = subprocess.run(
            [sys.executable, PYTRAIN, "--steps", "20", "--seed", "7"],
            capture_output=True, text=True, timeout=120,
            env={k: v for k, v in os.environ.items() if k != "GORUN_SOCKET"})
        self.assertEqual(plain.returncode, 0, plain.stderr)
        first = self.run_pytrain(svc1, "--protect")
        self.assertEqual(first.returncode, 0, first.stderr)
        want = self.final_hash(first.stdout)
        self.assertEqual(self.final_hash(plain.stdout), want)

        crashed = self.run_pytrain(svc2, "--protect", "--crash-at", "10")
        self.assertEqual(crashed.returncode, -signal.SIGKILL, crashed.stderr)
        self.assertNotIn("final hash", crashed.stdout)
        again = self.run_pytrain(svc2, "--protect", "--crash-at", "10",
                                 restarts=1)
        self.assertEqual(again.returncode, 0, again.stderr)
        self.assertIn("restored step", again.stdout)
        self.assertEqual(self.final_hash(again.stdout), want)
        self.assertEqual(svc2.newest()[0], 19)


if __name__ == "__main__":
    unittest.main()
