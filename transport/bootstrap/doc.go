// Package bootstrap is SGLang's HTTP bootstrap protocol: BootstrapServer is a
// CommonKVBootstrapServer (PUT/GET /route, /register_dp_rank, /query_dp_ranks, /health,
// optional bearer auth); RegisterRank registers a rank into any such server. JSON bodies
// are written byte for byte as Python's json.dumps writes them (pyjson.go).
package bootstrap
