package sgltest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// TestSGLangPlugin runs tests/sglang/plugin_check.py in each release's venv:
// kvxfer's plug-in loaded by SGLang's own loader, the prefill side driven in
// prefill.py's order against SGLang's real decode receiver over NIXL, the
// kvxferd kill and parent-exit cases. Skips without the venvs unless
// KVXFER_REQUIRE_SGLANG=1.
func TestSGLangPlugin(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..")
	bin := filepath.Join(t.TempDir(), "kvxferd")
	venvs := map[string]Venv{}
	for _, v := range Versions() {
		venvs[v] = needVenv(t, v)
	}
	needNIXL(t)
	build := exec.Command("go", "build", "-o", bin, "./cmd/kvxferd")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build kvxferd: %v\n%s", err, out)
	}
	for _, v := range Versions() {
		venv := venvs[v]
		t.Run(v, func(t *testing.T) {
			for _, scenario := range []string{"all", "exit"} {
				ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
				cmd := exec.CommandContext(ctx, venv.Python, filepath.Join(root, "tests", "sglang", "plugin_check.py"),
					"--kvxferd", bin, "--scenario", scenario)
				cmd.Env = append(os.Environ(), "SGLANG_HOST_IP=127.0.0.1")
				var stdout, stderr bytes.Buffer
				cmd.Stdout, cmd.Stderr = &stdout, &stderr
				err := cmd.Run()
				cancel()
				sc := bufio.NewScanner(&stdout)
				for sc.Scan() {
					var r map[string]any
					if json.Unmarshal(sc.Bytes(), &r) != nil || r["scenario"] == nil {
						continue
					}
					t.Logf("%v | %v | %v | %s", r["release"], r["scenario"], r["result"], sc.Text())
					if r["result"] != "PASS" {
						t.Errorf("%v: %v", r["scenario"], sc.Text())
					}
				}
				if err != nil {
					t.Errorf("plugin_check.py --scenario %s: %v\nstderr tail:\n%s", scenario, err, lastLines(stderr.String(), 40))
				}
			}
		})
	}
}
