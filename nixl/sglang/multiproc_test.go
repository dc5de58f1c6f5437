package sglang_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/nixl/sglang"
)

// childEnv switches the test binary into the decode-side child of TestMultiProcess.
const childEnv = "KVXFER_NIXL_DECODE_CHILD"

var mpShape = shape{Layers: 2, Slots: 80, Item: 4096, AuxSlots: 8}

// hello is the child's first line: its metadata blob and registered geometry,
// what a decode rank's registration frame carries.
type hello struct {
	Blob []byte
	Geo  sglang.Local
}

// mpRoom is one room the parent will send: pages per chunk and aux slots.
type mpRoom struct {
	Room           uint64
	Src, Dst       [][]int32
	SrcAux, DstAux int
}

// TestMultiProcess re-executes the test binary as a decode rank in a second OS
// process. The parent (prefill) maps the child's shared memory through the
// loopback backend, writes KV pages and aux, and the child waits for decode's
// completion rule on the notifications, then verifies every byte.
func TestMultiProcess(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("running as the child")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestMultiProcessDecodeChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	lines.Buffer(make([]byte, 1<<20), 1<<20)
	var out strings.Builder
	next := func(prefix string) string {
		for lines.Scan() {
			l := lines.Text()
			out.WriteString(l + "\n")
			if rest, ok := strings.CutPrefix(l, prefix); ok {
				return rest
			}
		}
		cmd.Wait()
		t.Fatalf("child ended before %q:\n%s%s", prefix, out.String(), stderr.String())
		return ""
	}
	var h hello
	if err := json.Unmarshal([]byte(next("HELLO ")), &h); err != nil {
		t.Fatal(err)
	}

	pre := newNode(t, "prefill", mpShape, 0)
	fillKV(pre, mpShape.Item)
	name, err := pre.ag.LoadPeer(h.Blob)
	if err != nil {
		t.Fatal(err)
	}
	peer, err := sglang.NewPeer(&pre.geo, h.Geo.AsPeer(name))
	if err != nil {
		t.Fatal(err)
	}
	local, err := sglang.PrepLocalKV(pre.ag, &pre.geo)
	if err != nil {
		t.Fatal(err)
	}
	plist, err := sglang.PrepPeerKV(pre.ag, &pre.geo, peer)
	if err != nil {
		t.Fatal(err)
	}
	rooms := []mpRoom{
		{Room: 11, Src: [][]int32{{0, 1, 2, 3}}, Dst: [][]int32{{70, 71, 72, 73}}, SrcAux: 1, DstAux: 7},
		{Room: 12, Src: [][]int32{{5}, {9, 10}, {40}}, Dst: [][]int32{{0}, {2, 1}, {79}}, SrcAux: 2, DstAux: 0},
		{Room: 13, Src: [][]int32{{63, 62, 61}, {7}}, Dst: [][]int32{{10, 11, 12}, {30}}, SrcAux: 3, DstAux: 3},
	}
	plan, _ := json.Marshal(rooms)
	fmt.Fprintf(stdin, "PLAN %s\n", plan)
	pool := &xferPool{t: t, ag: pre.ag, local: local}
	var p sglang.Plan
	for _, r := range rooms {
		writeAux(pre, r.SrcAux, r.Room)
		for ci := range r.Src {
			c := sglang.Chunk{Room: r.Room, ChunkID: ci, IsLast: ci == len(r.Src)-1, SrcPages: r.Src[ci], DstPages: r.Dst[ci], SrcAux: r.SrcAux, DstAux: r.DstAux}
			if err := pre.geo.Plan(&p, peer, &c); err != nil {
				t.Fatal(err)
			}
			pool.submit(&p, peer, plist)
			pool.drain()
		}
	}
	if got := next("RESULT "); got != "OK" {
		t.Fatalf("child: %s\n%s%s", got, out.String(), stderr.String())
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child exit: %v\n%s%s", err, out.String(), stderr.String())
	}
}

// TestMultiProcessDecodeChild is the decode side; it only runs in the child.
func TestMultiProcessDecodeChild(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("helper for TestMultiProcess")
	}
	dec := newNode(t, "decode", mpShape, 0)
	blob, err := dec.ag.LocalMetadata()
	if err != nil {
		t.Fatal(err)
	}
	hb, _ := json.Marshal(hello{Blob: blob, Geo: dec.geo})
	fmt.Printf("HELLO %s\n", hb)
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	var rooms []mpRoom
	for in.Scan() {
		if rest, ok := strings.CutPrefix(in.Text(), "PLAN "); ok {
			if err := json.Unmarshal([]byte(rest), &rooms); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	ck := sglang.NewChecker()
	var ids []uint64
	for _, r := range rooms {
		ck.Expect(r.Room, 1, false)
		ids = append(ids, r.Room)
	}
	waitDone(t, dec.ag, ck, ids)
	for _, r := range rooms {
		for ci := range r.Src {
			for i := range r.Src[ci] {
				checkKVPage(t, dec, int(r.Dst[ci][i]), int(r.Src[ci][i]), mpShape.Item)
			}
		}
		if err := sglang.CheckAuxRoom(dec.aux[len(dec.aux)-1], sglang.AuxRoomItemLen, r.DstAux, r.Room); err != nil {
			t.Fatal(err)
		}
	}
	fmt.Println("RESULT OK")
}
