package transport

// SinkFuncs adapts plain functions to Sink; nil fields drop that kind of message. Handy for
// tests, the decode emulator and small tools; the engine implements Sink on its router.
type SinkFuncs struct {
	OnRegistration func(*Registration)
	OnTransferInfo func(*TransferInfo)
	OnAbort        func(*Abort)
	OnStaging      func(Inbound)
	OnBadFrame     func(error)
}

func (f SinkFuncs) Registration(m *Registration) {
	if f.OnRegistration != nil {
		f.OnRegistration(m)
	}
}

func (f SinkFuncs) TransferInfo(m *TransferInfo) {
	if f.OnTransferInfo != nil {
		f.OnTransferInfo(m)
	}
}

func (f SinkFuncs) Abort(m *Abort) {
	if f.OnAbort != nil {
		f.OnAbort(m)
	}
}

func (f SinkFuncs) Staging(m Inbound) {
	if f.OnStaging != nil {
		f.OnStaging(m)
	}
}

func (f SinkFuncs) BadFrame(err error) {
	if f.OnBadFrame != nil {
		f.OnBadFrame(err)
	}
}
