// Package schedmem is the prefill scheduler's memory as kvxfer's tests lay it
// out: K then V of every layer in one KV list of page-sized items, SGLang's
// aux buffers one per item length, their control API registrations, and the
// pattern a room's pages and aux row are written with (the one decode
// checks). It is apart from testrig because it needs the control API, whose
// own tests use testrig.
package schedmem
