// Package gate is the transfer layer the race scenarios and the rule tests run
// all three engines over: an actors.Transfers that completes writes at once or
// holds them until the test releases them, and records every post, so a test
// can open a chunk's transfer window exactly where it wants and count writes
// that land late. It also holds Notices, the actors.Notifier that records what
// decode would be told.
package gate
