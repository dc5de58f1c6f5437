package xfer

import (
	"strconv"
	"testing"
)

func TestGoneAgentsAreBoundedOldestFirst(t *testing.T) {
	var g goneAgents
	for i := range maxGoneAgents + 10 {
		g.add("a" + strconv.Itoa(i))
	}
	if len(g.set) != maxGoneAgents || len(g.order) != maxGoneAgents {
		t.Fatalf("%d names, %d in order; want %d", len(g.set), len(g.order), maxGoneAgents)
	}
	if g.has("a0") || g.has("a9") || !g.has("a10") || !g.has("a"+strconv.Itoa(maxGoneAgents+9)) {
		t.Fatal("the oldest names were not the ones forgotten")
	}
	g.add("a10") // already there: no second entry
	g.forget("a11")
	if g.has("a11") || len(g.order) != maxGoneAgents-1 || len(g.set) != maxGoneAgents-1 {
		t.Fatalf("forget: has %v, %d in order, %d names", g.has("a11"), len(g.order), len(g.set))
	}
}
