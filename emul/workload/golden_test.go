package workload

// Values computed once from the rule as documented; a change here is a change
// of the shared rule (update docs/emulators.md and the scheduler emulator).
const (
	goldenRoom0 = 616392976978218424
	goldenDraw  = 0x5e41ab087439611e
)
