// Command kvxfer-demo is what `make demo` runs. By default it starts kvxferd,
// the prefill scheduler emulator (kvxfer-sched) and the decode emulator
// (kvxfer-decode) as separate processes, runs a workload with chunked prefill
// and aborts at random phases from both sides, prints a summary and exits
// non-zero if any room was pinned or any byte was wrong. With -inprocess it
// runs the engine, the transfer pool and two decode ranks in one process.
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
