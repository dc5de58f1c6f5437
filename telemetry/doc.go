// Package telemetry is kvxfer's observability: an actors.Observer that turns
// what rooms do into OpenTelemetry traces and metrics, and the process setup
// (TracerProvider from the standard OTEL_* variables, Prometheus /metrics).
//
// Hot path. The Observer's methods run on actor goroutines. Each room's
// actor owns the room's record (no lock), and aggregates are atomic
// counters in stripes by room id; they never call the OTel SDK. Everything else
// happens elsewhere:
//
//   - spans are built when a room retires, by one background goroutine, from the
//     record the room left (trace.WithTimestamp gives them their real times);
//   - metrics are aggregated when they are read: Observer implements the OTel
//     metric SDK's Producer, so the Prometheus exporter (or any reader) pulls
//     them from the atomics at scrape time.
//
// Tail sampling. The SDK's head samplers decide at span start, which is too
// early to know whether a room will fail. The Observer buffers each room and
// decides at retirement: Failed rooms and rooms slower than Sampling.Slow are
// always kept, the rest by the configured ratio (or by the parent's sampled
// flag, for the parentbased_* samplers). The TracerProvider must therefore
// record everything it is given (Setup installs AlwaysSample).
//
// Bounds. At most Config.MaxRooms rooms are tracked (the rest are counted as
// untracked), at most Config.MaxEvents (≤ 128) status events and
// Config.MaxTransferSpans child spans per room, and at most Config.QueueSize
// retired rooms wait for their spans; beyond that they are dropped and counted.
//
// docs/observability.md lists every span, attribute and metric.
package telemetry
