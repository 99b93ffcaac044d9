// Package catalog finds the checkpoints of a training run: the step-NNNNNNNN
// prefixes under a run URL, which of them are committed, and the newest
// one that is safe to resume from.
package catalog

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ckptkit/ckptkit/ckpterr"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/metadata"
)

// StepPrefix is the prefix of a checkpoint directory under a run.
const StepPrefix = "step-"

// ErrNoCommittedCheckpoint is returned by Latest when no committed, valid checkpoint
// exists under the run.
var ErrNoCommittedCheckpoint = ckpterr.New(ckpterr.NotFound, "no committed checkpoint under this run")

// StepName is the checkpoint prefix name of step: "step-00000012".
func StepName(step int64) string { return fmt.Sprintf("%s%08d", StepPrefix, step) }

// ParseStep returns the step of a "step-NNNNNNNN" name.
func ParseStep(name string) (int64, bool) {
	s, ok := strings.CutPrefix(name, StepPrefix)
	if !ok || s == "" {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil && n >= 0
}

// Entry is one checkpoint prefix under a run.
type Entry struct {
	Name      string    `json:"name"`
	Step      int64     `json:"step"`
	URL       string    `json:"url"`
	Committed bool      `json:"committed"`
	Format    string    `json:"format,omitempty"`
	Objects   int       `json:"objects"`
	Bytes     int64     `json:"bytes"`
	ModTime   time.Time `json:"mod_time"`
	// ForeignObjects counts objects under the prefix whose names ckptkit
	// does not write (see OwnedObject). Operations that delete refuse
	// prefixes holding any.
	ForeignObjects int `json:"foreign_objects"`
}

// Age is how long ago the newest object of the checkpoint was written, or
// -1 when the backend reported no modification time.
func (e Entry) Age(now time.Time) time.Duration {
	if e.ModTime.IsZero() {
		return -1
	}
	return now.Sub(e.ModTime)
}

// OwnedObject reports whether rel, a key relative to a checkpoint prefix,
// is a name ckptkit's saver writes: the native metadata object or a data
// object "rank-NNNNN-NNN.data" (digits of any width).
func OwnedObject(rel string) bool {
	if rel == metadata.ObjectKey {
		return true
	}
	rest, ok := strings.CutPrefix(rel, "rank-")
	if !ok {
		return false
	}
	rest, ok = strings.CutSuffix(rest, ".data")
	if !ok {
		return false
	}
	a, b, ok := strings.Cut(rest, "-")
	return ok && allDigits(a) && allDigits(b)
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// List lists the checkpoints under run, oldest step first, with one
// listing of the run prefix.
func List(ctx context.Context, run *backend.Store) ([]Entry, error) {
	byName := map[string]*Entry{}
	formats := metadata.Formats()
	err := run.List(ctx, "", func(o backend.ObjectInfo) error {
		name, rest, ok := strings.Cut(o.Key, "/")
		if !ok {
			return nil
		}
		step, ok := ParseStep(name)
		if !ok {
			return nil
		}
		e := byName[name]
		if e == nil {
			e = &Entry{Name: name, Step: step, URL: run.URL(name)}
			byName[name] = e
		}
		e.Objects++
		e.Bytes += o.Size
		if !OwnedObject(rest) {
			e.ForeignObjects++
		}
		if o.ModTime.After(e.ModTime) {
			e.ModTime = o.ModTime
		}
		for _, f := range formats {
			if rest == f.ObjectKey {
				e.Committed = true
				e.Format = f.Name
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list run %s: %w", run, err)
	}
	out := make([]Entry, 0, len(byName))
	for _, e := range byName {
		out = append(out, *e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Step < out[j].Step })
	return out, nil
}

// Skipped is a newer checkpoint that Latest passed over, and why.
type Skipped struct {
	Entry  Entry
	Reason string
}

// Latest returns the newest committed checkpoint under run that passes
// loader.Verify (deep when asked), and the newer ones it skipped.
func Latest(ctx context.Context, run *backend.Store, deep bool) (*Entry, []Skipped, error) {
	entries, err := List(ctx, run)
	if err != nil {
		return nil, nil, err
	}
	return LatestIn(ctx, run, entries, deep)
}

// LatestIn is Latest over entries already listed by List (oldest first),
// for callers that need both the listing and the newest valid checkpoint
// without listing the run twice.
func LatestIn(ctx context.Context, run *backend.Store, entries []Entry, deep bool) (*Entry, []Skipped, error) {
	var skipped []Skipped
	for i := len(entries) - 1; i >= 0; i-- {
		e := entries[i]
		if !e.Committed {
			skipped = append(skipped, Skipped{Entry: e, Reason: "uncommitted (no metadata object)"})
			continue
		}
		st, err := run.Sub(e.Name)
		if err != nil {
			return nil, skipped, err
		}
		rep, err := loader.Verify(ctx, st, loader.VerifyOptions{Deep: deep})
		if err != nil {
			return nil, skipped, err
		}
		if !rep.Resumable {
			skipped = append(skipped, Skipped{Entry: e, Reason: fmt.Sprintf("%s: %s", rep.Problems[0].Rule, rep.Problems[0].Message)})
			continue
		}
		return &e, skipped, nil
	}
	return nil, skipped, fmt.Errorf("%s: %w", run, ErrNoCommittedCheckpoint)
}
