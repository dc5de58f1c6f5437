// Package layering holds no code: its test checks the import rules the
// architecture states, over the production (non-test) imports of the module.
//
//   - No package under transport/ depends on actors/, directly or through
//     another package: transports declare the interfaces they call, and the
//     daemon adapts the actors to them.
//   - Package kv, the shared vocabulary, imports only fmt and strconv: it is
//     a leaf, and pure enough for the wire codecs.
package layering
