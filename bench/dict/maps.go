package dict

import "sync"

// table is one of upstream's shared dicts. Every single operation is atomic, as
// the GIL makes a single dict operation, and no lock is held across two
// operations, so a read-modify-write sequence built from them races exactly as
// upstream's does. Only the fixed variant uses apply, the atomic
// read-modify-write that upstream lacks.
type table[K comparable, V any] struct {
	mu sync.Mutex
	m  map[K]V
}

func newTable[K comparable, V any]() *table[K, V] { return &table[K, V]{m: map[K]V{}} }

func (t *table[K, V]) get(k K) (V, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	v, ok := t.m[k]
	return v, ok
}

func (t *table[K, V]) has(k K) bool {
	_, ok := t.get(k)
	return ok
}

func (t *table[K, V]) set(k K, v V) {
	t.mu.Lock()
	t.m[k] = v
	t.mu.Unlock()
}

// pop is dict.pop(k, None).
func (t *table[K, V]) pop(k K) (V, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	v, ok := t.m[k]
	delete(t.m, k)
	return v, ok
}

func (t *table[K, V]) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// setdefault is dict.setdefault(k, mk()): one atomic operation upstream too.
func (t *table[K, V]) setdefault(k K, mk func() V) V {
	t.mu.Lock()
	defer t.mu.Unlock()
	if v, ok := t.m[k]; ok {
		return v
	}
	v := mk()
	t.m[k] = v
	return v
}

// apply runs fn on the entry under the lock: fn returns the new value and
// whether to store it (false leaves the map as it was).
func (t *table[K, V]) apply(k K, fn func(v V, ok bool) (V, bool)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	v, ok := t.m[k]
	if nv, store := fn(v, ok); store {
		t.m[k] = nv
	}
}

// snapshot copies the entries (dict.items() under the GIL).
func (t *table[K, V]) snapshot() map[K]V {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[K]V, len(t.m))
	for k, v := range t.m {
		out[k] = v
	}
	return out
}

// deleteIf removes, under the lock, every entry for which fn returns true.
// Only the fixed variant's sweeper uses it.
func (t *table[K, V]) deleteIf(fn func(k K, v V) bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, v := range t.m {
		if fn(k, v) {
			delete(t.m, k)
		}
	}
}
