"""kvxfer.vram: CUDA IPC export of VRAM buffers for register_memory.

CPU-only parts run everywhere (fakes of torch's storage sharing and of the
driver stand in for the GPU; they test the offsets, the message and the
refusals, not CUDA). With KVXFER_CONTROL and KVXFER_IPC_HANDLE set (by
daemon/vram_test.go's TestPythonVRAMRegistration) the entries go to a live
kvxferd over the control API. GPU tests need KVXFER_GPU=1, torch and a GPU
(scripts/gpu-check.sh); they skip with the reason otherwise.
"""

import os
import subprocess
import sys
import unittest

import importlib.util  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
VRAM_PY = os.path.join(os.path.dirname(__file__), "..", "kvxfer", "vram.py")


def _load(path):
    # kvxfer.vram needs only the standard library; loaded by path so that it
    # imports where the package's control client (pyzmq) does not (the GPU box).
    spec = importlib.util.spec_from_file_location("kvxfer_vram", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


vram = _load(VRAM_PY)


class FakeStorage:
    def __init__(self, base, handle, block_off, dev=0):
        self.base, self.handle, self.block_off, self.dev = base, handle, block_off, dev

    def data_ptr(self):
        return self.base

    def _share_cuda_(self):
        # (device, handle, storage size, offset in the block, ref counter
        # handle, ref counter offset, event handle, event sync required)
        return (self.dev, self.handle, 1 << 20, self.block_off, b"ref", 0, b"ev", False)


class FakeTensor:
    is_cuda = True

    def __init__(self, storage, ptr, numel, elem=2):
        self.storage, self.ptr, self.n, self.elem = storage, ptr, numel, elem

    def untyped_storage(self):
        return self.storage

    def data_ptr(self):
        return self.ptr

    def numel(self):
        return self.n

    def element_size(self):
        return self.elem


class FakeDriver:
    def __init__(self, dev=1, base=0x7F0000000000, size=1 << 20):
        self.dev, self.base, self.size = dev, base, size

    def device_of(self, ptr):
        return self.dev if self.base <= ptr < self.base + self.size else None

    def export(self, ptr, dev):
        return b"H" * 64, ptr - self.base, self.size


class RegionTest(unittest.TestCase):
    def test_entry_carries_handle_offset_length_device(self):
        r = vram.region(b"\x01" * 64, 4096, 8192, 512, 3)
        self.assertEqual(r, {"cuda_ipc": b"\x01" * 64, "offset": 4096, "length": 8192,
                             "item_len": 512, "mem": "VRAM", "dev": 3})

    def test_refuses_other_handle_sizes_and_partial_items(self):
        with self.assertRaisesRegex(vram.UnsupportedMemory, "expandable segments"):
            vram.region(b"\x01" * 65, 0, 512, 512, 0)
        with self.assertRaisesRegex(vram.UnsupportedMemory, "whole number"):
            vram.region(b"\x01" * 64, 0, 500, 512, 0)


class ExportTensorTest(unittest.TestCase):
    def test_offset_is_block_offset_plus_view_offset_and_tensor_is_kept(self):
        st = FakeStorage(base=0x1000_0000, handle=b"T" * 64, block_off=2 << 20, dev=1)
        view = FakeTensor(st, ptr=0x1000_0000 + 4096, numel=1024)  # a view 4 KiB into its storage
        ex = vram.Exporter(drv=FakeDriver())
        r = ex.export_tensor(view, item_len=256)
        self.assertEqual((r["cuda_ipc"], r["offset"], r["length"], r["dev"]), (b"T" * 64, (2 << 20) + 4096, 2048, 1))
        self.assertIn(view, ex._keep)
        ex.close()
        self.assertEqual(ex._keep, [])

    def test_refuses_host_tensor(self):
        t = FakeTensor(FakeStorage(0, b"", 0), 0, 1)
        t.is_cuda = False
        with self.assertRaisesRegex(vram.UnsupportedMemory, "not a CUDA tensor"):
            vram.Exporter(drv=FakeDriver()).export_tensor(t, 2)


class ExportPointerTest(unittest.TestCase):
    def test_pointer_entry(self):
        d = FakeDriver(dev=2)
        r = vram.Exporter(drv=d).export_pointer(d.base + 8192, 4096, 1024, expect_dev=2)
        self.assertEqual((r["offset"], r["length"], r["dev"], r["mem"]), (8192, 4096, 2, "VRAM"))

    def test_refusals(self):
        d = FakeDriver(dev=2)
        ex = vram.Exporter(drv=d)
        with self.assertRaisesRegex(vram.UnsupportedMemory, "not CUDA device memory"):
            ex.export_pointer(0x10, 64, 64)
        with self.assertRaisesRegex(vram.UnsupportedMemory, "on GPU 2, expected GPU 0"):
            ex.export_pointer(d.base, 64, 64, expect_dev=0)
        with self.assertRaisesRegex(vram.UnsupportedMemory, "runs past its allocation"):
            ex.export_pointer(d.base + d.size - 64, 128, 64)

    def test_no_driver_is_a_clear_refusal(self):
        with self.assertRaisesRegex(vram.UnsupportedMemory, "no GPU access"):
            vram.Driver("/nonexistent/libcuda.so.1")
        if os.environ.get("KVXFER_GPU") != "1":
            self.assertFalse(vram.is_device_pointer(0x1000))


def _have_zmq():
    try:
        import zmq  # noqa: F401
        import msgpack  # noqa: F401
        return True
    except ImportError:
        return False


@unittest.skipUnless(_have_zmq(), "the kvxfer package needs pyzmq and msgpack")
class VRAMBufferTest(unittest.TestCase):
    def test_manager_buffer_from_tensor_and_pointer(self):
        from kvxfer import VRAMBuffer
        st = FakeStorage(base=0x2000_0000, handle=b"V" * 64, block_off=512, dev=1)
        ex = vram.Exporter(drv=FakeDriver(dev=1, base=0x3000_0000))
        b = VRAMBuffer.from_tensor(FakeTensor(st, ptr=0x2000_0000 + 1024, numel=2048), 1024, exporter=ex)
        self.assertEqual(b.wire(), {"cuda_ipc": b"V" * 64, "offset": 1536, "length": 4096, "item_len": 1024,
                                    "mem": "VRAM", "dev": 1})
        p = VRAMBuffer.from_pointer(0x3000_0000 + 4096, 8192, 1024, exporter=ex)
        self.assertEqual((p.offset, p.length, p.dev, p.wire()["mem"]), (4096, 8192, 1, "VRAM"))


@unittest.skipUnless(os.environ.get("KVXFER_CONTROL") and os.environ.get("KVXFER_IPC_HANDLE"),
                     "needs a kvxferd with CUDA IPC (run by daemon/vram_test.go TestPythonVRAMRegistration)")
class RegisterMemoryTest(unittest.TestCase):
    def test_register_memory_sends_what_kvxferd_imports(self):
        from kvxfer.control import ControlClient, ControlError
        c = ControlClient(os.environ["KVXFER_CONTROL"])
        try:
            h = bytes.fromhex(os.environ["KVXFER_IPC_HANDLE"])
            with self.assertRaisesRegex(ControlError, "stale or foreign"):
                c.register_memory("kv", [vram.region(b"\x07" * 64, 0, 4096, 512, 0)])
            with self.assertRaisesRegex(ControlError, "wrong device"):
                c.register_memory("kv", [vram.region(h, 0, 4096, 512, 1)])
            from kvxfer import VRAMBuffer
            bufs = [VRAMBuffer(h, i * 4096, 4096, 512, 0).wire() for i in range(4)]  # KvxferManager's entries
            c.register_memory("kv", bufs)
        finally:
            c.close()


def _have_gpu_torch():
    if os.environ.get("KVXFER_GPU") != "1":
        return "needs an NVIDIA GPU: KVXFER_GPU=1 (scripts/gpu-check.sh)"
    try:
        import torch
    except ImportError:
        return "needs torch"
    return None if torch.cuda.is_available() else "torch sees no GPU"


CHILD = r"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("kvxfer_vram", sys.argv[1])
vram = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vram)
h, off, n, dev = bytes.fromhex(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
d = vram.driver()
base = d.open(h, dev)
sys.stdout.write(d.read(base + off, n, dev).hex())
d.close(base, dev)
"""


@unittest.skipIf(_have_gpu_torch(), _have_gpu_torch() or "")
class GPUExportTest(unittest.TestCase):
    def test_both_paths_export_the_same_bytes_to_another_process(self):
        import torch
        pool = torch.arange(1 << 20, dtype=torch.int32, device="cuda").view(torch.uint8)
        layer = pool[1 << 20:(1 << 20) + 65536]  # a view, as one layer buffer of a pool
        ex = vram.Exporter()
        a = ex.export_tensor(layer, item_len=4096)
        b = ex.export_pointer(layer.data_ptr(), 65536, 4096, expect_dev=torch.cuda.current_device())
        self.assertEqual((a["cuda_ipc"], a["offset"], a["dev"]), (b["cuda_ipc"], b["offset"], b["dev"]))
        torch.cuda.synchronize()
        out = subprocess.run([sys.executable, "-c", CHILD, VRAM_PY,
                              b["cuda_ipc"].hex(), str(b["offset"]), "65536", str(b["dev"])],
                             capture_output=True, text=True, check=True).stdout
        self.assertEqual(bytes.fromhex(out), layer.cpu().numpy().tobytes())


if __name__ == "__main__":
    unittest.main()
