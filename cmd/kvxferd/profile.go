package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
)

// profiles are the -cpuprofile, -blockprofile, -mutexprofile and -heapprofile
// files: written over the process's life and closed at shutdown, so that a
// run with no debug server (the demo) can still be profiled as a whole.
type profiles struct {
	cpu, block, mutex, heap string
	cpuFile                 *os.File
}

// start begins the CPU profile and turns on block and mutex sampling.
func (p *profiles) start() error {
	if p.block != "" {
		runtime.SetBlockProfileRate(10_000) // one sample per 10 µs blocked
	}
	if p.mutex != "" {
		runtime.SetMutexProfileFraction(10)
	}
	if p.cpu == "" {
		return nil
	}
	f, err := os.Create(p.cpu)
	if err != nil {
		return fmt.Errorf("-cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return fmt.Errorf("-cpuprofile: %w", err)
	}
	p.cpuFile = f
	return nil
}

// stop writes every profile that was asked for; errors go to warn.
func (p *profiles) stop(warn func(msg string, args ...any)) {
	if p.cpuFile != nil {
		pprof.StopCPUProfile()
		if err := p.cpuFile.Close(); err != nil {
			warn("cpu profile", "err", err)
		}
	}
	for _, w := range []struct{ name, path string }{{"block", p.block}, {"mutex", p.mutex}, {"heap", p.heap}} {
		if w.path == "" {
			continue
		}
		f, err := os.Create(w.path)
		if err == nil {
			err = pprof.Lookup(w.name).WriteTo(f, 0)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			warn(w.name+" profile", "err", err)
		}
	}
}
