// Package sched emulates SGLang's prefill scheduler (disaggregation/prefill.py)
// driving kvxferd over the control API: it owns the prefill KV and aux memory
// (shared-memory files kvxferd maps), registers it, and runs the scheduler's
// loop for a deterministic workload (emul/workload): the bootstrap queue
// (open, poll until WaitingForInput, pop_decode_prefix_len, init), chunked
// sends, the inflight queue (poll until terminal), clear on Success,
// failure_exception on Failed, and the prefill-side aborts of the plan. Polls
// are batched over every queued room, once per loop iteration, as the real
// scheduler does.
package sched
