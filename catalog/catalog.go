// Package catalog finds the checkpoints of a training run: the step-NNNNNNNN
// prefixes under a run URL, which of them are committed, and the newest
// one that is safe to resume from.
package catalog

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/planner"
	"github.com/ckptkit/ckptkit/progress"
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
	Name      string
	Step      int64
	URL       string
	Committed bool
	Format    string
	Objects   int
	Bytes     int64
	ModTime   time.Time
	// ForeignObjects counts objects under the prefix whose names ckptkit
	// does not write (see OwnedObject). Operations that delete refuse
	// prefixes holding any.
	ForeignObjects int
	// Unreadable, when set, is why the checkpoint's objects could not be
	// read: storage refused it (class access: a directory this process
	// may not read, say). Such a checkpoint is listed, skipped by Latest
	// with this reason, and never taken for uncommitted.
	Unreadable string
	// Attempts counts the distinct save attempts whose data objects are
	// under the prefix (ListDetailed only): more than one means a retried
	// or concurrent save left objects the metadata may not name.
	Attempts int
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
// object "rank-NNNNN-NNN.data" or "rank-NNNNN-NNN.<attempt>.data"
// (planner.ParseObjectName).
//
// For the other formats ckptkit writes (a registered format with a
// WrittenObject hook: the DCP checkpoints of ckptkit.torch.save), their
// metadata object and the data objects the hook attributes to a save are
// ckptkit's too.
func OwnedObject(rel string) bool {
	_, ok := writtenBy(metadata.Formats(), rel)
	return ok
}

// writtenBy returns the save attempt that wrote rel ("" for a metadata
// object) and whether ckptkit writes that name at all.
func writtenBy(formats []metadata.Format, rel string) (string, bool) {
	if rel == metadata.ObjectKey {
		return "", true
	}
	if a, ok := planner.ParseObjectName(rel); ok {
		return a, true
	}
	for _, f := range formats {
		if f.WrittenObject == nil {
			continue
		}
		if rel == f.ObjectKey {
			return "", true
		}
		if a, ok := f.WrittenObject(rel); ok {
			return f.Name + ":" + a, true
		}
	}
	return "", false
}

// WrittenFormat reports whether ckptkit writes checkpoints of the format
// named name (native, or a format registered with a WrittenObject hook):
// gc expires only those.
func WrittenFormat(name string) bool {
	if name == metadata.FormatName {
		return true
	}
	for _, f := range metadata.Formats() {
		if f.Name == name {
			return f.WrittenObject != nil
		}
	}
	return false
}

// List lists the checkpoints under run, oldest step first, without
// enumerating their objects: one delimited (one-level) listing of the run
// finds the step-NNNNNNNN prefixes, and one Stat per format metadata object
// (native first, stopping at the first found) tells committed ones, their
// format and ModTime (the metadata object's, written last). Objects, Bytes
// and ForeignObjects stay zero and ModTime is zero for uncommitted
// prefixes; ListDetailed fills them.
func List(ctx context.Context, run *backend.Store) ([]Entry, error) {
	out, err := steps(ctx, run)
	if err != nil {
		return nil, err
	}
	formats := metadata.Formats()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(statConcurrency)
	for i := range out {
		e := &out[i]
		g.Go(func() error {
			for _, f := range formats {
				a, err := run.Stat(gctx, e.Name+"/"+f.ObjectKey)
				if errors.Is(err, backend.ErrNotFound) {
					continue
				}
				if ckpterr.ClassOf(err) == ckpterr.Access {
					e.Unreadable = err.Error()
					return nil
				}
				if err != nil {
					return err // a Store error names the operation and the URL
				}
				e.Committed, e.Format, e.ModTime = true, f.Name, a.ModTime
				return nil
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return out, nil
}

// statConcurrency bounds List's concurrent metadata Stats.
const statConcurrency = 16

// ListDetailed is List with every checkpoint's objects counted: one
// listing per checkpoint prefix fills Objects, Bytes, ForeignObjects and
// ModTime (the newest object's), what `ckpt ls` shows and gc decides on.
func ListDetailed(ctx context.Context, run *backend.Store) ([]Entry, error) {
	out, err := steps(ctx, run)
	if err != nil {
		return nil, err
	}
	formats := metadata.Formats()
	for i := range out {
		e := &out[i]
		attempts := map[string]bool{}
		err := run.List(ctx, e.Name+"/", func(o backend.ObjectInfo) error {
			rest := strings.TrimPrefix(o.Key, e.Name+"/")
			e.Objects++
			e.Bytes += o.Size
			if a, ok := writtenBy(formats, rest); !ok {
				e.ForeignObjects++
			} else if a != "" { // "": a metadata object
				attempts[a] = true
			}
			if o.ModTime.After(e.ModTime) {
				e.ModTime = o.ModTime
			}
			for _, f := range formats {
				if rest == f.ObjectKey && !e.Committed {
					e.Committed, e.Format = true, f.Name
				}
			}
			return nil
		})
		if ckpterr.ClassOf(err) == ckpterr.Access {
			e.Unreadable = err.Error()
			continue
		}
		if err != nil {
			return nil, err // a Store error names the operation and the URL
		}
		e.Attempts = len(attempts)
	}
	return out, nil
}

// steps returns the step-NNNNNNNN prefixes directly under run, oldest
// first, from one delimited listing (objects below them are not listed).
func steps(ctx context.Context, run *backend.Store) ([]Entry, error) {
	var out []Entry
	err := run.ListDelimited(ctx, "", func(o backend.ObjectInfo) error {
		if !o.IsPrefix {
			return nil
		}
		name := strings.TrimSuffix(o.Key, backend.Delimiter)
		if step, ok := ParseStep(name); ok {
			out = append(out, Entry{Name: name, Step: step, URL: run.URL(name)})
		}
		return nil
	})
	if err != nil {
		return nil, err // a Store error names the operation and the URL
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Step < out[j].Step })
	return out, nil
}

// Skipped is a newer checkpoint that Latest passed over, and why.
type Skipped struct {
	Entry  Entry
	Reason string
	// Err is the problem as an error of its class and rule (the open
	// error, or the first verify problem wrapped around its rule's
	// sentinel, loader.RuleError); nil for an uncommitted prefix.
	Err error
}

// Found is the checkpoint Latest chose, opened: its metadata object was
// read once, to verify it, and Checkpoint.Load reads the data through the
// same reader without reading the metadata again.
type Found struct {
	Entry
	// Checkpoint is the opened checkpoint; load from it directly.
	Checkpoint *loader.Checkpoint
	// Report is the verify report that accepted it.
	Report *loader.VerifyReport
}

// Latest opens the newest committed checkpoint under run that passes
// verify (deep when asked) and returns it with the newer ones it skipped.
// It lists the run with one delimited listing (no checkpoint's objects are
// enumerated) and reads each candidate's metadata once, newest first; the
// chosen one is returned open, ready to Load, so a resume reads its
// metadata exactly once. With no valid checkpoint the error matches
// ErrNoCommittedCheckpoint and the skipped list says why each one was
// refused.
func Latest(ctx context.Context, run *backend.Store, deep bool) (*Found, []Skipped, error) {
	return LatestWith(ctx, run, LatestOptions{Deep: deep})
}

// LatestOptions tune LatestWith.
type LatestOptions struct {
	// Deep verifies every byte of each candidate (every checksum).
	Deep bool
	// Progress, when set, is called during a deep verify with the bytes
	// checked so far of the candidate's total (Unit progress.Bytes), its
	// URL as Item.
	Progress progress.Func
}

// LatestWith is Latest with options.
func LatestWith(ctx context.Context, run *backend.Store, opts LatestOptions) (*Found, []Skipped, error) {
	entries, err := steps(ctx, run)
	if err != nil {
		return nil, nil, err
	}
	return choose(ctx, run, entries, opts, false)
}

// LatestIn is Latest over entries already listed by List or ListDetailed
// (oldest first), for callers that need both the listing and the newest
// valid checkpoint without listing the run twice. Entries not Committed
// are skipped without being opened.
func LatestIn(ctx context.Context, run *backend.Store, entries []Entry, deep bool) (*Found, []Skipped, error) {
	return choose(ctx, run, entries, LatestOptions{Deep: deep}, true)
}

// choose opens entries newest first and returns the first that verifies.
// With known, an entry's Committed field is trusted; otherwise opening it
// tells (a prefix without a metadata object is uncommitted).
func choose(ctx context.Context, run *backend.Store, entries []Entry, opts LatestOptions, known bool) (*Found, []Skipped, error) {
	var skipped []Skipped
	const uncommitted = "uncommitted (no metadata object)"
	const unreadable = "unreadable: "
	for i := len(entries) - 1; i >= 0; i-- {
		e := entries[i]
		if e.Unreadable != "" {
			skipped = append(skipped, Skipped{Entry: e, Reason: unreadable + e.Unreadable})
			continue
		}
		if known && !e.Committed {
			skipped = append(skipped, Skipped{Entry: e, Reason: uncommitted})
			continue
		}
		st, err := run.Sub(e.Name)
		if err != nil {
			return nil, skipped, err
		}
		c, err := loader.Open(ctx, st)
		switch {
		case errors.Is(err, loader.ErrIncomplete), errors.Is(err, loader.ErrNoCheckpoint):
			e.Committed = false
			skipped = append(skipped, Skipped{Entry: e, Reason: uncommitted})
			continue
		case ckpterr.ClassOf(err) == ckpterr.BadCheckpoint:
			// Committed, but its metadata or an item read at open is bad
			// (malformed, a forbidden pickle global, ...): it does not
			// verify, so an older checkpoint is tried.
			e.Committed = true
			skipped = append(skipped, Skipped{Entry: e, Reason: err.Error(), Err: err})
			continue
		case ckpterr.ClassOf(err) == ckpterr.Access:
			// Storage refuses to read this one (a directory this process
			// may not read): an older checkpoint is tried, and callers
			// never take it for uncommitted.
			e.Unreadable = err.Error()
			skipped = append(skipped, Skipped{Entry: e, Reason: unreadable + e.Unreadable})
			continue
		case err != nil:
			return nil, skipped, err
		}
		e.Committed, e.Format = true, c.FormatName()
		vo := loader.VerifyOptions{Deep: opts.Deep}
		if opts.Progress != nil {
			url := e.URL
			vo.Progress = func(u progress.Update) {
				u.Item = url
				opts.Progress(u)
			}
		}
		rep, err := c.Verify(ctx, vo)
		if err != nil {
			return nil, skipped, err
		}
		if !rep.Resumable {
			p := rep.Problems[0]
			skipped = append(skipped, Skipped{Entry: e, Reason: fmt.Sprintf("%s: %s", p.Rule, p.Message),
				Err: fmt.Errorf("%s: %w: %s", e.URL, loader.RuleError(p.Rule), p.Message)})
			continue
		}
		return &Found{Entry: e, Checkpoint: c, Report: rep}, skipped, nil
	}
	return nil, skipped, fmt.Errorf("%s: %w", run, ErrNoCommittedCheckpoint)
}

// IsMetadataObject reports whether rel, a key relative to a checkpoint
// prefix, is some known format's metadata object: a commit point, never an
// orphan.
func IsMetadataObject(rel string) bool {
	for _, f := range metadata.Formats() {
		if rel == f.ObjectKey {
			return true
		}
	}
	return false
}

// errStopListing ends a listing early.
var errStopListing = errors.New("stop listing")

// IsEmpty reports whether no object at all is stored under st (a prefix
// the backend reports as not found is empty): a fresh run, or a mistyped
// URL.
func IsEmpty(ctx context.Context, st *backend.Store) (bool, error) {
	empty := true
	err := st.ListDelimited(ctx, "", func(backend.ObjectInfo) error {
		empty = false
		return errStopListing
	})
	if err != nil && !errors.Is(err, errStopListing) && !errors.Is(err, backend.ErrNotFound) {
		return false, err
	}
	return empty, nil
}
