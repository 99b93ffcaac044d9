package planner

import (
	"errors"
	"fmt"

	"github.com/ckptkit/ckptkit/ckpterr"
)

// Sentinel errors of the planner. Every error PlanSave, PlanLoad and
// CheckCoverage return matches one of them with errors.Is.
var (
	// ErrInvalidPlan reports a malformed save item or read request: empty
	// key, unknown kind or dtype, inconsistent geometry, wrong byte length,
	// an item offered twice by the same rank, duplicate ranks or objects.
	ErrInvalidPlan = ckpterr.New(ckpterr.Usage, "invalid plan")
	// ErrPlanMismatch reports two sides that disagree about a key: two saving
	// ranks (kind, dtype, global shape, byte length) or a read request and
	// the checkpoint (kind, dtype, shape). The message names both sides.
	ErrPlanMismatch = ckpterr.New(ckpterr.BadCheckpoint, "mismatch")
	// ErrKeyNotFound reports a requested key the checkpoint does not hold.
	ErrKeyNotFound = ckpterr.New(ckpterr.BadCheckpoint, "key not found in checkpoint")
	// ErrCoverage reports chunks that do not tile their tensor exactly.
	// The concrete error is a *CoverageError.
	ErrCoverage = ckpterr.New(ckpterr.BadCheckpoint, "chunks do not tile the tensor")
)

// Coverage error kinds (CoverageError.Kind).
const (
	// CoverageGap: a region of the tensor is covered by no chunk.
	CoverageGap = "gap"
	// CoverageOverlap: a region is covered by two chunks.
	CoverageOverlap = "overlap"
	// CoverageOutOfBounds: a chunk does not fit the tensor's shape.
	CoverageOutOfBounds = "out-of-bounds"
)

// CoverageError says where a tensor's chunks fail to tile its shape. It
// matches ErrCoverage with errors.Is.
type CoverageError struct {
	// Key is the tensor's key.
	Key string
	// Shape is the tensor's global shape.
	Shape []int64
	// Kind is CoverageGap, CoverageOverlap or CoverageOutOfBounds.
	Kind string
	// Offsets and Sizes are a concrete box: for a gap, a region no chunk
	// covers; for an overlap, a region two chunks both cover; for
	// out-of-bounds, the offending chunk's box.
	Offsets []int64
	Sizes   []int64
	// Detail says which chunks are involved.
	Detail string
}

// Error names the key, the kind and the region.
func (e *CoverageError) Error() string {
	s := fmt.Sprintf("tensor %q (shape %v): %s at offsets %v sizes %v", e.Key, e.Shape, e.Kind, e.Offsets, e.Sizes)
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Is makes errors.Is(err, ErrCoverage) true.
// It also matches ErrCoverage's ckpterr class.
func (e *CoverageError) Is(target error) bool { return errors.Is(ErrCoverage, target) }
