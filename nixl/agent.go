package nixl

import "time"

// Agent is a NIXL agent, reduced to what a prefill-side engine needs and shaped
// after NIXL's cost structure:
//
//   - control plane, slow, once: Register, LocalMetadata, LoadPeer, DropPeer;
//   - per layout and peer, once: Prep (local side with peer "", remote side per peer);
//   - per transfer: Make (indices into two prepared lists) or Create (explicit
//     descriptors, for small one-offs such as aux and state), then Post, then Poll
//     until terminal, then Release.
//
// Each method maps to one libnixl call (nixl_capi_* in parentheses) so that a cgo
// backend can implement it one to one. Rules every backend enforces (the loopback
// backend strictly, so tests catch misuse):
//
//   - every descriptor lies inside one registered region of the list's kind
//     (local regions for the local side, the peer's loaded regions otherwise);
//   - Make: index counts equal, every index inside its list, local[i].Len == remote[i].Len;
//   - a request has at most one post in flight: Post on an in-flight request
//     returns ErrRequestActive; Post after a terminal state starts it again;
//   - Release only in a terminal state (Done, Failed, or never posted);
//     releasing an in-flight request returns ErrRequestActive and changes nothing;
//   - the notification of a request reaches the target only after that request's
//     bytes have landed; a request is Done only after its notification was sent.
//
// An Agent is safe for concurrent use by several goroutines (NIXL's STRICT sync
// mode), but one request must not be posted, polled and released from two
// goroutines at once (NIXL issue #2049); the transfer pool owns its requests.
type Agent interface {
	// Name is the agent's unique name; peers key notifications and metadata by it.
	Name() string

	// Register makes regions of one kind usable for transfers and part of the
	// local metadata (nixl_capi_register_mem). Register big regions once.
	Register(kind MemKind, regions []Desc) (RegID, error)
	// Deregister undoes one Register (nixl_capi_deregister_mem). Peers holding old
	// metadata are not told.
	Deregister(id RegID) error

	// LocalMetadata serializes what a peer needs to target this agent: its name,
	// connection info and every registered region (nixl_capi_get_local_md).
	LocalMetadata() ([]byte, error)
	// LoadPeer loads a peer's metadata blob and returns the peer's name
	// (nixl_capi_load_remote_md). Loading the same blob again is a no-op.
	LoadPeer(md []byte) (peer string, err error)
	// DropPeer forgets a peer (nixl_capi_invalidate_remote_md). Prepared lists and
	// requests built for it become stale: Make and Post fail with ErrPeerUnknown
	// and requests still in flight end Failed with ErrPeerUnknown.
	DropPeer(peer string) error

	// Prep resolves descriptors once so that requests can be built by index
	// (nixl_capi_prep_xfer_dlist). peer == "" is the local side; otherwise the
	// descriptors are in the peer's address space and must lie in its regions.
	Prep(peer string, kind MemKind, descs []Desc) (ListID, error)
	// ReleaseList frees a prepared list (nixl_capi_release_xfer_dlist_handle).
	// Requests already made from it keep working.
	ReleaseList(id ListID) error

	// Make builds a request from a local prepared list and a remote prepared list
	// with equal-length index lists (nixl_capi_make_xfer_req). Runs of consecutive
	// indices that are adjacent in memory on both sides may be merged. notif nil
	// means no notification; non-nil (even empty) is delivered to the remote agent
	// after the bytes land. The agent copies what it keeps: callers may reuse
	// the index slices and notif after Make returns (also for Create).
	Make(op Op, local ListID, localIdx []int32, remote ListID, remoteIdx []int32, notif []byte) (XferID, error)
	// Create builds a request from explicit descriptor lists without preparing
	// them (nixl_capi_create_xfer_req); for small, rare transfers (aux, state).
	Create(op Op, localKind MemKind, local []Desc, peer string, remoteKind MemKind, remote []Desc, notif []byte) (XferID, error)
	// Post starts a request (nixl_capi_post_xfer_req). It returns Done if the
	// transfer completed inside the call, otherwise InProgress. Posting an
	// in-flight request returns ErrRequestActive; a disconnected peer returns
	// ErrRemoteDisconnect and leaves the request Failed.
	Post(x XferID) (State, error)
	// Poll reports the state of many requests in one call
	// (nixl_capi_get_xfer_status per handle). out must be at least len(xs) long;
	// unknown ids report Failed with ErrInvalid. The error result is only for a
	// closed agent or a short out slice.
	Poll(xs []XferID, out []Status) error
	// Release frees a request in a terminal state (nixl_capi_release_xfer_req).
	// It returns ErrRequestActive, and keeps the request, while it is in flight.
	Release(x XferID) error

	// Notifs appends every notification received since the last call to dst and
	// returns it (nixl_capi_get_notifs). Delivery is at most once.
	Notifs(dst []Notif) ([]Notif, error)
	// SendNotif sends a notification not tied to a transfer (nixl_capi_gen_notif).
	// There is no ordering guarantee relative to transfers.
	SendNotif(peer string, msg []byte) error

	// Close releases everything the agent holds. Requests still in flight are
	// abandoned; their memory stays valid until Close returns.
	Close() error
}

// Waker is an optional Agent interface: the agent tells pollers when a Poll
// may find progress, so a poller that found none can park instead of polling
// on a timer (Go timers below 1 ms fire at about 1.1 ms; the transfer pool
// spins through its mailbox for a while, then parks until woken).
//
// OnProgress registers wake; stop unregisters it (wake is not called after
// stop returns). The agent calls every registered wake, from any goroutine,
// after anything a Poll would observe changed: a request reached Done or
// Failed, or came due (a backend that completes requests when they are polled
// at or after a due time calls wake once the earliest due time has passed,
// or reports it through Due). wake must be cheap and must not block or call
// back into the agent; the agent must not hold a lock that Poll, Post or
// Release take while it calls wake. Spurious calls are allowed; a missed one
// is not: a request that changes state after a Poll returned is followed by
// a wake.
type Waker interface {
	OnProgress(wake func()) (stop func())
}

// Dueer is an optional Agent interface for backends whose requests complete
// when polled at or after a due time (the loopback's injected latency): Due
// reports the earliest due time, on the monotonic clock, of the requests
// posted and still in flight (ok false: none). A poller may spin until then
// instead of parking. Requests with no due time (in progress on a worker, or
// hung by a fault) are not counted.
type Dueer interface {
	Due() (at time.Time, ok bool)
}

// Requests is the per-transfer part of Agent: what a Batch hands out.
type Requests interface {
	Make(op Op, local ListID, localIdx []int32, remote ListID, remoteIdx []int32, notif []byte) (XferID, error)
	Create(op Op, localKind MemKind, local []Desc, peer string, remoteKind MemKind, remote []Desc, notif []byte) (XferID, error)
	Post(x XferID) (State, error)
	Poll(xs []XferID, out []Status) error
	Release(x XferID) error
}

// Batcher is an optional Agent interface for backends whose every call hops
// onto an owner thread (libnixl: the hop costs 10–20 µs on two cores, the
// call itself about 1 µs). Batch makes one hop and runs f there; the calls f
// makes on r run in place. f must make them from its own goroutine, must
// not block or call the Agent itself (that call would wait for the hop f
// holds), and must not keep r: once f returns, r's calls fail with
// ErrInvalid. A panic in f is raised again in Batch's caller, and the agent
// goes on. Once the agent is closed Batch returns ErrClosed without running
// f.
type Batcher interface {
	Batch(f func(r Requests)) error
}

// InBatch runs f in one Batch of a if it is a Batcher, and on a itself
// otherwise.
func InBatch(a Agent, f func(r Requests)) error {
	if b, ok := a.(Batcher); ok {
		return b.Batch(f)
	}
	f(a)
	return nil
}

// SelfPoller is an optional Agent interface: while requests are in flight
// the agent polls them itself and calls its Waker's functions when one ends
// (libnixl's owner goroutine, whose polling is what moves the bytes on CPU
// transports). A poller that found nothing done parks at once: polling on
// its own would only add calls, for libnixl each a hop.
type SelfPoller interface {
	PollsItself() bool
}

// PollsItself reports whether a is a SelfPoller that says it polls itself.
func PollsItself(a Agent) bool {
	sp, ok := a.(SelfPoller)
	return ok && sp.PollsItself()
}
