// Command kvxfer-demo is what `make demo` runs. By default it starts kvxferd
// (in auto mode), the prefill scheduler emulator (kvxfer-sched) and a mixed
// fleet of decode emulators (kvxfer-decode -sglang 0.5.18, 0.5.22, 0.5.23;
// -fleet picks others) as separate processes, runs a workload with chunked
// prefill and aborts at random phases from both sides, prints a summary per
// decode release and exits non-zero if any room was pinned, any byte was
// wrong, any page is still held, the two sides disagree on a room, or a
// process did not exit cleanly. With -inprocess it runs the engine, the
// transfer pool and two decode ranks in one process.
package main

import (
	"fmt"
	"os"
	"slices"
)

func main() {
	args := os.Args[1:]
	var err error
	if i := slices.Index(args, "-inprocess"); i >= 0 {
		err = inProcessMain(slices.Delete(slices.Clone(args), i, i+1))
	} else {
		err = processesMain(args)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvxfer-demo:", err)
		os.Exit(1)
	}
}
