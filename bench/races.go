package bench

// Races lists the scenarios that reproduce, on purpose and deterministically,
// the interleavings that pin rooms or leak state in SGLang's dict-based NIXL
// prefill (spec §6.3). Each runs against the upstream port, the fixed port and
// the actor engine; Check states what each of them does.
func Races() []Scenario {
	return []Scenario{
		abortBeforeSender(),
		abortInChunkWindow(),
		clientAbortInChunkWindow(),
		abortLostInUpdateWindow(),
		abortAfterWorkerCheck(),
		lateInfoAfterClear(),
		infoRacingClear(),
		lateWorkerWriteAfterClear(),
		chunkDequeuedAfterClear(),
	}
}

const raceRoom = 7
