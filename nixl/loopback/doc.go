// Package loopback is a pure-Go nixl.Agent that moves bytes between agents on one
// host, in one process or across processes, with NIXL's rules enforced strictly.
//
// Design, in one paragraph: every agent owns a private directory in its user's
// namespace, /dev/shm/kvxfer-<euid>/ (0700; Options.Dir moves the root). Memory
// it hands out with Alloc is a file (0600) in that directory,
// mmap'd MAP_SHARED, so it is never Go heap and any process that maps the same
// file sees the same bytes. The metadata blob names the agent, the path of its
// unix datagram socket (the notification endpoint) and every registered region
// (file, offset in the file, address as the owner sees it, length, device, kind).
// LoadPeer maps the peer's files into this process; a WRITE translates the peer's
// addresses into that mapping and copies with copy(). The copy runs on a small
// worker pool, then the notification is sent to the peer's socket, then the
// request turns Done: the notification never overtakes the bytes. A peer
// whose socket queue is full holds no sender: its notifications wait in its
// outbox, in order, with their requests in flight (outbox.go).
//
// Trust: a peer's metadata is not trusted. LoadPeer maps only segments a
// loopback agent created in this agent's own namespace (exact names, opened with
// O_NOFOLLOW, checked with fstat: a regular file of ours, 0600, one link, large
// enough), so a decode cannot make it write to any other file. Copies run with
// debug.SetPanicOnFault, so a segment or attached file truncated under a
// transfer fails that request (ErrRemoteDisconnect for a peer's segment,
// ErrBackend for local memory) and never the process. This is a backend for
// tests and demos on one host; production uses NIXL itself (package libnixl).
//
// Fault injection (SetFault) is per peer name: added latency (Latency, plus
// bytes ÷ Bandwidth), failure, a request that never completes, and disconnect.
// It exists so that the transfer pool, the conformance suite and the benchmarks
// can exercise every failure path and a modelled wire without real hardware.
// Latency uses no timer: a delayed post copies at once on a worker and gets a
// due time on the monotonic clock; the first Poll at or after it sends the
// notification and reports Done (Due, nixl.Dueer, tells a poller when that
// is). Workers finishing requests call the OnProgress wakers (nixl.Waker), so a
// poller can park instead of polling on a timer.
//
// Limits: one host only; VRAM is host memory with a VRAM label; no progress
// engine is needed because the initiator does the copy (one-sided, like RDMA);
// notification messages are limited to MaxNotifLen bytes.
package loopback
