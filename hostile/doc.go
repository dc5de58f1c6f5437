// Package hostile replays the attacks F1–F10 (docs/hostile.md) against a real
// kvxferd process, each while an honest workload (kvxfer-sched and
// kvxfer-decode processes, a few hundred rooms with every byte verified) runs
// at the same time, and asserts what the fixed daemon must do:
//
//   - the process is alive, and both /health (bootstrap) and /healthz (debug)
//     answer;
//   - no file outside the backend's namespace changed (a canary file's hash,
//     size and mtime);
//   - RSS, threads and fds (from /proc/<pid>/status and /proc/<pid>/fd) stay
//     under the bounds stated in bounds_test.go;
//   - the honest rooms still succeed with verified bytes.
//
// Every loop is bounded in count and in time, and every target is loopback.
// Each test records its figures (bound and measured) in a table printed at the
// end of the run; with KVXFER_HOSTILE_DOC=path the table is also written into
// that markdown file between the markers <!-- hostile:begin --> and
// <!-- hostile:end --> (docs/hostile.md).
//
// The tests are skipped unless KVXFER_HOSTILE=1, so `go test ./...` stays fast.
// `make test-hostile` builds bin/ and runs them (CI runs it after `make test`);
// `make soak` runs the 5-minute soak (TestSoak; KVXFER_SOAK_DURATION shortens
// it). KVXFER_BIN points the tests at other binaries than ../bin.
package hostile
