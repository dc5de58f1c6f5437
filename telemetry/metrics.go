package telemetry

import (
	"context"
	"sort"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/kv"
)

// Scope is the instrumentation scope of kvxfer's spans and metrics.
const Scope = "github.com/kvxfer/kvxfer/telemetry"

var _ sdkmetric.Producer = (*Observer)(nil)

// Histogram bucket bounds, in seconds.
var (
	statusBounds   = []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}
	transferBounds = []float64{0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}
)

const (
	numStatuses = 5
	numReasons  = 16 // kv.Reason values fit; larger ones are counted as the last
	numMsgKinds = 13
)

var msgNames = [numMsgKinds]string{"other", "open", "init", "send", "poll", "abort", "clear", "transfer_info",
	"decode_abort", "peer_lost", "xfer_done", "deadline", "fail"}

func msgIndex(m room.Msg) int {
	switch m.(type) {
	case room.Open:
		return 1
	case room.Init:
		return 2
	case room.Send:
		return 3
	case room.Poll:
		return 4
	case room.Abort:
		return 5
	case room.Clear:
		return 6
	case room.TransferInfo:
		return 7
	case room.DecodeAbort:
		return 8
	case room.PeerLost:
		return 9
	case room.XferDone:
		return 10
	case room.Deadline:
		return 11
	case room.Fail:
		return 12
	}
	return 0
}

func statusIndex(s kv.Status) int {
	if int(s) < numStatuses {
		return int(s)
	}
	return int(kv.StatusFailed)
}

func reasonIndex(r kv.Reason) int {
	if int(r) < numReasons {
		return int(r)
	}
	return numReasons - 1
}

// hist is a snapshot of fixed-bucket histograms (a stripe's), summed.
type hist struct {
	n      int // buckets in use: len(bounds)+1
	counts [maxBuckets]uint64
	sumNs  int64
}

const maxBuckets = 18

func (h *hist) init(bounds int) { h.n = bounds + 1 }

// add adds histogram i of st.
func (h *hist) add(st *stripe, i int) {
	for b := range h.counts {
		h.counts[b] += uint64(st.rows[b][i].Load())
	}
	h.sumNs += st.sums[i].Load()
}

func (h *hist) point(set attribute.Set, secs []float64, start, now time.Time) metricdata.HistogramDataPoint[float64] {
	p := metricdata.HistogramDataPoint[float64]{Attributes: set, StartTime: start, Time: now, Bounds: secs,
		BucketCounts: append([]uint64(nil), h.counts[:len(secs)+1]...), Sum: time.Duration(h.sumNs).Seconds()}
	for _, c := range p.BucketCounts {
		p.Count += c
	}
	return p
}

func toNs(secs []float64) []time.Duration {
	out := make([]time.Duration, len(secs))
	for i, s := range secs {
		out[i] = time.Duration(s * float64(time.Second))
	}
	return out
}

var (
	statusBoundsNs   = toNs(statusBounds)
	transferBoundsNs = toNs(transferBounds)
)

// totals sums the stripes into a fresh snapshot (the live-room gauges come
// from the engines: see Observer.live).
func (o *Observer) totals() *shardStats {
	t := &shardStats{}
	for s := range t.statusDur {
		t.statusDur[s].init(len(statusBounds))
	}
	t.xferDur.init(len(transferBounds))
	for i := range o.all {
		st := &o.all[i]
		t.created += st.created.Load()
		t.tracked += st.created.Load() - st.released.Load()
		t.untracked += st.untracked.Load()
		t.evicted += st.evicted.Load()
		t.posted += st.posted.Load()
		t.xferOK += st.xferOK.Load()
		t.xferFailed += st.xferFailed.Load()
		t.bytesOK += st.bytesOK.Load()
		t.bytesFailed += st.bytesFailed.Load()
		for s := range numStatuses {
			t.retired[s] += st.retired[s].Load()
			t.statusDur[s].add(st, s)
		}
		for r := range numReasons {
			t.failures[r] += st.failures[r].Load()
		}
		for k := range numMsgKinds {
			t.absorbed[k][0] += st.absorbed[k][0].Load()
			t.absorbed[k][1] += st.absorbed[k][1].Load()
		}
		for d := range numDecisions {
			t.decisions[d] += st.decisions[d].Load()
		}
		t.xferDur.add(st, xferHist)
	}
	return t
}

// Precomputed attribute sets (label values).
var (
	noAttrs      = attribute.NewSet()
	statusSets   [numStatuses]attribute.Set
	reasonSets   [numReasons]attribute.Set
	absorbedSets [numMsgKinds][2]attribute.Set
	decisionSets [numDecisions]attribute.Set
	okSet        = attribute.NewSet(attribute.String("outcome", "ok"))
	failedSet    = attribute.NewSet(attribute.String("outcome", "failed"))
)

func init() {
	for s := range statusSets {
		statusSets[s] = attribute.NewSet(attribute.String("status", kv.Status(s).String()))
	}
	for r := range reasonSets {
		name := kv.Reason(r).String()
		if r == 0 {
			name = "none"
		}
		reasonSets[r] = attribute.NewSet(attribute.String("reason", name))
	}
	for k := range absorbedSets {
		absorbedSets[k][0] = attribute.NewSet(attribute.String("msg", msgNames[k]), attribute.String("room", "live"))
		absorbedSets[k][1] = attribute.NewSet(attribute.String("msg", msgNames[k]), attribute.String("room", "retired"))
	}
	for d := range decisionSets {
		decisionSets[d] = attribute.NewSet(attribute.String("decision", keepReason(d).String()))
	}
}

// daemonCounters maps Daemon.Counters() keys to metric names.
var daemonCounters = []struct{ key, name, desc string }{
	{"bad_frames", "kvxfer_bad_frames", "Decode frames that could not be decoded (malformed or unknown)."},
	{"registrations", "kvxfer_registrations", "Decode registrations accepted."},
	{"duplicate_registrations", "kvxfer_duplicate_registrations", "Decode registrations repeated for a known agent."},
	{"bad_registrations", "kvxfer_bad_registrations", "Decode registrations rejected."},
	{"staging_frames_dropped", "kvxfer_staging_frames_dropped", "Staging-buffer frames dropped (not supported)."},
	{"notices_dropped", "kvxfer_notices_dropped", "KV_STATUS or ABORT_ACK frames that could not be sent to decode."},
	{"peers_lost", "kvxfer_peers_lost", "Decode agents whose connection was lost (their rooms failed peer_lost)."},
	{"peers_dropped", "kvxfer_peers_dropped", "Decode agents dropped: connection or NIXL peer lost, or a new agent registered from their endpoint."},
	{"abort_endpoints_refused", "kvxfer_abort_endpoints_refused", "ABORT frames whose return address is no registered decode's endpoint (room failed, no ABORT_ACK, no link)."},
	{"links_evicted", "kvxfer_links_evicted", "PUSH links to decode closed to stay under the link cap (least recently used first)."},
	{"notices_send_failed", "kvxfer_notices_send_failed", "Frames to decode that libzmq failed to send, or still queued at a link's flush deadline."},
	{"log_lines_suppressed", "kvxfer_log_lines_suppressed", "Per-message warnings not logged by the rate limiter (one line a second per kind)."},
	{"peers_returned", "kvxfer_peers_returned", "Decode agents that registered again from their endpoint (decode reset its connection; their old rooms failed peer_lost)."},
	{"peers_fenced", "kvxfer_peers_fenced", "Decode agents unreachable past decode's heartbeat budget: dropped and fenced (docs/kvxferd.md, decode liveness)."},
	{"fenced_transfer_infos", "kvxfer_fenced_transfer_infos", "Transfer infos from a fenced decode agent: their rooms failed peer_lost before seeing them."},
	{"queued_frames_refused", "kvxfer_queued_frames_refused", "Transfer infos or ABORTs past the queue of a decode whose registration was still loading."},
	{"activations_rolled_back", "kvxfer_activations_rolled_back", "Activations (going live) that failed and were undone."},
	{"lost_rooms", "kvxfer_lost_rooms", "Rooms of a lost predecessor kvxferd that the scheduler named (failed transfer_process_lost; their decodes told)."},
}

// shmCounters maps the shared-memory control path's Counters() keys
// (daemon/shm.go) to metric names; the clients lost are one metric by cause.
var shmCounters = []struct {
	key, name, unit, desc string
	gauge                 bool
}{
	{"shm_sessions", "kvxfer_shm_sessions", "{session}", "Shared-memory control sessions attached now.", true},
	{"shm_sessions_attached", "kvxfer_shm_sessions_attached", "{session}", "Shared-memory control sessions ever attached.", false},
	{"shm_records", "kvxfer_shm_records", "{record}", "Ring records consumed (open, init, send, abort, clear).", false},
	{"shm_doorbell_sleeps", "kvxfer_shm_doorbell_sleeps", "{sleep}", "Times a ring consumer slept on its futex doorbell after spinning.", false},
	{"shm_doorbell_wakes", "kvxfer_shm_doorbell_wakes", "{wake}", "Doorbell sleeps ended by the client's futex wake.", false},
	{"shm_missed_wakes", "kvxfer_shm_missed_wakes", "{wake}", "Doorbell sleeps ended by the 100 ms safety timeout with records waiting (a lost wake-up).", false},
	{"shm_full_waits", "kvxfer_shm_full_waits", "{wait}", "Times clients waited for room in a full ring or index area (client-reported).", false},
	{"shm_rooms_lost", "kvxfer_shm_rooms_lost", "{room}", "Rooms failed client_lost because their shared-memory client was dropped.", false},
	{"shm_invalid_records", "kvxfer_shm_invalid_records", "{record}", "Init or send records a room could not take (the room failed invalid_request).", false},
	{"shm_traced_opens", "kvxfer_shm_traced_opens", "{record}", "Open records that carried a valid traceparent.", false},
	{"shm_ignored_traceparents", "kvxfer_shm_ignored_traceparents", "{record}", "Open records whose traceparent was not valid (the room opened untraced).", false},
}

func sortedKeys(m map[string]int64) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Produce implements the OTel metric SDK's Producer: every metric, aggregated
// from the atomics now. Register it with the reader, e.g.
// otelprom.New(otelprom.WithProducer(o)) or sdkmetric.NewManualReader(sdkmetric.WithProducer(o)).
func (o *Observer) Produce(context.Context) ([]metricdata.ScopeMetrics, error) {
	now := time.Now()
	start := o.start
	c := o.totals()
	var pinned int
	var age time.Duration
	c.live, pinned, age = o.live()
	var ms []metricdata.Metrics
	sum := func(name, unit, desc string, pts ...metricdata.DataPoint[int64]) {
		for i := range pts {
			pts[i].StartTime, pts[i].Time = start, now
		}
		ms = append(ms, metricdata.Metrics{Name: name, Unit: unit, Description: desc,
			Data: metricdata.Sum[int64]{DataPoints: pts, Temporality: metricdata.CumulativeTemporality, IsMonotonic: true}})
	}
	gauge := func(name, unit, desc string, pts ...metricdata.DataPoint[int64]) {
		for i := range pts {
			pts[i].Time = now
		}
		ms = append(ms, metricdata.Metrics{Name: name, Unit: unit, Description: desc, Data: metricdata.Gauge[int64]{DataPoints: pts}})
	}
	pt := func(set attribute.Set, v int64) metricdata.DataPoint[int64] {
		return metricdata.DataPoint[int64]{Attributes: set, Value: v}
	}

	var live, retired []metricdata.DataPoint[int64]
	var durs []metricdata.HistogramDataPoint[float64]
	for s := range numStatuses {
		live = append(live, pt(statusSets[s], max(c.live[s], 0)))
		retired = append(retired, pt(statusSets[s], c.retired[s]))
		durs = append(durs, c.statusDur[s].point(statusSets[s], statusBounds, start, now))
	}
	gauge("kvxfer_rooms", "{room}", "Live rooms by published status (Success/Failed: concluded, waiting for Clear).", live...)
	sum("kvxfer_rooms_created", "{room}", "Rooms created (first message naming them, from either side).", pt(noAttrs, c.created))
	sum("kvxfer_rooms_retired", "{room}", "Rooms retired to a tombstone, by final status.", retired...)
	ms = append(ms, metricdata.Metrics{Name: "kvxfer_room_status_duration", Unit: "s",
		Description: "Time a room spent in a status before leaving it (the next status, or retirement).",
		Data:        metricdata.Histogram[float64]{DataPoints: durs, Temporality: metricdata.CumulativeTemporality}})

	var fails []metricdata.DataPoint[int64]
	for _, r := range kv.Reasons() {
		fails = append(fails, pt(reasonSets[reasonIndex(r)], c.failures[reasonIndex(r)]))
	}
	sum("kvxfer_room_failures", "{room}", "Rooms that became Failed, by reason (error.type).", fails...)

	ms = append(ms, metricdata.Metrics{Name: "kvxfer_oldest_nonterminal_room_age", Unit: "s",
		Description: "Age of the oldest live room not yet Success or Failed (the silent-pin detector).",
		Data:        metricdata.Gauge[float64]{DataPoints: []metricdata.DataPoint[float64]{{Attributes: noAttrs, Time: now, Value: age.Seconds()}}}})
	gauge("kvxfer_nonterminal_rooms", "{room}", "Live rooms not yet Success or Failed.", pt(noAttrs, int64(pinned)))

	sum("kvxfer_transfers_posted", "{transfer}", "Transfers (one chunk for one decode agent) posted to the pool.", pt(noAttrs, c.posted))
	sum("kvxfer_transfers_completed", "{transfer}", "Transfers reported done, by outcome.",
		pt(okSet, c.xferOK), pt(failedSet, c.xferFailed))
	sum("kvxfer_transfer_bytes", "By", "KV bytes of completed transfers (pages × bytes per page), by outcome.",
		pt(okSet, c.bytesOK), pt(failedSet, c.bytesFailed))
	ms = append(ms, metricdata.Metrics{Name: "kvxfer_transfer_duration", Unit: "s",
		Description: "Time from posting a transfer to its completion.",
		Data: metricdata.Histogram[float64]{DataPoints: []metricdata.HistogramDataPoint[float64]{c.xferDur.point(noAttrs, transferBounds, start, now)},
			Temporality: metricdata.CumulativeTemporality}})

	var abs []metricdata.DataPoint[int64]
	for k := range numMsgKinds {
		for w := range 2 {
			if v := c.absorbed[k][w]; v > 0 {
				abs = append(abs, pt(absorbedSets[k][w], v))
			}
		}
	}
	sum("kvxfer_messages_absorbed", "{message}", "Messages absorbed without effect: late or duplicate frames, stale deadlines; room=retired counts tombstones and unknown rooms.", abs...)
	sum("kvxfer_tombstones_evicted", "{room}", "Tombstones evicted before their TTL because the cap was reached.", pt(noAttrs, c.evicted))
	sum("kvxfer_rooms_refused", "{message}", "Messages that would have made a room live beyond the live-room cap (cause=room_cap) or beyond their decode agent's share of it (cause=peer_share): the room was not created.",
		pt(attribute.NewSet(attribute.String("cause", "room_cap")), o.refusedCap.Load()),
		pt(attribute.NewSet(attribute.String("cause", "peer_share")), o.refusedShare.Load()))

	if o.tracing {
		var dec []metricdata.DataPoint[int64]
		for d := range numDecisions {
			v := c.decisions[d]
			if keepReason(d) == dropQueueFull {
				v = o.queueFull.Load()
			}
			dec = append(dec, pt(decisionSets[d], v))
		}
		sum("kvxfer_trace_rooms", "{room}", "Tail-sampling decisions for retired rooms.", dec...)
		if o.exp != nil {
			sum("kvxfer_trace_spans_exported", "{span}", "Spans handed to the exporter.", pt(noAttrs, o.exported.Load()))
			sum("kvxfer_trace_export_errors", "{batch}", "Span batches the exporter failed to export.", pt(noAttrs, o.exportErrors.Load()))
		}
	}
	sum("kvxfer_telemetry_untracked_rooms", "{room}", "Rooms not tracked because MaxRooms was reached.", pt(noAttrs, c.untracked))
	sum("kvxfer_bad_traceparents", "{message}", "Traceparents passed at Open that did not parse.", pt(noAttrs, o.badTraceparents.Load()))
	processMetrics(gauge)

	if b := o.src.Load(); b != nil {
		dc := b.s.Counters()
		for _, d := range daemonCounters {
			if v, ok := dc[d.key]; ok {
				sum(d.name, "{frame}", d.desc, pt(noAttrs, v))
			}
		}
		for _, d := range shmCounters {
			if v, ok := dc[d.key]; ok && d.gauge {
				gauge(d.name, d.unit, d.desc, pt(noAttrs, v))
			} else if ok {
				sum(d.name, d.unit, d.desc, pt(noAttrs, v))
			}
		}
		if dead, ok := dc["shm_clients_lost_process_exit"]; ok {
			sum("kvxfer_shm_clients_lost", "{session}", "Shared-memory clients kvxferd dropped: cause=process_exit (the client's process exited) or bad_record (a record that did not decode).",
				pt(attribute.NewSet(attribute.String("cause", "process_exit")), dead),
				pt(attribute.NewSet(attribute.String("cause", "bad_record")), dc["shm_clients_lost_bad_record"]))
		}
		peers := b.s.DecodePeers()
		var ppts []metricdata.DataPoint[int64]
		for _, k := range sortedKeys(peers) {
			ppts = append(ppts, pt(attribute.NewSet(attribute.String("sglang_dialect", k)), peers[k]))
		}
		gauge("kvxfer_decode_peers", "{agent}", "Decode agents registered with this rank, by the SGLang release they speak.", ppts...)
		ps := b.s.PoolStats()
		gauge("kvxfer_pool_inflight", "{transfer}", "Transfers in the NIXL pool not yet done (the queue depth).", pt(noAttrs, ps.InFlight))
		sum("kvxfer_pool_quarantined", "{transfer}", "Transfers whose NIXL requests never completed in time (quarantined, not released).", pt(noAttrs, ps.Quarantined))
		sum("kvxfer_pool_posted", "{transfer}", "Transfers accepted by the pool.", pt(noAttrs, ps.Posted))
		sum("kvxfer_pool_requests", "{request}", "NIXL requests posted by the pool.", pt(noAttrs, ps.Requests))
		sum("kvxfer_pool_failed", "{transfer}", "Transfers the pool ended with a failure.", pt(noAttrs, ps.Failed))
		sum("kvxfer_pool_withdrawn", "{transfer}", "Transfers of failed rooms the pool ended before they started (counted in failed too).", pt(noAttrs, ps.Withdrawn))
	}
	return []metricdata.ScopeMetrics{{Scope: instrumentation.Scope{Name: Scope}, Metrics: ms}}, nil
}
