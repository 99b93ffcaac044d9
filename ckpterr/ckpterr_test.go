package ckpterr_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/stretchr/testify/assert"
)

var errCorrupt = ckpterr.New(ckpterr.BadCheckpoint, "chunk is corrupt")
var errMissing = ckpterr.New(ckpterr.NotFound, "object not found")

func TestClassOfOutermostWins(t *testing.T) {
	inner := fmt.Errorf("read x: %w", errMissing)
	assert.Equal(t, ckpterr.NotFound, ckpterr.ClassOf(inner))
	outer := fmt.Errorf("%w: data object listed in metadata: %w", errCorrupt, inner)
	assert.Equal(t, ckpterr.BadCheckpoint, ckpterr.ClassOf(outer))
	assert.True(t, errors.Is(outer, ckpterr.ErrBadCheckpoint))
	assert.True(t, errors.Is(outer, ckpterr.ErrNotFound), "the inner class stays visible to errors.Is")
	assert.True(t, errors.Is(outer, errMissing))
}

func TestClassOfContextAndUnclassified(t *testing.T) {
	assert.Equal(t, ckpterr.Internal, ckpterr.ClassOf(nil))
	assert.Equal(t, ckpterr.Internal, ckpterr.ClassOf(errors.New("boom")))
	assert.Equal(t, ckpterr.Canceled, ckpterr.ClassOf(fmt.Errorf("%w: %w", errCorrupt, context.Canceled)))
	assert.Equal(t, ckpterr.Transient, ckpterr.ClassOf(fmt.Errorf("get: %w", context.DeadlineExceeded)))
	assert.Equal(t, ckpterr.BadCheckpoint, ckpterr.ClassOf(fmt.Errorf("%w: %w", errCorrupt, context.DeadlineExceeded)))
}

func TestWithClass(t *testing.T) {
	assert.Nil(t, ckpterr.WithClass(nil, ckpterr.Access))
	err := ckpterr.WithClass(errors.New("remote: denied"), ckpterr.Access)
	assert.Equal(t, ckpterr.Access, ckpterr.ClassOf(err))
	assert.True(t, errors.Is(err, ckpterr.ErrAccess))
	assert.False(t, errors.Is(err, ckpterr.ErrUsage))
	assert.Equal(t, "remote: denied", err.Error())
}

func TestClassNumbersAndNames(t *testing.T) {
	seen := map[string]bool{}
	for i, c := range ckpterr.Classes {
		assert.Equal(t, i, int(c), "Classes is in number order")
		assert.False(t, seen[c.String()], "duplicate name %s", c)
		seen[c.String()] = true
		assert.True(t, errors.Is(ckpterr.New(c, "x"), c.Err()))
	}
	assert.Equal(t, ckpterr.ErrInternal, ckpterr.Class(99).Err())
}

func ExampleClassOf() {
	// A package declares its sentinels with a class ...
	errChecksum := ckpterr.New(ckpterr.BadCheckpoint, "checksum mismatch")
	// ... wraps them with context where they happen ...
	err := fmt.Errorf("read key %q in object %q: %w", "model.w", "rank-0.data", errChecksum)
	// ... and callers decide by class.
	fmt.Println(ckpterr.ClassOf(err), errors.Is(err, ckpterr.ErrBadCheckpoint))
	// Output: bad-checkpoint true
}

// matcher is an error type that is no sentinel but matches one through Is,
// as typed errors such as a coverage error do.
type matcher struct{}

func (matcher) Error() string             { return "tiles badly" }
func (matcher) Is(target error) bool      { return errors.Is(errCorrupt, target) }
func (unclassified) Error() string        { return "driver said no" }
func (unclassified) Class() ckpterr.Class { return ckpterr.Internal }

type unclassified struct{ inner error }

func (u unclassified) Unwrap() error { return u.inner }

func TestClassOfTypedErrors(t *testing.T) {
	assert.Equal(t, ckpterr.BadCheckpoint, ckpterr.ClassOf(fmt.Errorf("load: %w", matcher{})))
	// An error that says Internal about itself lets ClassOf look inside.
	assert.Equal(t, ckpterr.NotFound, ckpterr.ClassOf(unclassified{inner: errMissing}))
	assert.Equal(t, ckpterr.Internal, ckpterr.ClassOf(unclassified{}))
	// errors.Join: the first classified branch wins.
	assert.Equal(t, ckpterr.NotFound, ckpterr.ClassOf(errors.Join(errors.New("x"), errMissing, errCorrupt)))
}
