#!/usr/bin/env bash
# Builds the bundle the GPU check (scripts/gpu-check.sh) runs from, here, on a
# machine with Go and a package registry: the GPU machine has neither.
#
#   .gpu/bundle.tar.xz  (about 25 MiB)
#     daemon.test, cuda.test   Go test binaries (stripped), GPU tests gated by KVXFER_GPU=1
#     lib/                     their shared libraries beyond glibc and libstdc++ (libzmq and its deps)
#     nixl-site/               NIXL's cp312 wheel for CUDA 13 (nixl-cu13), trimmed to the UCX plugin:
#                              libnixl_capi.so for kvxferd's nixl backend, nixl_cu13 for the Python baseline
#
# .gpu/ is ignored by git (.git/info/exclude); the device tool carries it
# (carry: [".gpu"]). KVXFER_GPU_NIXL=0 skips NIXL (the check then runs the
# loopback VRAM mode only). Python and NIXL versions: KVXFER_GPU_PY (3.12),
# KVXFER_GPU_NIXL_PKG (nixl-cu13==1.5.1).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin
if exclude=$(git rev-parse --git-path info/exclude 2>/dev/null); then
  grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"
fi
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p .gpu "$stage/lib"
go test -c -ldflags='-s -w' -o "$stage/daemon.test" ./daemon
go test -c -ldflags='-s -w' -o "$stage/cuda.test" ./nixl/cuda
# Shared libraries beyond the C library and libstdc++ (the GPU machine's own
# are newer; these are not there: libzmq, libsodium, libpgm, libnorm, krb5).
for b in "$stage"/*.test; do ldd "$b" | awk '/=> \//{print $3}'; done | sort -u |
  grep -vE '/(libc|libm|libpthread|libdl|librt|libresolv|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' |
  xargs -r cp -L -t "$stage/lib"
if [ "${KVXFER_GPU_NIXL:-1}" = 1 ]; then
  py=${KVXFER_GPU_PY:-3.12}
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$stage/whl" "${KVXFER_GPU_NIXL_PKG:-nixl-cu13==1.5.1}"
  site="$stage/nixl-site"
  mkdir -p "$site"
  (cd "$site" && python3 -m zipfile -e "$stage"/whl/*.whl .)
  # Keep NIXL's core, the UCX plugin and UCX; drop the other plugins, the
  # libraries only they need, and NIXL-EP.
  (cd "$site" && rm -rf nixl_ep_* ./*.scripts ./*.data &&
    find . -path '*/plugins/*' -o -path '*.libs/nixl/*' | grep -v 'libplugin_UCX\.so$' | xargs -r rm -f &&
    rm -f ./*.libs/libaws* ./*.libs/libazure* ./*.libs/libcurl* ./*.libs/libs2n* ./*.libs/libxml2* \
      ./*.libs/libgusli* ./*.libs/liburing* ./*.libs/libaio*)
  capi=$(find "$site" -name libnixl_capi.so | head -1)
  libs=$(dirname "$capi"):$(find "$site" -maxdepth 1 -name '*.libs' ! -name '.*' | head -1)
  missing=$(LD_LIBRARY_PATH=$libs ldd "$capi" "$(dirname "$capi")/plugins/libplugin_UCX.so" 2>&1 |
    grep 'not found' | grep -vE 'libcuda\.so|libnvidia-ml\.so|libcudart' || true)
  if [ -n "$missing" ]; then
    echo "trimmed NIXL misses libraries:"; echo "$missing"; exit 1
  fi
  rm -rf "$stage/whl"
fi
tar -C "$stage" -cf - . | xz -T0 -6 >.gpu/bundle.tar.xz
ls -la .gpu/bundle.tar.xz
