"""Import stub for torch (kvxfer tests only; see tests/sglang/README.md).

SGLang's disaggregation modules import torch at module level, but the decode
transfer path used here (NixlKVManager/NixlKVReceiver over DRAM buffers given
as raw pointers) never creates a tensor. Only the names touched at import time
or on that path exist here; anything else raises AttributeError loudly.
"""

import types as _types

__version__ = "0.0.0+kvxfer-stub"
KVXFER_STUB = True


class dtype:  # noqa: N801 - mirrors torch.dtype
    def __init__(self, name, itemsize):
        self.name, self.itemsize = name, itemsize

    def __repr__(self):
        return "torch." + self.name


uint8 = dtype("uint8", 1)
int8 = dtype("int8", 1)
int32 = dtype("int32", 4)
int64 = dtype("int64", 8)
float16 = dtype("float16", 2)
bfloat16 = dtype("bfloat16", 2)
float32 = dtype("float32", 4)
float8_e4m3fn = dtype("float8_e4m3fn", 1)


class Tensor:  # only a type for isinstance checks and annotations
    pass


class device:  # noqa: N801
    def __init__(self, spec="cpu", index=None):
        self.type, self.index = str(spec), index


class _NoDevice:
    @staticmethod
    def is_available():
        return False

    @staticmethod
    def device_count():
        return 0

    @staticmethod
    def set_device(_):
        pass


cuda = _NoDevice()
npu = _NoDevice()
xpu = _NoDevice()


def get_device_module(_=None):
    return _NoDevice()


def is_tensor(x):
    return isinstance(x, Tensor)


from torch import distributed  # noqa: E402,F401
