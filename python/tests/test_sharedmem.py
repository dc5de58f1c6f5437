"""kvxfer.sharedmem and the allocation hooks against the installed SGLang and torch.

Run in a serving venv (make test-serving does):
    /opt/kvxfer-serving/0.5.23/bin/python -m unittest -v tests.test_sharedmem   (from python/)
"""

import fcntl
import mmap
import os
import socket
import subprocess
import sys
import tempfile
import types
import unittest

import torch

from kvxfer import process, sglang_alloc, sharedmem


class SharedAllocationTest(unittest.TestCase):
    def setUp(self):
        self.mode = sharedmem.make_mode(torch)("test")

    def test_host_factories_are_shared_sealed_and_zeroed(self):
        before = len(sharedmem.REGISTRY)
        with self.mode:
            a = torch.zeros((64, 16), dtype=torch.int32, device="cpu")
            b = torch.full((100, 50), 7, dtype=torch.float32)
            c = torch.empty(3, 1024, dtype=torch.bfloat16)
            d = torch.ones(8192, dtype=torch.uint8)
            small = torch.zeros(8, dtype=torch.int32)
            small_full = torch.full((4,), -1, dtype=torch.int32)
            kw_full = torch.full(size=(64, 64), fill_value=3, dtype=torch.float32)
        self.assertEqual(self.mode.count, 5)
        self.assertEqual(len(sharedmem.REGISTRY), before + 5)
        self.assertEqual(small_full.tolist(), [-1, -1, -1, -1])  # small: torch's own, fill kept
        self.assertEqual(float(kw_full[63, 63]), 3.0)
        self.assertEqual((a.shape, a.dtype, int(a.abs().sum())), (torch.Size([64, 16]), torch.int32, 0))
        self.assertEqual(float(b[5, 5]), 7.0)
        self.assertEqual(c.shape, torch.Size([3, 1024]))
        self.assertEqual(int(d.sum()), 8192)
        self.assertIsNone(sharedmem.REGISTRY.lookup(small.data_ptr(), 32))
        fd, off = sharedmem.REGISTRY.lookup(a.data_ptr() + 64, 128)
        self.assertEqual(off, 64)
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        self.assertEqual(seals & (fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW), fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
        with self.assertRaises(OSError):
            os.ftruncate(fd, 0)
        # Another mapping of the descriptor (what kvxferd does) sees SGLang's writes.
        a[3, 2] = 12345
        other = mmap.mmap(fd, os.fstat(fd).st_size, flags=mmap.MAP_SHARED)
        self.assertEqual(int.from_bytes(other[(3 * 16 + 2) * 4:(3 * 16 + 3) * 4], "little", signed=True), 12345)
        # A range running past its region is not resolved.
        self.assertIsNone(sharedmem.REGISTRY.lookup(a.data_ptr(), 64 * 16 * 4 + mmap.PAGESIZE))

    def test_outside_the_mode_and_off_host_nothing_changes(self):
        before = len(sharedmem.REGISTRY)
        t = torch.zeros((64, 64), dtype=torch.float32)
        with self.mode:
            m = torch.zeros((64, 64), dtype=torch.float32, device="meta")
            g = torch.zeros((64, 64), dtype=torch.float32, requires_grad=True)
        self.assertEqual(len(sharedmem.REGISTRY), before)
        self.assertIsNone(sharedmem.REGISTRY.lookup(t.data_ptr(), 4))
        self.assertEqual(m.device.type, "meta")
        self.assertTrue(g.requires_grad)


def server_args(mode="prefill", backend="nixl"):
    return types.SimpleNamespace(disaggregation_mode=mode, disaggregation_transfer_backend=backend, attn_cp_size=1)


class HooksTest(unittest.TestCase):
    def tearDown(self):
        sglang_alloc._server_args[0] = None
        os.environ.pop("KVXFER_DISABLE", None)

    def test_targets_cover_the_installed_release(self):
        names = [t for t, _ in sglang_alloc.targets()]
        for want in (sglang_alloc.SCHEDULER, sglang_alloc.METADATA,
                     sglang_alloc.POOLS + ".MHATokenToKVPool._create_buffers",
                     sglang_alloc.POOLS + ".MLATokenToKVPool._create_buffers",
                     sglang_alloc.POOLS + ".MambaPool.__init__"):
            self.assertIn(want, names)
        import pkgutil
        for t in names:  # every target resolves in this release
            obj, attr = t.rsplit(".", 1)
            self.assertTrue(hasattr(pkgutil.resolve_name(obj), attr), t)

    def metadata(self):
        from sglang.srt.disaggregation.utils import MetadataBuffers

        hook = dict(sglang_alloc.targets())[sglang_alloc.METADATA]
        mb = MetadataBuffers.__new__(MetadataBuffers)
        hook(MetadataBuffers.__init__, mb, 64, hidden_size=128, hidden_states_dtype=torch.bfloat16,
             max_sampling_mask_tokens=0)
        return mb

    def test_metadata_buffers_of_a_kvxfer_prefill_are_shared(self):
        sglang_alloc._server_args[0] = server_args()
        mb = self.metadata()
        ptrs, lens, _ = mb.get_buf_infos()
        self.assertGreater(len(ptrs), 5)
        for p, n in zip(ptrs, lens):
            self.assertIsNotNone(sharedmem.REGISTRY.lookup(p, n), (p, n))

    def test_other_servers_allocate_as_before(self):
        for sa, env in ((server_args(mode="decode"), None), (server_args(backend="mooncake"), None),
                        (server_args(), "1"), (None, None)):
            sglang_alloc._server_args[0] = sa
            if env:
                os.environ["KVXFER_DISABLE"] = env
            mb = self.metadata()
            ptrs, lens, _ = mb.get_buf_infos()
            self.assertTrue(all(sharedmem.REGISTRY.lookup(p, n) is None for p, n in zip(ptrs, lens)), sa)
            os.environ.pop("KVXFER_DISABLE", None)


class SweepTest(unittest.TestCase):
    def test_stale_sockets_and_state_dirs_of_dead_schedulers_go(self):
        base = tempfile.mkdtemp()
        uid = os.getuid()
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        live = os.getpid()

        def sock(name):
            s = socket.socket(socket.AF_UNIX)
            s.bind(os.path.join(base, name))
            s.close()

        sock(f"kvxfer-{uid}-{dead.pid}-tp0-pp0-dp0.sock")
        sock(f"kvxfer-{uid}-{live}-tp0-pp0-dp0.sock")
        os.mkdir(os.path.join(base, f"kvxfer-{uid}-state-{dead.pid}-tp0-pp0-dp0-abc"))
        os.mkdir(os.path.join(base, f"kvxfer-{uid}-state-{live}-tp0-pp0-dp0-abc"))
        with open(os.path.join(base, f"kvxfer-{uid}-{dead.pid}-x.sock"), "w"):
            pass  # a regular file of that name is not ours to remove
        os.mkdir(os.path.join(base, f"kvxfer-{uid + 1}-state-{dead.pid}-tp0"))
        removed = sorted(os.path.basename(p) for p in process.sweep_stale(base))
        self.assertEqual(removed, sorted([f"kvxfer-{uid}-{dead.pid}-tp0-pp0-dp0.sock",
                                          f"kvxfer-{uid}-state-{dead.pid}-tp0-pp0-dp0-abc"]))
        left = sorted(os.listdir(base))
        self.assertEqual(len(left), 4, left)


if __name__ == "__main__":
    unittest.main()
