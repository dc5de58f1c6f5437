// Package bench holds the benchmark suite that compares the actor engine with
// faithful ports of the dict-based design it replaces.
package bench
