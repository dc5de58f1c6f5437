#!/usr/bin/env python3
"""Build the kvxfer wheel with the kvxferd binary for this platform inside
(kvxfer/bin/kvxferd), using only the standard library (no network, no
setuptools): a wheel is a zip with a dist-info. Usage:
    scripts/build-wheel.py BINARY OUTDIR [GLIBC]
The tag is py3-none-manylinux_X_Y_<arch>: py3-none because the wheel holds no
Python extension (any CPython 3 can install it), manylinux_X_Y (PEP 600)
because kvxferd needs only glibc >= X.Y and the manylinux core libraries
(scripts/check-wheel-libs.sh checks that). X.Y is GLIBC (the Makefile's
WHEEL_GLIBC), else the newest GLIBC_x.y symbol version the binary references.
"""
import base64, hashlib, os, platform, re, subprocess, sys, zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = os.path.join(ROOT, "python")


def glibc_needed(binary):
    """The newest GLIBC_x.y version among the binary's dynamic symbols."""
    out = subprocess.run(["objdump", "-T", binary], check=True, capture_output=True, text=True).stdout
    vers = {tuple(map(int, v.split("."))) for v in re.findall(r"\(GLIBC_(\d+\.\d+)(?:\.\d+)*\)", out)}
    return max(vers, default=(2, 17))


def main(binary, outdir, glibc=None):
    need = glibc_needed(binary)
    want = tuple(map(int, glibc.split("."))) if glibc else need
    if need > want:
        sys.exit(f"build-wheel: {binary} needs GLIBC_{need[0]}.{need[1]}, newer than manylinux_{want[0]}_{want[1]}")
    toml = open(os.path.join(PY, "pyproject.toml")).read()
    name = re.search(r'^name = "([^"]+)"', toml, re.M).group(1)
    version = re.search(r'^version = "([^"]+)"', toml, re.M).group(1)
    eps = re.search(r'\[project\.entry-points\."sglang\.srt\.plugins"\]\n((?:.+\n)+)', toml).group(1)
    tag = f"py3-none-manylinux_{want[0]}_{want[1]}_{platform.machine()}"
    di = f"{name}-{version}.dist-info"
    files = {}
    for f in sorted(os.listdir(os.path.join(PY, "kvxfer"))):
        if f.endswith(".py"):
            files[f"kvxfer/{f}"] = (open(os.path.join(PY, "kvxfer", f), "rb").read(), 0o644)
    files["kvxfer/bin/kvxferd"] = (open(binary, "rb").read(), 0o755)
    files[f"{di}/METADATA"] = (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                               f"Requires-Python: >=3.9\nRequires-Dist: pyzmq\n\n"
                               + open(os.path.join(PY, "README.md")).read()).encode(), 0o644
    files[f"{di}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: kvxfer build-wheel.py\nRoot-Is-Purelib: false\nTag: {tag}\n").encode(), 0o644
    files[f"{di}/entry_points.txt"] = ("[sglang.srt.plugins]\n" + eps.replace('"', "")).encode(), 0o644
    record = []
    os.makedirs(outdir, exist_ok=True)
    out = os.path.join(outdir, f"{name}-{version}-{tag}.whl")
    # A wheel of this version under another tag (the linux_<arch> ones before
    # manylinux) would make `pip install dist/kvxfer-*.whl` see two.
    for old in os.listdir(outdir):
        if old.startswith(f"{name}-{version}-") and old.endswith(".whl") and old != os.path.basename(out):
            os.remove(os.path.join(outdir, old))
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for path, (data, mode) in files.items():
            zi = zipfile.ZipInfo(path, date_time=(2026, 1, 1, 0, 0, 0))
            zi.external_attr = (0o100000 | mode) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
            h = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{path},sha256={h},{len(data)}")
        record.append(f"{di}/RECORD,,")
        z.writestr(f"{di}/RECORD", "\n".join(record) + "\n")
    print(out)


if __name__ == "__main__":
    main(*sys.argv[1:4])
