package telemetry

import (
	"net/http/httptest"
	"os"
	"runtime"
	"testing"
)

// The process gauges are served and follow what the process holds: files
// opened and goroutines started show up in the next scrape.
func TestProcessMetrics(t *testing.T) {
	tel, err := Setup(t.Context(), Options{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(t.Context())
	srv := httptest.NewServer(tel.Metrics)
	defer srv.Close()
	names := []string{"kvxfer_process_goroutines", "kvxfer_process_threads", "kvxfer_process_open_fds",
		"kvxfer_process_max_fds", "kvxfer_process_resident_memory_bytes"}
	before := Scrape(t, srv.URL)
	for _, n := range names {
		if runtime.GOOS != "linux" && n != "kvxfer_process_goroutines" {
			continue
		}
		if before[n] <= 0 {
			t.Fatalf("%s = %v (served: %v)", n, before[n], before[n] != 0)
		}
	}
	if before["kvxfer_process_resident_memory_bytes"] < 1<<20 && runtime.GOOS == "linux" {
		t.Fatalf("RSS %v bytes", before["kvxfer_process_resident_memory_bytes"])
	}
	stop := make(chan struct{})
	// 200 parked goroutines; a few of the server's own may end between the
	// scrapes, so the check leaves them room.
	for range 200 {
		go func() { <-stop }()
	}
	defer close(stop)
	var files []*os.File
	for range 100 {
		f, err := os.Open(os.DevNull)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	after := Scrape(t, srv.URL)
	if d := after["kvxfer_process_goroutines"] - before["kvxfer_process_goroutines"]; d < 180 {
		t.Fatalf("goroutines +%v after starting 200", d)
	}
	if runtime.GOOS == "linux" {
		if d := after["kvxfer_process_open_fds"] - before["kvxfer_process_open_fds"]; d < 100 {
			t.Fatalf("open fds +%v after opening 100", d)
		}
	}
}

func TestStatusField(t *testing.T) {
	b := []byte("Name:\tx\nVmRSS:\t  2048 kB\nThreads:\t7\n")
	if v := statusField(b, "VmRSS:", 1024); v != 2048*1024 {
		t.Fatal(v)
	}
	if v := statusField(b, "Threads:", 1); v != 7 {
		t.Fatal(v)
	}
	if v := statusField(b, "Missing:", 1); v != -1 {
		t.Fatal(v)
	}
}
