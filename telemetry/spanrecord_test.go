package telemetry

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestProductionCodeDoesNotImportTracetest: the OTel SDK's tracetest package is test
// support; the direct export path builds spanRecord values instead of SpanStub snapshots.
func TestProductionCodeDoesNotImportTracetest(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil || len(files) == 0 {
		t.Fatal(files, err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, im := range af.Imports {
			if p, _ := strconv.Unquote(im.Path.Value); strings.HasSuffix(p, "/tracetest") {
				t.Errorf("%s imports %s", f, p)
			}
		}
	}
}
