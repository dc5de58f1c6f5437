"""Build the kvxfer-cpu-dram wheel with the standard library only (no setuptools,
no network), byte-identical run to run; pyproject.toml is the source of truth.

    python serving/cpu_dram_plugin/build_wheel.py OUTDIR   -> prints the wheel path
"""

import base64
import hashlib
import os
import re
import sys
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
EPOCH = (2020, 1, 1, 0, 0, 0)


def _project():
    """name, version, description, entry points, package from pyproject.toml
    (tomllib where there is one: Python >= 3.11; a tiny reader otherwise)."""
    path = os.path.join(HERE, "pyproject.toml")
    try:
        import tomllib

        with open(path, "rb") as f:
            d = tomllib.load(f)
        proj = d["project"]
        eps = proj.get("entry-points", {})
        pkgs = d["tool"]["setuptools"]["packages"]
        return proj["name"], proj["version"], proj.get("description", ""), eps, pkgs
    except ImportError:
        text = open(path).read()
        get = lambda k: re.search(rf'^{k}\s*=\s*"([^"]*)"', text, re.M).group(1)  # noqa: E731
        ep = re.search(r'^\[project\.entry-points\."([^"]+)"\]\s*\n(\w+)\s*=\s*"([^"]+)"', text, re.M)
        return get("name"), get("version"), get("description"), {ep.group(1): {ep.group(2): ep.group(3)}}, ["kvxfer_cpu_dram"]


def _digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build(outdir):
    name, version, desc, eps, pkgs = _project()
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = []
    for pkg in pkgs:
        root = os.path.join(HERE, pkg)
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for fn in sorted(filenames):
                if fn.endswith((".pyc", ".pyo")):
                    continue
                full = os.path.join(dirpath, fn)
                with open(full, "rb") as f:
                    files.append((os.path.relpath(full, HERE).replace(os.sep, "/"), f.read()))
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: {desc}\nRequires-Python: >=3.9\n"
    wheel = "Wheel-Version: 1.0\nGenerator: kvxfer-serving build_wheel.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    ep_txt = "".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in sorted(entries.items())) + "\n"
        for group, entries in sorted(eps.items())
    )
    files += [
        (f"{info}/METADATA", meta.encode()),
        (f"{info}/WHEEL", wheel.encode()),
        (f"{info}/entry_points.txt", ep_txt.encode()),
        (f"{info}/top_level.txt", ("\n".join(pkgs) + "\n").encode()),
    ]
    record = "".join(f"{p},{_digest(d)},{len(d)}\n" for p, d in files) + f"{info}/RECORD,,\n"
    files.append((f"{info}/RECORD", record.encode()))
    os.makedirs(outdir, exist_ok=True)
    out = os.path.join(outdir, f"{dist}-{version}-py3-none-any.whl")
    tmp = out + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files:
            zi = zipfile.ZipInfo(path, EPOCH)
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    os.replace(tmp, out)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(build(sys.argv[1]))
