package layering

import (
	"go/build"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/kvxfer/kvxfer"

// imports maps every package of the module to what its non-test files
// import, as the go tool would build them here.
func imports(t *testing.T) map[string][]string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "go.mod")); err != nil || !strings.HasPrefix(string(b), "module "+module+"\n") {
		t.Fatalf("%s is not the module root: %v", root, err)
	}
	graph := map[string][]string{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if name := d.Name(); path != root && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
			return filepath.SkipDir
		}
		pkg, err := build.Default.ImportDir(path, 0)
		if err != nil {
			if _, none := err.(*build.NoGoError); none {
				return nil
			}
			return err
		}
		rel, _ := filepath.Rel(root, path)
		ip := module
		if rel != "." {
			ip += "/" + filepath.ToSlash(rel)
		}
		graph[ip] = append([]string{}, pkg.Imports...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return graph
}

// path returns a chain of imports from pkg to a package bad accepts, or nil.
func path(graph map[string][]string, pkg string, bad func(string) bool) []string {
	seen := map[string]bool{}
	var walk func(p string) []string
	walk = func(p string) []string {
		if bad(p) {
			return []string{p}
		}
		if seen[p] {
			return nil
		}
		seen[p] = true
		for _, q := range graph[p] {
			if chain := walk(q); chain != nil {
				return append([]string{p}, chain...)
			}
		}
		return nil
	}
	return walk(pkg)
}

func under(dir string) func(string) bool {
	return func(p string) bool { return p == module+"/"+dir || strings.HasPrefix(p, module+"/"+dir+"/") }
}

func TestTransportDoesNotImportActors(t *testing.T) {
	graph := imports(t)
	var transports []string
	for p := range graph {
		if under("transport")(p) {
			transports = append(transports, p)
		}
	}
	slices.Sort(transports)
	if !slices.Contains(transports, module+"/transport/control") || !slices.Contains(transports, module+"/transport/wire") {
		t.Fatalf("transport packages not found: %v", transports)
	}
	for _, p := range transports {
		if chain := path(graph, p, under("actors")); chain != nil {
			t.Errorf("%s depends on actors: %s", p, strings.Join(chain, " -> "))
		}
	}
}

// kv is imported by every layer, the pure wire codecs included (their
// TestCodecsArePure allows it by name), so it must stay a pure leaf.
func TestVocabularyIsALeaf(t *testing.T) {
	graph := imports(t)
	deps, ok := graph[module+"/kv"]
	if !ok {
		t.Fatal("package kv not found")
	}
	for _, d := range deps {
		if d != "fmt" && d != "strconv" {
			t.Errorf("kv imports %q; the vocabulary imports only fmt and strconv", d)
		}
	}
}
