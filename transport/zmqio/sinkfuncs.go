package zmqio

import "github.com/kvxfer/kvxfer/transport/wire"

// SinkFuncs adapts plain functions to Sink; nil fields drop that kind of message. Handy for
// tests, the decode emulator and small tools. In kvxferd the Sink is the daemon's peer
// table (daemon/peers.go), which hands transfer infos and aborts to the engine.
type SinkFuncs struct {
	OnRegistration func(*wire.Registration)
	OnTransferInfo func(*wire.TransferInfo)
	OnAbort        func(*wire.Abort)
	OnStaging      func(wire.Inbound)
	OnBadFrame     func(error)
}

func (f SinkFuncs) Registration(m *wire.Registration) {
	if f.OnRegistration != nil {
		f.OnRegistration(m)
	}
}

func (f SinkFuncs) TransferInfo(m *wire.TransferInfo) {
	if f.OnTransferInfo != nil {
		f.OnTransferInfo(m)
	}
}

func (f SinkFuncs) Abort(m *wire.Abort) {
	if f.OnAbort != nil {
		f.OnAbort(m)
	}
}

func (f SinkFuncs) Staging(m wire.Inbound) {
	if f.OnStaging != nil {
		f.OnStaging(m)
	}
}

func (f SinkFuncs) BadFrame(err error) {
	if f.OnBadFrame != nil {
		f.OnBadFrame(err)
	}
}
