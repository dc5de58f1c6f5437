package wire

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// pureImports is everything the codecs may import: pure standard-library packages, so
// no socket, file, process, clock or log can reach a decoder, and kv, the shared
// vocabulary, which is pure itself (internal/layering keeps it importing only fmt and
// strconv). A new import has to be added here, on purpose.
var pureImports = map[string]bool{
	"bytes": true, "encoding/binary": true, "errors": true, "fmt": true, "math": true,
	"math/bits": true, "slices": true, "strconv": true, "strings": true, "unicode": true,
	"unicode/utf8": true, "unsafe": true,
	"github.com/kvxfer/kvxfer/kv": true,
}

// TestCodecsArePure keeps package wire free of I/O: its non-test files import only
// pureImports (no net, net/http, os, time, log, zmq4 or kvxfer packages but kv).
func TestCodecsArePure(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, src, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, im := range af.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			if !pureImports[p] {
				t.Errorf("%s imports %q: package wire must stay pure (no I/O)", f, p)
			}
		}
		checked++
	}
	if checked < 10 {
		t.Fatalf("checked only %d files; run from the package directory", checked)
	}
}
