package dict

// Leaks counts the entries left in each map. Once every room was cleared (or
// never opened), every count but Tombstones should be zero; Tombstones expire
// after their TTL.
type Leaks struct {
	RequestStatus  int
	TransferInfos  int
	PrefixLen      int
	FailureRecords int
	Exceptions     int
	Senders        int
	Drains         int // Fixed: rooms with a chunk in flight or decode still owed a notice
	Tombstones     int // Fixed
}

// Total is every count but Tombstones.
func (l Leaks) Total() int {
	return l.RequestStatus + l.TransferInfos + l.PrefixLen + l.FailureRecords + l.Exceptions + l.Senders + l.Drains
}

// Leaks counts the entries now.
func (e *Engine) Leaks() Leaks {
	e.smu.Lock()
	senders := len(e.senders)
	e.smu.Unlock()
	e.dmu.Lock()
	drains := len(e.drains)
	e.dmu.Unlock()
	return Leaks{
		RequestStatus: e.status.len(), TransferInfos: e.infos.len(), PrefixLen: e.prefix.len(),
		FailureRecords: e.failures.len(), Exceptions: e.exceptions.len(), Senders: senders,
		Drains: drains, Tombstones: e.tombs.len(),
	}
}
