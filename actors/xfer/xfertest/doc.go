// Package xfertest is a test fake of the transfer pool (actors/xfer): an
// actors.Transfers that completes writes at once or holds them until the test
// releases them, and records every post, so a test can open a chunk's transfer
// window exactly where it wants and count writes that land late. The race
// scenarios, the rule tests and the bench driver run all three engines over it.
// It also holds Notices, the actors.Notifier that records what decode would be
// told.
//
// It is test support, not actor code: it is called from many goroutines and
// guards its records with a mutex.
package xfertest
