// Package nixl defines the Agent interface that mirrors NIXL's cost structure
// (register once, prepare descriptor lists once per peer, then make, post and poll
// transfers by index lists) and the SGLang-exact descriptor and notification rules.
// Backends live in sub-packages.
package nixl
