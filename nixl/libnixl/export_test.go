package libnixl

// What this package's external tests use and production code does not.

// RawStatus reports whether post and status results come from nixlAgent's own
// postXferReq/getXferStatus (exact nixl_status_t, so REMOTE_DISCONNECT and
// REPOST_ACTIVE are seen as such) rather than through the C API, which folds
// them into BACKEND. It is true when libnixl.so exports those symbols and
// $KVXFER_LIBNIXL_STATUS is not "capi".
func RawStatus() bool { return rawStatus }

// SetCoreFree replaces the free-processor probe the owner's spin asks until
// the returned func is called. No agent may be running at either call.
func SetCoreFree(f func() bool) (restore func()) {
	old := coreFree
	coreFree = f
	return func() { coreFree = old }
}

// OwnerPolls is how many times the owner goroutine polled its requests in
// flight on its own (not for a caller).
func (a *Agent) OwnerPolls() (n int) {
	_ = a.do(func() { n = a.st.polls })
	return n
}
