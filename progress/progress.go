// Package progress is the one type long operations report progress with:
// an Update (how far, counted in what, on which item) passed to a Func.
// Library packages take a Func in their options; the CLI adapts Func to
// its progress bar once.
package progress

// Unit is what an Update's Done and Total count: Bytes, or items named by
// a plural noun ("keys", "checkpoints").
type Unit string

// The units the module's operations report in.
const (
	Bytes       Unit = "bytes"
	Keys        Unit = "keys"
	Checkpoints Unit = "checkpoints"
)

// Update is one report of a long operation.
type Update struct {
	// Done of Total units are handled so far (Total may grow while an
	// operation discovers work, never shrinks).
	Done, Total int64
	Unit        Unit
	// Item names what was just handled when the operation knows it: the
	// key compared, the checkpoint deleted, the tensor written, the URL
	// verified ("" otherwise).
	Item string
	// Objects and Bytes are what Item weighed, when the operation counts
	// it (gc: the objects and bytes it deleted).
	Objects int
	Bytes   int64
	// Skipped is non-empty when Item was left alone, and says why.
	Skipped string
}

// Func receives Updates. It may be called from several goroutines at
// once (a concurrent copy or verify), so it must be safe for that.
type Func func(Update)

// Report calls f with u; it does nothing when f is nil.
func (f Func) Report(u Update) {
	if f != nil {
		f(u)
	}
}
