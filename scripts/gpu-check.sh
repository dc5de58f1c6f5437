#!/usr/bin/env bash
# The GPU memory check (docs/vram.md), on an NVIDIA machine, from the
# repository root, after scripts/gpu-prep.sh built .gpu/bundle.tar.xz
# elsewhere (this machine needs no Go, no registry; python3 with torch).
#
#   1. the CUDA driver through dlopen, and an IPC import from another process
#      (nixl/cuda TestGPU*);
#   2. kvxfer.vram: a torch tensor exported through torch and through the
#      driver API, opened and read in a second process (python/tests/test_vram.py);
#   3. end to end, kvxferd's loopback VRAM mode: a scheduler process exports
#      its GPU KV, kvxferd imports and registers it, a decode process receives
#      every room on its own GPU buffers and checks every byte by
#      device-to-host copy; GPU->GPU throughput per room (daemon TestGPUEndToEnd);
#   4. the same over NIXL (UCX, kvxferd -nixl-backend nixl), and NIXL's own
#      Python doing the same transfer (scripts/gpu/nixl_write.py).
#
# Results: $OUT (the device tool's) or .gpu/out: gpu-check.log, summary.txt.
# Every step has its own time limit (at most about 10 minutes in all, the
# device tool's limit for one command; a normal run takes a few minutes).
# Exit status 0 only when every step passed. Size: KVXFER_GPU_LAYERS (16),
# KVXFER_GPU_ITEM (65536), KVXFER_GPU_PAGES (64), KVXFER_GPU_ROOMS (16).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-.gpu/out}
mkdir -p "$out"
exec > >(tee -a "$out/gpu-check.log") 2>&1
sum=$out/summary.txt
: >"$sum"
w=$(mktemp -d /tmp/kvxfer-gpu.XXXXXX)
tar -xJf .gpu/bundle.tar.xz -C "$w" || { echo "no .gpu/bundle.tar.xz: run scripts/gpu-prep.sh first and carry .gpu"; exit 2; }
export LD_LIBRARY_PATH=$w/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export KVXFER_GPU=1 KVXFER_GPU_OUT=$(realpath "$sum") PYTHONUNBUFFERED=1
status=0
# step DIR CMD...: runs CMD in DIR; a failure is recorded and the check goes on.
step() {
  local dir=$1
  shift
  echo "== $(date +%T) ($dir) $*"
  if ! (cd "$dir" && "$@"); then
    echo "FAILED: $*" | tee -a "$sum"
    status=1
  fi
}
nvidia-smi -L; uname -r
python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())'
step nixl/cuda "$w/cuda.test" -test.v -test.run 'GPU' -test.timeout 60s
step python timeout 90 python3 -m unittest -v tests.test_vram.GPUExportTest
step daemon env KVXFER_GPU_BACKEND=loopback "$w/daemon.test" -test.v -test.run '^TestGPUEndToEnd$' -test.timeout 150s
if [ -d "$w/nixl-site" ]; then
  export PYTHONPATH=$w/nixl-site${PYTHONPATH:+:$PYTHONPATH}
  export KVXFER_LIBNIXL=$(find "$w/nixl-site" -name libnixl_capi.so | head -1)
  # UCX's CUDA transports (libuct_cuda) need the CUDA runtime the wheel was
  # built for (libcudart.so.13): the toolkit's, or the nvidia-* pip packages'.
  cudart=$(python3 -c 'import glob, site; print(":".join(sorted({p.rsplit("/", 1)[0] for s in site.getsitepackages() for p in glob.glob(s + "/nvidia/**/libcudart.so*", recursive=True)})))' 2>/dev/null)
  export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/usr/local/cuda/lib64${cudart:+:$cudart}
  echo "CUDA runtime for UCX: $(ls /usr/local/cuda/lib64/libcudart.so* 2>/dev/null | head -1) ${cudart}"
  step daemon env KVXFER_GPU_BACKEND=nixl "$w/daemon.test" -test.v -test.run '^TestGPUEndToEnd$' -test.timeout 150s
  step . timeout 150 python3 scripts/gpu/nixl_write.py --out "$(realpath "$sum")"
else
  echo "NIXL not in the bundle (KVXFER_GPU_NIXL=0): the nixl backend and the NIXL Python baseline were not run" | tee -a "$sum"
fi
# Side by side: kvxferd over NIXL vs NIXL's Python, median GB/s per room.
gbs() { grep "$1" "$sum" | sed -nE 's/.*= ([0-9.]+) GB\/s.*/\1/p' | head -1; }
k=$(gbs 'kvxferd nixl backend'); p=$(gbs 'Python (UCX'); l=$(gbs 'kvxferd loopback backend')
if [ -n "$k" ] && [ -n "$p" ]; then
  echo "ratio kvxferd(nixl)/NIXL Python: $(awk -v a="$k" -v b="$p" 'BEGIN{printf "%.2f", a/b}') ($k vs $p GB/s, median per room); loopback VRAM mode: ${l:-n/a} GB/s" | tee -a "$sum"
fi
echo "conditions: $(uptime | sed 's/.*load/load/'); $(nproc) CPUs; $(nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader 2>/dev/null)" | tee -a "$sum"
echo "== summary"
cat "$sum"
rm -rf "$w"
exit $status
