// Package kvmem allocates SGLang-shaped KV, aux and state buffers in loopback
// shared memory and registers them with a loopback agent. The demo, the decode
// and scheduler emulators and the end-to-end tests use it to stand up a prefill
// or decode rank whose memory looks like SGLang's KVArgs.
package kvmem
