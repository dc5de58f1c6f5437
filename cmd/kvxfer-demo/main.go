// Command kvxfer-demo is what `make demo` runs. It starts kvxferd (in auto
// mode), the prefill scheduler emulator (kvxfer-sched, emul/sched) and a mixed
// fleet of decode emulators (kvxfer-decode, emul/decode: -sglang 0.5.18,
// 0.5.22, 0.5.23; -fleet picks others) as separate processes, runs one
// workload (emul/workload) with chunked prefill and aborts at random phases
// from both sides, prints a summary per decode release and exits non-zero if
// any room was pinned, any byte was wrong, any page is still held, the two
// sides disagree on a room, or a process did not exit cleanly. Everything it
// runs besides kvxferd is built from emul/*: it has no workload, page model or
// decode logic of its own.
package main

import (
	"fmt"
	"os"
)

func main() {
	if err := processesMain(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "kvxfer-demo:", err)
		os.Exit(1)
	}
}
