# Runs SGLang's own staging_buffer.py (its pure parts: compute_staging_layout,
# compute_head_slice_params, StagingAllocator's ring without its GPU buffer) with
# torch/triton stubbed, for staging_sglang_test.go and emul/decode's ring test.
# stdin: {"layouts": [...], "heads": [...], "rings": [{"size", "ops"}]}; stdout: JSON.
import importlib.util, json, sys, types

class Any:
    def __init__(self, *a, **k): pass
    def __call__(self, *a, **k):
        if len(a) == 1 and callable(a[0]) and not k:
            return a[0]
        return Any()
    def __getattr__(self, n): return Any()

def stub(name):
    m = types.ModuleType(name)
    m.__getattr__ = lambda n: Any()
    m.__path__ = []  # a package, so submodule stubs import
    sys.modules[name] = m
    return m

for n in ["torch", "triton", "triton.language", "sglang", "sglang.srt", "sglang.srt.environ",
          "sglang.srt.utils", "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.memory",
          "sglang.kernels.ops.memory.ptr_table"]:
    stub(n)
sys.modules["triton"].language = sys.modules["triton.language"]
sys.modules["sglang.srt.environ"].envs = Any()

path = sys.argv[1]
spec = importlib.util.spec_from_file_location("staging_buffer", path)
sb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sb)
req = json.load(sys.stdin)
out = {"layouts": [], "heads": [], "ring": []}
for c in req["layouts"]:
    n, w, t = sb.compute_staging_layout(*c)
    out["layouts"].append([n, list(w), t])
for c in req["heads"]:
    out["heads"].append(list(sb.compute_head_slice_params(*c)))
# StagingAllocator without its GPU buffer: the ring logic only.
for ops in req["rings"]:
    a = object.__new__(sb.StagingAllocator)
    a.total_size, a.head, a.round = ops["size"], 0, 0
    a.allocations, a.alloc_order, a.next_alloc_id = {}, [], 0
    a.watermark_round, a.watermark_tail = 0, 0
    import threading
    a.lock = threading.Lock()
    trace = []
    for op in ops["ops"]:
        if op[0] == "a":
            r = a.assign(op[1])
            trace.append(None if r is None else list(r))
        else:
            a.free(op[1])
            trace.append(list(a.get_watermark()))
    out["ring"].append(trace)
print(json.dumps(out))
