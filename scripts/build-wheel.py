#!/usr/bin/env python3
"""Build the kvxfer wheel with the kvxferd binary for this platform inside
(kvxfer/bin/kvxferd), using only the standard library (no network, no
setuptools): a wheel is a zip with a dist-info. Usage:
    scripts/build-wheel.py BINARY OUTDIR
"""
import base64, hashlib, os, platform, re, sys, zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = os.path.join(ROOT, "python")


def main(binary, outdir):
    toml = open(os.path.join(PY, "pyproject.toml")).read()
    name = re.search(r'^name = "([^"]+)"', toml, re.M).group(1)
    version = re.search(r'^version = "([^"]+)"', toml, re.M).group(1)
    eps = re.search(r'\[project\.entry-points\."sglang\.srt\.plugins"\]\n((?:.+\n)+)', toml).group(1)
    tag = f"py3-none-linux_{platform.machine()}"
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
    main(sys.argv[1], sys.argv[2])
