package telemetry

import (
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/actors/room"
)

// Every kvxfer_* metric that the dashboard, the alert rules and
// docs/observability.md name is one kvxferd serves, and the docs list every
// metric it serves.
func TestDeployAndDocsNameServedMetrics(t *testing.T) {
	tel, err := Setup(t.Context(), Options{Getenv: func(k string) string {
		return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}[k]
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(t.Context())
	tel.Observer.Attach(fakeSource{})
	tel.Observer.Ignored(1, room.Init{}) // absorbed-message series exist once counted
	srv := httptest.NewServer(tel.Metrics)
	defer srv.Close()
	served := map[string]bool{}
	for series := range Scrape(t, srv.URL) {
		name := series
		if i := strings.IndexByte(name, '{'); i >= 0 {
			name = name[:i]
		}
		if strings.HasPrefix(name, "kvxfer_") {
			served[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")] = true
		}
	}
	metricName := regexp.MustCompile(`kvxfer_[a-z_]+`)
	files := []string{"../docs/observability.md", "../deploy/prometheus/alerts.yml", "../deploy/grafana/kvxfer-dashboard.json"}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		named := map[string]bool{}
		for _, m := range metricName.FindAllString(string(b), -1) {
			m = strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_sum"), "_count")
			if strings.HasSuffix(m, "_") { // a prefix in prose, e.g. kvxfer_pool_*
				continue
			}
			named[m] = true
			if !served[m] {
				t.Errorf("%s names %s, which kvxferd does not serve", filepath.Base(f), m)
			}
		}
		if strings.HasSuffix(f, ".md") {
			var missing []string
			for m := range served {
				if !named[m] {
					missing = append(missing, m)
				}
			}
			sort.Strings(missing)
			if len(missing) > 0 {
				t.Errorf("docs/observability.md does not list %v", missing)
			}
		}
	}
}
