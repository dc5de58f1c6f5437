// Package sgltest proves kvxferd against SGLang's own decode code.
//
// Its tests run SGLang's real, unmodified decode-side transfer classes
// (NixlKVManager in DisaggregationMode.DECODE and one NixlKVReceiver per room,
// from sglang/srt/disaggregation/{nixl,common}/conn.py) of each SGLang release
// installed by scripts/install-sglang.sh, as tests/sglang/decode_peer.py
// subprocesses, against an in-process kvxferd with the real NIXL backend (UCX
// over DRAM). The prefill side is driven through the control API, as SGLang's
// prefill scheduler would; the decode side is driven the way SGLang's decode
// scheduler (disaggregation/decode.py) drives its receivers, including the
// metadata gate and, from 0.5.21, the deferred page release on ABORT_ACK.
//
// Scenarios, for each release: one chunk, three chunks, 200 rooms, a prefill
// client abort mid-transfer, decode aborts (before the prefill sender exists,
// after the transfer info, mid-transfer), a decode SIGKILL, and a mixed fleet
// (one decode of each release against one kvxferd). Every byte that lands in
// decode memory is checked. TestSGLangDecode logs a release × scenario matrix.
//
// The shm_ rows (one chunk, three chunks, 200 rooms, the prefill abort and
// the decode abort mid-transfer) run again with the prefill scheduler on the
// shared-memory control path (docs/control-api.md §6: the Go ShmClient's
// ring records, polls read from the status table), so that path is judged by
// SGLang's own decode too.
//
// Running:
//
//	bash scripts/install-nixl.sh && bash scripts/install-sglang.sh
//	go test -v -run TestSGLangDecode ./sgltest/
//
// The tests skip when a release's venv is missing, unless
// KVXFER_REQUIRE_SGLANG=1. KVXFER_SGLANG_ROOT (default /opt/kvxfer-sglang)
// and KVXFER_SGLANG_VERSIONS (default "0.5.18 0.5.23") select the venvs.
package sgltest
