package cuda

// What this package's external tests use and production code does not.

// Handles is the number of distinct handles open.
func (im *Importer) Handles() int {
	im.mu.Lock()
	defer im.mu.Unlock()
	return len(im.open)
}
