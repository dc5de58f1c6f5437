package libnixl

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// EnvLibrary names the environment variable holding an explicit path to
// libnixl_capi.so (or to a directory containing it).
const EnvLibrary = "KVXFER_LIBNIXL"

// EnvPython names the Python interpreter used to locate an installed NIXL
// wheel when no path is given (default "python3").
const EnvPython = "KVXFER_NIXL_PYTHON"

// libName is what NIXL's meson build installs and the PyPI wheels bundle.
const libName = "libnixl_capi.so"

// Find returns the path of libnixl_capi.so, looking in order at: explicit (an
// option), $KVXFER_LIBNIXL, the installed Python NIXL package (asking the
// interpreter in $KVXFER_NIXL_PYTHON, then python3, where `nixl` or
// `nixl_cu12`/`nixl_cu13` lives), and NIXL's default install prefix. The
// wheels keep their shared libraries in site-packages/.<pkg>.mesonpy.libs,
// next to the package directory, with the plugins in its plugins/ folder
// (NIXL's default NIXL_PLUGIN_DIR is <dir of libnixl.so>/plugins).
func Find(explicit string) (string, error) {
	var tried []string
	try := func(p string) (string, bool) {
		if p == "" {
			return "", false
		}
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			p = filepath.Join(p, libName)
		}
		tried = append(tried, p)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, true
		}
		return "", false
	}
	for _, p := range []string{explicit, os.Getenv(EnvLibrary)} {
		if got, ok := try(p); ok {
			return got, nil
		}
	}
	for _, site := range pythonSiteDirs() {
		for _, pkg := range []string{"nixl_cu13", "nixl_cu12", "nixl_rocm", "nixl"} {
			if got, ok := try(filepath.Join(site, "."+pkg+".mesonpy.libs")); ok {
				return got, nil
			}
		}
	}
	for _, dir := range []string{"/opt/nvidia/nvda_nixl/lib/x86_64-linux-gnu", "/opt/nvidia/nvda_nixl/lib64", "/opt/nvidia/nvda_nixl/lib"} {
		if got, ok := try(dir); ok {
			return got, nil
		}
	}
	return "", fmt.Errorf("libnixl: %s not found (set %s, or pip install nixl-cu12 into the python named by %s); tried %s",
		libName, EnvLibrary, EnvPython, strings.Join(tried, ", "))
}

// pythonSiteDirs asks the interpreters where their NIXL package lives. It only
// resolves paths; importing `nixl` itself would load CUDA probing code, so the
// script uses importlib.util.find_spec.
func pythonSiteDirs() []string {
	const script = `import importlib.util as u, os, site, sys
seen = []
for m in ("nixl_cu13", "nixl_cu12", "nixl_rocm", "nixl"):
    s = u.find_spec(m)
    if s and s.origin:
        seen.append(os.path.dirname(os.path.dirname(s.origin)))
seen += site.getsitepackages() + [site.getusersitepackages()]
print("\n".join(seen))`
	var pys []string
	if p := os.Getenv(EnvPython); p != "" {
		pys = append(pys, p)
	}
	pys = append(pys, "python3")
	var dirs []string
	for _, py := range pys {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := exec.CommandContext(ctx, py, "-c", script).Output()
		cancel()
		if err != nil {
			continue
		}
		dirs = append(dirs, strings.Fields(string(out))...)
	}
	return dirs
}
