"""Tests of gorun_torch against fake_service's FakeService.

Run with: cd python && /usr/bin/python3 -m unittest -v test_gorun_torch
(torch must import: Debian's python3-torch does under /usr/bin/python3).
Without torch the tests are skipped, unless GORUN_TORCH_REQUIRE=1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import unittest
from typing import Any

from fake_service import FakeService
from torch_fixtures import (TORCH_ERROR, build, digest, draws, run, seed_all,
                            train_step)

if not TORCH_ERROR:
    import torch
    from torch import nn

    import gorun_torch
    from gorun_torch import GorunError, LayoutError, MetaTooLarge

HERE = os.path.dirname(os.path.abspath(__file__))


@unittest.skipIf(TORCH_ERROR, TORCH_ERROR + " (GORUN_TORCH_REQUIRE=1 "
                 "makes this a failure)")
class GorunTorchTest(unittest.TestCase):
    def setUp(self) -> None:
        self.svc = FakeService()
        self.addCleanup(self.svc.close)
        torch.set_num_threads(1)

    def test_layout_and_regions(self) -> None:
        model, opt, sched = build()
        before = digest(model, opt, sched)
        rng = torch.get_rng_state()
        prot = gorun_torch.Protector(model, opt, sched,
                                     socket_path=self.svc.path,
                                     replicate_params=False,
                                     rank_unique_optimizer=False)
        self.addCleanup(prot.close)
        # Every parameter of the model in the optimizer: exp_avg and
        # exp_avg_sq as large as the parameters, and one step scalar each.
        n_params = sum(p.numel() for p in model.parameters())
        n_model = n_params
        n_tensors = 4 * len(list(model.parameters()))
        sizes = {r["name"]: r["size"] for r in self.svc.regions}
        # The buffers (BatchNorm's running statistics, which differ per
        # rank under DDP) in the replicated buffers region, not in params
        # (which a replacement copies from a data-parallel peer).
        self.assertEqual(list(sizes), ["buffers", "params", "meta"])
        nbuf = sum(b.numel() * b.element_size() for b in model.buffers())
        self.assertGreaterEqual(sizes["buffers"], nbuf)
        self.assertLessEqual(sizes["buffers"],
                             nbuf + 64 * len(list(model.buffers())))
        self.assertEqual(sizes["meta"], 64 << 10)
        low = 4 * (n_model + 2 * n_params + len(list(model.parameters())))
        self.assertGreaterEqual(sizes["params"], low)
        self.assertLessEqual(sizes["params"], low + 64 * n_tensors)
        # The probe stepped a copy: the real optimizer has no state, no
        # tensor and no RNG changed.
        self.assertEqual(len(opt.state), 0)
        self.assertEqual(digest(model, opt, sched), before)
        self.assertTrue(torch.equal(torch.get_rng_state(), rng))

        svc2 = FakeService()
        self.addCleanup(svc2.close)
        model, opt, sched = build()
        p2 = gorun_torch.Protector(model, opt, sched, socket_path=svc2.path,
                                   rank_unique_optimizer=True,
                                   replicate_params=False,
                                   meta_size=4096)
        self.addCleanup(p2.close)
        sizes2 = {r["name"]: r["size"] for r in svc2.regions}
        self.assertEqual(list(sizes2),
                         ["optimizer", "buffers", "params", "meta"])
        self.assertEqual(sizes2["meta"], 4096)
        self.assertEqual(sizes2["buffers"], sizes["buffers"])
        self.assertGreaterEqual(sizes2["params"], 4 * n_model)
        self.assertEqual(sizes2["params"] + sizes2["optimizer"],
                         sizes["params"])

    def test_replicate_params_default(self) -> None:
        """Parameters that may differ per rank (the model is not a DDP)
        go in replicated regions by default; under DDP in params."""
        model, opt, sched = build()
        with gorun_torch.Protector(model, opt, sched,
                                   socket_path=self.svc.path):
            pass
        sizes = {r["name"]: r["size"] for r in self.svc.regions}
        self.assertEqual(list(sizes),
                         ["optimizer", "model", "buffers", "meta"])
        n_params = sum(p.numel() for p in model.parameters())
        self.assertGreaterEqual(sizes["model"], 4 * n_params)
        self.assertLessEqual(sizes["model"], 4 * n_params + 64 * len(
            list(model.parameters())))
        import tempfile
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        fd, store = tempfile.mkstemp(prefix="gorun-torchtest-")
        os.close(fd)
        os.unlink(store)
        dist.init_process_group("gloo", init_method=f"file://{store}",
                                rank=0, world_size=1)
        try:
            svc = FakeService()
            self.addCleanup(svc.close)
            ddp = DDP(build()[0])
            opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
            with gorun_torch.Protector(ddp, opt, socket_path=svc.path):
                pass
            self.assertEqual([r["name"] for r in svc.regions],
                             ["buffers", "params", "meta"])
        finally:
            dist.destroy_process_group()
            if os.path.exists(store):
                os.unlink(store)

    def test_params_digest(self) -> None:
        """A params region that is not the one this rank saved (a peer's,
        which differs) is refused before anything is restored."""
        model, opt, sched = build()
        with gorun_torch.Protector(model, opt, sched, replicate_params=False,
                                   rank_unique_optimizer=False,
                                   socket_path=self.svc.path) as prot:
            for step in range(2):
                train_step(model, opt, sched, step)
                prot.save(step)
            # The same bytes: restored.
        m2, o2, s2 = build(seed=3)
        with gorun_torch.Protector(m2, o2, s2, replicate_params=False,
                                   rank_unique_optimizer=False,
                                   socket_path=self.svc.path) as prot:
            self.assertEqual(prot.restore(), (2, None))
            self.assertEqual(digest(m2, o2, s2), digest(model, opt, sched))
            # A peer whose parameters differ in one byte: refused.
            _, slot = self.svc.newest()
            view = prot.protection.view("params", slot)
            view[5] ^= 1
            view.release()
            # (gorun checks the copy it got against the peer's sums.)
            self.svc.slot_crc[slot] = self.svc.checksums(slot)
            m3, o3, s3 = build(seed=4)
            before = digest(m3, o3, s3)
        with gorun_torch.Protector(m3, o3, s3, replicate_params=False,
                                   rank_unique_optimizer=False,
                                   socket_path=self.svc.path) as prot:
            with self.assertRaisesRegex(
                    LayoutError, "restored from a data-parallel peer are "
                    "not this rank's"):
                prot.restore()
        self.assertEqual(digest(m3, o3, s3), before)

    def test_save_restore_bitwise(self) -> None:
        want = run(None, 12)  # the uninterrupted, unprotected run
        at5 = run(self.svc.path, 12, crash_after=5)
        self.assertEqual(self.svc.newest()[0], 5)
        self.assertEqual([t for t in self.svc.requests() if t in (18, 20)],
                         [18, 20] * 6)
        # A fresh Protector over a model built from another seed, with
        # the global RNGs elsewhere: restored to step 5 exactly.
        model, opt, sched = build(seed=99)
        seed_all(12345)
        with gorun_torch.Protector(model, opt, sched,
                                   socket_path=self.svc.path) as prot:
            self.assertEqual(prot.restore(),
                             (6, {"epoch": 1, "batch": 1}))
            got = digest(model, opt, sched)
            got["draws"] = draws()
            self.assertEqual(got, {k: v for k, v in at5.items()
                                   if k not in ("start", "data")})
        self.assertEqual(opt.param_groups[1]["weight_decay"], 0.0)
        self.assertIsInstance(opt.param_groups[0]["betas"], tuple)
        # A fresh process continues to step 11: the uninterrupted run's
        # bits. (It restores step 5 again: nothing was saved since.)
        child = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "child",
             self.svc.path, "12"],
            capture_output=True, text=True, timeout=300, cwd=HERE)
        self.assertEqual(child.returncode, 0, child.stderr)
        resumed = json.loads(child.stdout)
        self.assertEqual(resumed["start"], 6)
        self.assertEqual(resumed["data"], {"epoch": 1, "batch": 1})
        for key in ("model", "optimizer", "param_groups", "scheduler",
                    "draws", "optimizer_keys"):
            self.assertEqual(resumed[key], want[key], key)
        self.assertEqual(self.svc.newest()[0], 11)

    def test_fresh_start_is_the_unprotected_run(self) -> None:
        want = run(None, 8)
        got = run(self.svc.path, 8)
        self.assertEqual(got["start"], 0)
        self.assertIsNone(got["data"])
        for key in ("model", "optimizer", "scheduler", "draws"):
            self.assertEqual(got[key], want[key], key)
        # ... and restore on a fresh start touched nothing.
        model, opt, sched = build()
        seed_all(3)
        svc = FakeService()
        self.addCleanup(svc.close)
        before = (digest(model, opt, sched), torch.get_rng_state())
        with gorun_torch.Protector(model, opt, sched,
                                   socket_path=svc.path) as prot:
            self.assertEqual(prot.restore(), (0, None))
        self.assertEqual(digest(model, opt, sched), before[0])
        self.assertTrue(torch.equal(torch.get_rng_state(), before[1]))
        self.assertEqual(len(opt.state), 0)

    def test_other_model_refused(self) -> None:
        run(self.svc.path, 3)
        # The same region sizes, other shapes: the fingerprint refuses.
        model, opt, sched = build(transpose=True)
        self.assertEqual(sum(p.numel() for p in model.parameters()),
                         sum(p.numel() for p in build()[0].parameters()))
        with gorun_torch.Protector(model, opt, sched,
                                   socket_path=self.svc.path) as prot:
            before = digest(model, opt, sched)
            with self.assertRaisesRegex(LayoutError, "another model"):
                prot.restore()
            self.assertEqual(digest(model, opt, sched), before)
        # The same tensors in other param_groups: refused.
        model, _, _ = build()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        with gorun_torch.Protector(model, opt,
                                   torch.optim.lr_scheduler.LambdaLR(
                                       opt, lambda s: 0.9 ** s),
                                   socket_path=self.svc.path) as prot:
            with self.assertRaisesRegex(LayoutError, "another model"):
                prot.restore()
        # Another world size: refused as well.
        os.environ["WORLD_SIZE"] = "3"
        try:
            model, opt, sched = build()
            with gorun_torch.Protector(model, opt, sched,
                                       socket_path=self.svc.path) as prot:
                with self.assertRaisesRegex(LayoutError, "world"):
                    prot.restore()
        finally:
            del os.environ["WORLD_SIZE"]
        # Other sizes: the service refuses the regions.
        model, opt, sched = build(width=24)
        with self.assertRaisesRegex(LayoutError, "refused the regions"):
            gorun_torch.Protector(model, opt, sched,
                                  socket_path=self.svc.path)

    def test_meta_overflow(self) -> None:
        model, opt, sched = build()
        with gorun_torch.Protector(model, opt, sched, meta_size=2048,
                                   socket_path=self.svc.path) as prot:
            train_step(model, opt, sched, 0)
            with self.assertRaisesRegex(MetaTooLarge, "meta_size"):
                prot.save(0)
            self.assertEqual(self.svc.stages, 0)  # refused before Stage
        with self.assertRaises(ValueError):
            gorun_torch.Protector(model, opt, sched, meta_size=8,
                                  socket_path=self.svc.path)

    def test_not_under_gorun(self) -> None:
        old = os.environ.pop("GORUN_SOCKET", None)
        try:
            model, opt, sched = build()
            with self.assertRaisesRegex(GorunError, "GORUN_SOCKET"):
                gorun_torch.Protector(model, opt, sched)
        finally:
            if old is not None:
                os.environ["GORUN_SOCKET"] = old

    def test_parameter_without_state(self) -> None:
        """A parameter that got no gradient has no optimizer state: none
        after the restore either; a custom probe finds the same layout.
        A trained parameter of the optimizer that is not the model's (a
        temperature) has its value restored with its state."""
        def make(seed: int) -> tuple:
            torch.manual_seed(seed)
            model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
            spare = nn.Parameter(torch.randn(3))  # never used
            temp = nn.Parameter(torch.randn(1))  # trained, not the model's
            opt = torch.optim.Adam(list(model.parameters()) + [spare, temp])
            return model, opt, spare, temp
        model, opt, spare, temp = make(1)
        x = torch.randn(8, 4)
        with gorun_torch.Protector(model, opt,
                                   socket_path=self.svc.path) as prot:
            for step in range(3):
                opt.zero_grad()
                (model(x).sum() * temp).sum().backward()
                opt.step()
                prot.save(step)
            self.assertNotIn(spare, opt.state)
        want = digest(model, opt, torch.optim.lr_scheduler.StepLR(opt, 1))
        m2, o2, s2, t2 = make(2)
        with gorun_torch.Protector(
                m2, o2, socket_path=self.svc.path,
                probe=lambda groups: torch.optim.Adam(groups)) as prot:
            self.assertEqual(prot.restore(), (3, None))
        self.assertNotIn(s2, o2.state)
        self.assertEqual(len(o2.state), 5)
        got = digest(m2, o2, torch.optim.lr_scheduler.StepLR(o2, 1))
        self.assertEqual(got, want)
        self.assertTrue(torch.equal(t2, temp), (t2, temp))
        self.assertTrue(torch.equal(s2, spare), (s2, spare))

    def test_cyclic_schedulers(self) -> None:
        """OneCycleLR and CyclicLR (a bound method, a WeakMethod in their
        state_dict): saved and restored; the restored one steps on as the
        uninterrupted one does."""
        makers = {
            "OneCycleLR": lambda o: torch.optim.lr_scheduler.OneCycleLR(
                o, max_lr=0.5, total_steps=20),
            "CyclicLR": lambda o: torch.optim.lr_scheduler.CyclicLR(
                o, 0.01, 0.1, step_size_up=3, mode="exp_range",
                gamma=0.9),
        }
        for name, make_sched in makers.items():
            with self.subTest(name):
                def make() -> tuple:
                    torch.manual_seed(0)
                    model = nn.Linear(4, 2)
                    opt = torch.optim.SGD(model.parameters(), lr=0.1,
                                          momentum=0.9)
                    return model, opt, make_sched(opt)

                def step(model, opt, sched) -> None:
                    opt.zero_grad()
                    model(torch.ones(2, 4)).sum().backward()
                    opt.step()
                    sched.step()
                svc = FakeService()
                self.addCleanup(svc.close)
                model, opt, sched = make()
                with gorun_torch.Protector(model, opt, sched,
                                           socket_path=svc.path) as prot:
                    for s in range(5):
                        step(model, opt, sched)
                        prot.save(s)
                m2, o2, s2 = make()
                with gorun_torch.Protector(m2, o2, s2,
                                           socket_path=svc.path) as prot:
                    self.assertEqual(prot.restore(), (5, None))
                for _ in range(4):
                    step(model, opt, sched)
                    step(m2, o2, s2)
                    self.assertEqual(s2.get_last_lr(), sched.get_last_lr())
                    self.assertEqual(o2.param_groups[0]["momentum"],
                                     opt.param_groups[0]["momentum"])
                self.assertTrue(torch.equal(m2.weight, model.weight))

    def test_generators(self) -> None:
        """A DataLoader(shuffle=True, generator=g): g's state is saved and
        restored (generators=[g]), so the resumed epochs' orders are the
        uninterrupted run's."""
        from torch.utils.data import DataLoader, TensorDataset
        data = TensorDataset(torch.arange(16))

        def make() -> tuple:
            model, opt, sched = build()
            g = torch.Generator().manual_seed(1)
            loader = DataLoader(data, batch_size=4, shuffle=True,
                                generator=g)
            return model, opt, sched, g, loader
        model, opt, sched, g, loader = make()
        with gorun_torch.Protector(model, opt, sched, generators=[g],
                                   socket_path=self.svc.path) as prot:
            for epoch in range(2):
                list(loader)
                prot.save(epoch)
        want = [[b[0].tolist() for b in loader] for _ in range(2)]
        m2, o2, s2, g2, l2 = make()
        g2.manual_seed(99)  # elsewhere: the restore must set it
        with gorun_torch.Protector(m2, o2, s2, generators=[g2],
                                   socket_path=self.svc.path) as prot:
            self.assertEqual(prot.restore(), (2, None))
        got = [[b[0].tolist() for b in l2] for _ in range(2)]
        self.assertEqual(got, want)
        # Another number of generators: another layout.
        m3, o3, s3, _, _ = make()
        with gorun_torch.Protector(m3, o3, s3, socket_path=self.svc.path
                                   ) as prot:
            with self.assertRaisesRegex(LayoutError, "another model"):
                prot.restore()

    def test_unprobeable_optimizer(self) -> None:
        """LBFGS (its step() needs a closure): a GorunError that says to
        pass probe=, not a bare TypeError."""
        model = nn.Linear(4, 2)
        opt = torch.optim.LBFGS(model.parameters())
        with self.assertRaisesRegex(GorunError, r"LBFGS.*probe="):
            gorun_torch.Protector(model, opt, socket_path=self.svc.path)

    def test_corrupt_meta(self) -> None:
        """A meta document that is not JSON, or lacks a key: LayoutError
        naming what is wrong, nothing restored."""
        run(self.svc.path, 2)
        _, slot = self.svc.newest()
        with open(self.svc.region_path("meta"), "rb") as f:
            f.seek(slot * self.svc.stride(64 << 10))
            (n,) = gorun_torch._LEN.unpack(f.read(8))
            saved = f.read(n)
        cases = {
            "not JSON": lambda body: b"{" + body[1:-1],
            "KeyError: 'rng'": lambda body: json.dumps(
                {k: v for k, v in json.loads(body).items() if k != "rng"}
            ).encode(),
            "not an object": lambda body: b"[1, 2]",
        }
        for want, corrupt in cases.items():
            with self.subTest(want):
                model, opt, sched = build(seed=8)
                before = digest(model, opt, sched)
                with gorun_torch.Protector(model, opt, sched,
                                           socket_path=self.svc.path
                                           ) as prot:
                    view = prot.protection.view("meta", slot)
                    body = corrupt(saved)
                    view[:8 + len(body)] = (gorun_torch._LEN.pack(len(body))
                                            + body)
                    view.release()
                    self.svc.slot_crc[slot] = self.svc.checksums(slot)
                    with self.assertRaisesRegex(LayoutError, want):
                        prot.restore()
                self.assertEqual(digest(model, opt, sched), before)

    def test_reassigned_buffer(self) -> None:
        """A module that reassigns a buffer (self.seen = self.seen + n):
        the tensor saved and restored is the one the model has then; a
        reassigned tensor of another shape is refused."""
        class Counting(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.fc = nn.Linear(4, 2)
                self.register_buffer("seen", torch.zeros(1))

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                self.seen = self.seen + x.shape[0]
                return self.fc(x)

        def make() -> tuple:
            torch.manual_seed(0)
            model = Counting()
            return model, torch.optim.SGD(model.parameters(), lr=0.1)
        model, opt = make()
        with gorun_torch.Protector(model, opt,
                                   socket_path=self.svc.path) as prot:
            for step in range(3):
                opt.zero_grad()
                model(torch.ones(8, 4)).sum().backward()
                opt.step()
                prot.save(step)
        self.assertEqual(model.seen.item(), 24)
        m2, o2 = make()
        with gorun_torch.Protector(m2, o2,
                                   socket_path=self.svc.path) as prot:
            self.assertEqual(prot.restore(), (3, None))
            self.assertEqual(m2.seen.item(), 24)
            self.assertTrue(torch.equal(m2.fc.weight, model.fc.weight))
            m2.seen = torch.zeros(2)
            with self.assertRaisesRegex(LayoutError, "seen"):
                prot.save(3)
            with self.assertRaisesRegex(LayoutError, "seen"):
                prot.restore()

    def test_probe_falls_back_from_meta(self) -> None:
        """The probe runs on the meta device; an optimizer that cannot is
        probed over zeros on the parameters' device: the same layout."""
        model, opt, sched = build()
        devices = []

        def probe(groups: list) -> Any:
            dev = groups[0]["params"][0].device.type
            devices.append(dev)
            if dev == "meta":
                raise NotImplementedError("no meta kernels here")
            return torch.optim.AdamW(groups, **opt.defaults)
        with gorun_torch.Protector(model, opt, sched, probe=probe,
                                   socket_path=self.svc.path):
            pass
        self.assertEqual(devices, ["meta", "cpu"])
        svc = FakeService()
        self.addCleanup(svc.close)
        with gorun_torch.Protector(*build(), probe=probe,
                                   socket_path=self.svc.path) as fallback:
            with gorun_torch.Protector(model, opt, sched,
                                       socket_path=svc.path) as prot:
                self.assertEqual(prot.fingerprint, fallback.fingerprint)
        self.assertEqual(devices, ["meta", "cpu"] * 2)
        self.assertEqual(svc.regions, self.svc.regions)

    def test_optimizer_state_changed_shape_refused(self) -> None:
        model, opt, sched = build()
        with gorun_torch.Protector(model, opt, sched,
                                   socket_path=self.svc.path) as prot:
            train_step(model, opt, sched, 0)
            p = opt.param_groups[0]["params"][0]
            opt.state[p]["exp_avg"] = torch.zeros(3)
            with self.assertRaisesRegex(LayoutError, "exp_avg"):
                prot.save(0)


def child(path: str, steps: int) -> None:
    """The restarted process of test_save_restore_bitwise."""
    torch.set_num_threads(1)
    out = run(path, steps, start_seed=4242, seed=5)
    print(json.dumps(out))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "child":
        child(sys.argv[2], int(sys.argv[3]))
    else:
        unittest.main()
