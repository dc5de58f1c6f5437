// Package gcfloor keeps Go's heap goal from falling below a floor.
//
// With GOGC=100 the collector starts a cycle once the heap has grown to twice
// what the last cycle found live. kvxferd's live heap is a few megabytes
// while it allocates hundreds of megabytes a second under load, so it
// collected every few milliseconds, and each cycle's concurrent mark took a
// quarter of the processors (on a 2-core host, a measurable dent in every
// room in flight: the time-to-terminal tail). A floor raises the heap goal
// to at least Floor bytes while the live heap is small, and leaves GOGC's
// proportional goal alone once the live heap is large: after every cycle,
// Tuner sets the GC percent to the larger of the base (GOGC) and the percent
// whose goal is the floor (Percent). The cost is memory: garbage may grow the
// heap to the floor before a cycle runs.
//
// GOGC=off (a negative base) turns the floor off: the operator chose.
package gcfloor
