package bench

import (
	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/bench/dict"
	"github.com/kvxfer/kvxfer/kv"
)

// The abort races: (a) an ABORT before the sender, (b) an abort inside a
// chunk's transfer window, and the windows a dict design keeps at baseline.

// (a) P2 then P1.
func abortBeforeSender() Scenario {
	return Scenario{
		Name:  "abort-before-sender",
		Spec:  "§6.3 P2, P1",
		Doc:   "decode's ABORT arrives before the scheduler created the sender; no transfer info ever comes",
		Kinds: Kinds(),
		Run: func(t *Target) (Outcome, error) {
			o := Outcome{Room: raceRoom}
			t.Engine.DecodeAbort(raceRoom, decodeEP)
			t.SettleBootstrap(raceRoom)
			t.Engine.Open(raceRoom)
			o.view(t, "after-open")
			finish(t, &o, raceRoom)
			return o, nil
		},
		Check: func(o Outcome) error {
			var x expect
			if o.Kind == Upstream {
				// Dropped (no tombstone), and nothing else ever moves the
				// sender: no bootstrap timeout. It holds its entries forever.
				x.that(o.Pinned && o.Final.Status == kv.StatusBootstrapping, "upstream should pin the room in Bootstrapping")
				x.that(o.Leaks.RequestStatus == 1 && o.Leaks.Senders == 1, "upstream should hold the status and the sender")
				x.that(len(o.Notices) == 0, "upstream never tells decode")
				return x.err()
			}
			x.that(!o.Pinned && o.Final.Status == kv.StatusFailed && o.Final.Reason == kv.ReasonDecodeAbort,
				"the sender opened after the ABORT should poll Failed/decode_abort")
			x.that(o.Leaked == 0, "nothing should be left after the clear")
			x.that(notices(o, room.AbortAck) == 1, "decode should get one ABORT_ACK")
			return x.err()
		},
	}
}

// windowRun drives the shared part of (b): a two-chunk room whose chunk 0 is
// in flight when the abort comes, then the scheduler's last chunk, then chunk
// 0's completion.
func windowRun(t *Target, abort func()) (Outcome, error) {
	o := Outcome{Room: raceRoom}
	readyRoom(t, 2)
	t.Gate.Hold(chunkOf(raceRoom, 0))
	t.Engine.Send(raceRoom, []int32{1}, nil)
	if err := t.Gate.WaitHeld(raceRoom, 1); err != nil {
		return o, err
	}
	abort()
	t.SettleBootstrap(raceRoom)
	tick := t.Gate.Tick()
	o.view(t, "after-abort")
	// A chunked prefill does not poll between chunks: the last one comes.
	t.Engine.Send(raceRoom, []int32{2}, nil)
	t.SettleBootstrap(raceRoom)
	o.NoticesInWindow = len(t.Notices.Of(raceRoom))
	t.Gate.Release(raceRoom, kv.ReasonNone)
	t.SettleWorkers(raceRoom)
	o.view(t, "after-chunk-0-landed")
	o.LateWrites = t.Gate.LandedAfter(raceRoom, tick)
	o.PostsAfterAbort = t.Gate.PostedAfter(raceRoom, tick)
	finish(t, &o, raceRoom)
	return o, nil
}

// (b) P4, P5: decode's ABORT inside a non-last chunk's transfer window.
func abortInChunkWindow() Scenario {
	return Scenario{
		Name:  "abort-in-chunk-window",
		Spec:  "§6.3 P4, P5",
		Doc:   "decode's ABORT while chunk 0 of 2 is in flight; the scheduler then sends the last chunk; chunk 0 lands",
		Kinds: Kinds(),
		Run: func(t *Target) (Outcome, error) {
			return windowRun(t, func() { t.Engine.DecodeAbort(raceRoom, decodeEP) })
		},
		Check: func(o Outcome) error {
			var x expect
			// Every engine: the posted write cannot be cancelled, so it lands
			// after the ABORT, and nothing new is posted (Failed is sticky).
			x.that(o.LateWrites == 1 && o.PostsAfterAbort == 0, "chunk 0 lands late, chunk 1 is never posted")
			x.that(!o.Pinned && o.Final.Status == kv.StatusFailed, "the room ends Failed")
			x.that(o.Leaked == 0, "nothing left after the clear")
			if o.Kind == Upstream {
				// The worker's Transferring write after chunk 0 is a no-op on
				// the sticky Failed; chunk 1 is skipped. Decode, which freed its
				// pages at the ABORT, is never told when the late write landed.
				x.that(len(o.Notices) == 0, "upstream never tells decode")
				return x.err()
			}
			x.that(o.NoticesInWindow == 0, "decode must not hear back while chunk 0 is in flight")
			x.that(notices(o, room.AbortAck) == 1, "decode gets its ABORT_ACK once chunk 0 drained")
			return x.err()
		},
	}
}

// (b) with the scheduler's abort, and with the pre-#30352 status rule (P7).
func clientAbortInChunkWindow() Scenario {
	return Scenario{
		Name:  "client-abort-in-chunk-window",
		Spec:  "§6.3 P4, P5, P7",
		Doc:   "the client aborts while chunk 0 of 2 is in flight; the last chunk is sent; chunk 0 lands and the worker writes Transferring",
		Kinds: append(Kinds(), UpstreamPre30352),
		Run: func(t *Target) (Outcome, error) {
			return windowRun(t, func() { t.Engine.Abort(raceRoom) })
		},
		Check: func(o Outcome) error {
			var x expect
			x.that(o.LateWrites == 1, "chunk 0 lands after the abort")
			x.that(!o.Pinned, "not pinned")
			x.that(o.Kind == UpstreamPre30352 || o.Leaked == 0, "nothing left")
			switch o.Kind {
			case UpstreamPre30352:
				// max(Failed=0, Transferring=3): the worker's write resurrects
				// the room, chunk 1 passes the Failed check, and the aborted
				// request reports Success.
				v, _ := o.At("after-chunk-0-landed")
				x.that(v.Status == kv.StatusSuccess, "pre-#30352 the abort is lost: Success, got %v", v.Status)
				x.that(o.PostsAfterAbort == 1, "chunk 1 is posted after the abort")
				x.that(o.Final.Status == kv.StatusSuccess, "final Success")
				// The abort's failure record outlives the room: the scheduler
				// saw Success and called clear(), which does not pop it.
				x.that(o.Leaks.FailureRecords == 1 && o.Leaked == 1, "the abort's failure record leaks")
			case Upstream:
				x.that(o.Final.Status == kv.StatusFailed && o.PostsAfterAbort == 0, "sticky Failed holds; chunk 1 skipped")
				x.that(len(o.Notices) == 0, "upstream never tells decode")
			default:
				x.that(o.Final.Status == kv.StatusFailed && o.PostsAfterAbort == 0, "Failed, chunk 1 never posted")
				x.that(o.NoticesInWindow == 0 && notices(o, room.FailureStatus) == 1,
					"decode hears of the failure once, after chunk 0 drained")
			}
			return x.err()
		},
	}
}

// (b) at the baseline: sticky Failed is a read then a write, and an ABORT
// between them is overwritten.
func abortLostInUpdateWindow() Scenario {
	return Scenario{
		Name: "abort-lost-in-update-window",
		Spec: "§6.3 P7 (still open at baseline: update_status reads, then writes)",
		Doc: "chunk 0 of 2 lands; the worker's update(Transferring) reads Transferring (not Failed); decode's ABORT writes Failed; " +
			"the worker writes max(Failed, Transferring); the last chunk is sent",
		Kinds: Kinds(),
		Run: func(t *Target) (Outcome, error) {
			o := Outcome{Room: raceRoom}
			readyRoom(t, 2)
			t.Gate.Hold(chunkOf(raceRoom, 0))
			t.Engine.Send(raceRoom, []int32{1}, nil)
			if err := t.Gate.WaitHeld(raceRoom, 1); err != nil {
				return o, err
			}
			pp := t.Pause(dict.UpdateBetweenReadAndWrite, func(ev dict.Event) bool {
				return ev.Room == raceRoom && ev.Status == kv.StatusTransferring
			})
			defer pp.Release()
			t.Gate.Release(raceRoom, kv.ReasonNone)
			if err := reach(pp); err != nil {
				return o, err
			}
			if !t.HasWindow(dict.UpdateBetweenReadAndWrite) {
				t.SettleWorkers(raceRoom) // no window: let chunk 0 finish first
			}
			t.Engine.DecodeAbort(raceRoom, decodeEP)
			t.SettleBootstrap(raceRoom)
			tick := t.Gate.Tick()
			o.view(t, "after-abort")
			pp.Release()
			t.Engine.Send(raceRoom, []int32{2}, nil)
			t.SettleWorkers(raceRoom)
			o.view(t, "after-last-chunk")
			o.PostsAfterAbort = t.Gate.PostedAfter(raceRoom, tick)
			finish(t, &o, raceRoom)
			return o, nil
		},
		Check: func(o Outcome) error {
			var x expect
			v, _ := o.At("after-abort")
			x.that(v.Status == kv.StatusFailed, "the ABORT is seen: Failed, got %v", v.Status)
			x.that(!o.Pinned, "not pinned")
			if o.Kind == Upstream {
				// The abort is lost: the last chunk goes out to pages decode
				// already freed, the prefill reports Success, and the ABORT's
				// failure record leaks (clear() after Success does not pop it).
				x.that(o.Final.Status == kv.StatusSuccess, "upstream loses the abort: Success, got %v", o.Final.Status)
				x.that(o.PostsAfterAbort == 1, "the last chunk is posted after the ABORT")
				x.that(len(o.Notices) == 0, "upstream never tells decode")
				x.that(o.Leaks.FailureRecords == 1 && o.Leaked == 1, "the ABORT's failure record leaks")
				return x.err()
			}
			x.that(o.Leaked == 0, "nothing left")
			x.that(o.Final.Status == kv.StatusFailed && o.PostsAfterAbort == 0, "Failed stays; nothing posted after it")
			x.that(notices(o, room.AbortAck) == 1, "decode gets its ABORT_ACK")
			return x.err()
		},
	}
}

// P5 at the chunk's start: the worker checked the room before the ABORT and
// posts after it. A dict design cannot close this window (mooncake and the
// later upstream have it too); the fixed port makes it safe by telling decode
// only after the write drained.
func abortAfterWorkerCheck() Scenario {
	return Scenario{
		Name:  "abort-after-worker-check",
		Spec:  "§6.3 P5",
		Doc:   "the worker passed its Failed check for the last chunk; decode's ABORT lands; the worker posts",
		Kinds: Kinds(),
		Run: func(t *Target) (Outcome, error) {
			o := Outcome{Room: raceRoom}
			readyRoom(t, 1)
			t.Gate.Hold(chunkOf(raceRoom, 0))
			pp := t.Pause(dict.WorkerBeforeTransferring, dict.ForRoom(raceRoom))
			defer pp.Release()
			t.Engine.Send(raceRoom, []int32{1}, nil)
			if err := reach(pp); err != nil {
				return o, err
			}
			t.Engine.DecodeAbort(raceRoom, decodeEP)
			t.SettleBootstrap(raceRoom)
			tick := t.Gate.Tick()
			o.view(t, "after-abort")
			pp.Release()
			if t.Dict() != nil {
				if err := t.Gate.WaitHeld(raceRoom, 1); err != nil {
					return o, err
				}
			}
			o.NoticesInWindow = len(t.Notices.Of(raceRoom))
			o.PostsAfterAbort = t.Gate.PostedAfter(raceRoom, tick)
			t.Gate.Release(raceRoom, kv.ReasonNone)
			t.SettleWorkers(raceRoom)
			finish(t, &o, raceRoom)
			return o, nil
		},
		Check: func(o Outcome) error {
			var x expect
			x.that(!o.Pinned && o.Leaked == 0, "not pinned, nothing left")
			switch o.Kind {
			case Upstream:
				// The write goes to pages decode freed at its ABORT, and decode
				// is never told when it landed.
				x.that(o.PostsAfterAbort == 1 && len(o.Notices) == 0, "posted after the ABORT, decode never told")
				x.that(o.Final.Status == kv.StatusFailed, "Failed (sticky), got %v", o.Final.Status)
			case Fixed:
				x.that(o.PostsAfterAbort == 1, "the window is still there: posted after the ABORT")
				x.that(o.NoticesInWindow == 0 && notices(o, room.AbortAck) == 1, "but decode gets its ACK only after the write drained")
				x.that(o.Final.Status == kv.StatusFailed, "Failed, got %v", o.Final.Status)
			default:
				x.that(o.PostsAfterAbort == 0, "a room posts nothing once it processed the ABORT")
				x.that(o.NoticesInWindow == 0 && notices(o, room.AbortAck) == 1, "ACK after the drain")
			}
			return x.err()
		},
	}
}
