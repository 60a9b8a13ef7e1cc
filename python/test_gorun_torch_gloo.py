"""Tests at world size 1 (gloo) against fake_service's FakeService:
gorun_torch's Protector.rejoin, and examples/torch/train.py.

Run with: cd python && /usr/bin/python3 -m unittest -v test_gorun_torch_gloo
(torch must import: Debian's python3-torch does under /usr/bin/python3).
Without torch the tests are skipped, unless GORUN_TORCH_REQUIRE=1.
"""

from __future__ import annotations

import os
import subprocess
import sys
import unittest
from typing import Any, Callable, Optional

from fake_service import FakeService, frame
from torch_fixtures import (TORCH_ERROR, build, digest, draws, seed_all,
                            train_step)

if not TORCH_ERROR:
    import torch

    import gorun_rank
    import gorun_torch
    from gorun_torch import GorunError

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "..", "examples", "torch", "train.py")


@unittest.skipIf(TORCH_ERROR, TORCH_ERROR + " (GORUN_TORCH_REQUIRE=1 "
                 "makes this a failure)")
class RejoinTest(unittest.TestCase):
    """Protector.rejoin at world size 1 (gloo) on a FakeService that moves
    to a new epoch with another rendezvous port."""

    def setUp(self) -> None:
        import torch.distributed as dist
        self.dist = dist
        self.svc = FakeService()
        self.addCleanup(self.svc.close)
        torch.set_num_threads(1)
        old = os.environ.pop("GORUN_EPOCH", None)
        if old is not None:
            self.addCleanup(os.environ.__setitem__, "GORUN_EPOCH", old)
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
            world_size=1)
        self.addCleanup(lambda: dist.is_initialized()
                        and dist.destroy_process_group())

    def test_rejoin(self) -> None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        def before_loss(net: Any, prot: Any) -> None:
            self.assertIs(prot.model, net)
            self.assertEqual(prot.group_epoch, 3)
            # No new epoch: the failure was not gorun's.
            with self.assertRaises(gorun_torch.EpochTimeout):
                prot.rejoin(timeout=0.05)
            self.assertTrue(self.dist.is_initialized())
        # Step 3 trains, then gorun moves to epoch 4: its save is refused.
        net, opt, sched, prot, at2 = self._trained(before_loss)
        old_pg = self.dist.distributed_c10d._get_default_group()
        restores = []

        def wrap():
            # Made before the restore (DDP broadcasts rank 0's
            # parameters), on the new group.
            restores.append(self.svc.requests().count(24))
            return DDP(net)
        model, step, data = prot.rejoin(wrap, timeout=30, group_timeout=20)
        self.assertEqual(restores, [0])
        self.assertEqual(self.svc.requests().count(24), 1)
        self.assertIsInstance(model, DDP)
        self.assertIsNot(self.dist.distributed_c10d._get_default_group(),
                         old_pg)
        self.assertEqual(prot.group_epoch, 4)
        self._rejoined_at_2(net, opt, sched, prot, at2, model, step, data)

    def _rejoined_at_2(self, net, opt, sched, prot, at2, model, step,
                       data) -> None:
        """rejoin returned step 2's state bitwise (tensors, RNG draws) and
        its position, and training goes on in the new group."""
        self.assertEqual((step, data), (3, {"epoch": 0, "batch": 3}))
        got = digest(net, opt, sched)
        got["draws"] = draws()
        self.assertEqual(got, at2)
        seed_all(7)
        train_step(model, opt, sched, 3)
        prot.save(3, {"epoch": 0, "batch": 4})

    def _trained(self, before_loss: Optional[Callable[[Any, Any], None]]
                 = None):
        """A DDP model trained and saved at steps 0-2, step 3 trained and
        refused by epoch 4 (port given): (net, opt, sched, prot, at2).
        before_loss(net, prot), if given, runs after step 2's save."""
        from torch.nn.parallel import DistributedDataParallel as DDP
        net, opt, sched = build()
        seed_all(7)
        model = DDP(net)
        prot = gorun_torch.Protector(model, opt, sched,
                                     socket_path=self.svc.path, timeout=30)
        self.addCleanup(prot.close)
        for step in range(3):
            train_step(model, opt, sched, step)
            prot.save(step, {"epoch": 0, "batch": step + 1})
        at2 = digest(net, opt, sched)
        at2["draws"] = draws()
        if before_loss is not None:
            before_loss(net, prot)
        train_step(model, opt, sched, 3)
        self.svc.push_epoch(4, "127.0.0.1", free_port())
        with self.assertRaises(gorun_torch.EpochChanged):
            prot.save(3, {"epoch": 0, "batch": 4})
        return net, opt, sched, prot, at2

    def refuse_restore(self, answer: dict, push: int | None = None) -> None:
        """Answer the next Restore with answer, after an Epoch frame of
        epoch push (a second host lost during the rejoin) if given."""
        svc = self.svc

        def h(session: Any, t: int, req: dict) -> bool:
            if t != 24:
                return False
            svc.hooks.remove(h)
            if push is not None:  # svc.lock is held: push_epoch's part
                svc.epoch, svc.master = push, ("127.0.0.1", free_port())
                svc.placed_anew = True
                session.send_raw(frame(6, svc.epoch_frame()))
            session.send(25, answer)
            return True
        svc.hooks.append(h)

    def test_rejoin_retries_in_a_newer_epoch(self) -> None:
        from torch.nn.parallel import DistributedDataParallel as DDP
        net, opt, sched, prot, at2 = self._trained()
        # Epoch 5 begins while the survivor rejoins epoch 4: the restore
        # is refused with new_placement; rejoin goes on into epoch 5.
        self.refuse_restore({"err": "a new placement (epoch) began",
                             "new_placement": True}, push=5)
        wraps = []

        def wrap():
            wraps.append(prot._client.epoch)
            return DDP(net)
        model, step, data = prot.rejoin(wrap, timeout=30, group_timeout=20)
        self.assertEqual(wraps, [4, 5])  # epoch 4's try, epoch 5's
        self.assertEqual(self.svc.requests().count(24), 2)
        self.assertEqual(prot.group_epoch, 5)
        self.assertIsInstance(model, DDP)
        self._rejoined_at_2(net, opt, sched, prot, at2, model, step, data)

    def test_rejoin_failure_without_newer_epoch(self) -> None:
        net, opt, sched, prot, at2 = self._trained()
        # Refused, and no newer epoch comes within the timeout: the
        # refusal is raised, and the group epoch is still the old one.
        self.refuse_restore({"err": "checksum mismatch"})
        with self.assertRaisesRegex(gorun_rank.ServiceError,
                                    "checksum mismatch"):
            prot.rejoin(timeout=0.2, group_timeout=20)
        self.assertEqual(prot.group_epoch, 3)
        # A later rejoin tries epoch 4 again and succeeds.
        _, step, _ = prot.rejoin(timeout=0.2, group_timeout=20)
        self.assertEqual((step, prot.group_epoch), (3, 4))

    def test_rejoin_before_the_first_protected_step(self) -> None:
        """G = -1 (no step saved on every rank): a survivor cannot roll
        back to its initial state while the moved ranks start fresh."""
        from torch.nn.parallel import DistributedDataParallel as DDP
        net, opt, sched = build()
        seed_all(7)
        model = DDP(net)
        prot = gorun_torch.Protector(model, opt, sched,
                                     socket_path=self.svc.path, timeout=30)
        self.addCleanup(prot.close)
        train_step(model, opt, sched, 0)
        self.svc.push_epoch(4, "127.0.0.1", free_port())
        with self.assertRaises(gorun_torch.EpochChanged):
            prot.save(0, {"epoch": 0, "batch": 1})
        model = None
        with self.assertRaisesRegex(GorunError, "no step is protected yet "
                                    "on every rank.*--recovery restart"):
            prot.rejoin(lambda: DDP(net), timeout=30, group_timeout=20)
        self.assertEqual(self.svc.requests().count(24), 1)
        self.assertEqual(prot.group_epoch, 3)


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@unittest.skipIf(TORCH_ERROR, TORCH_ERROR + " (GORUN_TORCH_REQUIRE=1 "
                 "makes this a failure)")
class TrainPyTest(unittest.TestCase):
    """examples/torch/train.py at world size 1 (gloo) on a FakeService:
    the same checksum plain, protected, crashed and restored from the
    service, and reloaded from its torch.save files. (World sizes 2 and 4
    under gorun are cmd/gorun's end-to-end tests.)"""

    ARGS = ["--steps", "40", "--width", "32"]

    def train(self, *args: str, svc: Any = None,
              restarts: int = 0) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items()
               if k not in ("GORUN_SOCKET", "GORUN_RESTART_COUNT",
                            "TORCHELASTIC_RESTART_COUNT")}
        env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                   GORUN_RESTART_COUNT=str(restarts))
        if svc is not None:
            env["GORUN_SOCKET"] = svc.path
        return subprocess.run([sys.executable, TRAIN, *self.ARGS, *args],
                              env=env, capture_output=True, text=True,
                              timeout=300)

    def checksum(self, p: subprocess.CompletedProcess) -> str:
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = [ln for ln in p.stdout.splitlines()
                 if ln.startswith("final checksum ")]
        self.assertEqual(len(lines), 1, p.stdout)
        self.assertRegex(p.stdout, r"mean step time \d+\.\d{6}\n")
        return lines[0].split()[-1]

    def test_checksums(self) -> None:
        want = self.checksum(self.train())
        self.assertRegex(want, r"\A[0-9a-f]{64}\Z")
        # Another seed trains to other bits: the comparisons can fail.
        self.assertNotEqual(self.checksum(self.train("--seed", "2")), want)
        svc = FakeService()
        self.addCleanup(svc.close)
        self.assertEqual(self.checksum(self.train("--protect", svc=svc)),
                         want)
        # Crashed at 25, and at 13 with a new service.
        for crash in ("25", "13"):
            svc = FakeService()
            self.addCleanup(svc.close)
            died = self.train("--protect", "--crash-at", crash, svc=svc)
            self.assertEqual(died.returncode, -9, died.stderr)
            self.assertEqual(svc.newest()[0], int(crash) - 1)
            again = self.train("--protect", "--crash-at", crash, svc=svc,
                               restarts=1)
            self.assertIn(f"rank 0: resumed at step {crash} from gorun",
                          again.stdout)
            self.assertEqual(self.checksum(again), want)
        # torch.save every 10 steps, a crash at 25: steps 20-24 replayed.
        import tempfile
        d = tempfile.mkdtemp(prefix="gorun-torchsave-")
        self.addCleanup(lambda: __import__("shutil").rmtree(d))
        died = self.train("--save-every", "10", "--save-dir", d,
                          "--crash-at", "25")
        self.assertEqual(died.returncode, -9, died.stderr)
        self.assertEqual(sorted(os.listdir(d)), ["rank0.pt", "rank0.pt.prev"])
        again = self.train("--save-every", "10", "--save-dir", d,
                           "--crash-at", "25", restarts=1)
        self.assertIn(f"rank 0: resumed at step 20 from {d}", again.stdout)
        self.assertEqual(self.checksum(again), want)

    def test_epoch_boundary(self) -> None:
        """A crash in the second epoch: the sampler's epoch and position
        come back (world 1, batch 32: 128 batches an epoch)."""
        args = ["--steps", "140", "--width", "16", "--layers", "1"]
        self.ARGS = args
        want = self.checksum(self.train())
        svc = FakeService()
        self.addCleanup(svc.close)
        died = self.train("--protect", "--crash-at", "133", svc=svc)
        self.assertEqual(died.returncode, -9, died.stderr)
        again = self.train("--protect", "--crash-at", "133", svc=svc,
                           restarts=1)
        self.assertIn("rank 0: resumed at step 133 from gorun", again.stdout)
        self.assertEqual(self.checksum(again), want)
