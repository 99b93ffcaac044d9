package catalog

import (
	"context"
	"errors"
	"fmt"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/loader"
)

// DataDamaged tells whether a load failed on the stored bytes themselves (a
// CRC32C mismatch, an invalid bool byte, a missing or truncated data
// object): damage the metadata could not show, found while reading, so an
// older checkpoint may still be good.
func DataDamaged(err error) bool {
	return errors.Is(err, loader.ErrChecksum) || errors.Is(err, loader.ErrInvalidBool) || errors.Is(err, loader.ErrMissingObject)
}

// LoadWithFallback loads found (a checkpoint of run) with load, which must
// build fresh targets or overwrite every target on each call, since a failed
// one-pass load leaves them partly filled. When the data of a checkpoint
// turns out damaged (DataDamaged), it says so through logf and tries the
// next older valid checkpoint of run, until one loads; any other failure is
// returned as it is. It returns the checkpoint loaded and its report. This
// is the one fallback rule of a resume: `ckpt train --resume` and the C
// ABI's resume both use it.
//
// Every rule that can be checked before a byte is written is checked on
// each candidate, so an older checkpoint that breaks one (other optimizer
// param groups, say) is refused; the targets are then as the damaged
// attempt left them, and the error says so: it wraps the refusal (its rule
// and class are the error's), names the damage, and wraps
// loader.ErrTargetsPartlyFilled when that attempt had written into the
// targets.
func LoadWithFallback(ctx context.Context, run *backend.Store, found *Found, load func(*loader.Checkpoint) (*loader.Report, error), logf func(string, ...any)) (*loader.Checkpoint, *loader.Report, error) {
	var entries []Entry
	var damaged error // the last damaged attempt's error
	for {
		c := found.Checkpoint
		rep, err := load(c)
		if err == nil {
			return c, rep, nil
		}
		if !DataDamaged(err) {
			if damaged != nil {
				// The refusal decides the error's rule and class; the
				// damage is named, not wrapped (it would make the error a
				// checksum failure, and DataDamaged true), except that
				// the targets are partly filled.
				if errors.Is(damaged, loader.ErrTargetsPartlyFilled) {
					return nil, nil, fmt.Errorf("%w (the next older checkpoint, after falling back from a damaged one: %v): %w", err, damaged, loader.ErrTargetsPartlyFilled)
				}
				return nil, nil, fmt.Errorf("%w (the next older checkpoint, after falling back from a damaged one: %v)", err, damaged)
			}
			return nil, nil, err
		}
		damaged = err
		if entries == nil {
			var lerr error
			if entries, lerr = List(ctx, run); lerr != nil {
				return nil, nil, fmt.Errorf("%w; listing %s for an older checkpoint: %w", err, run, lerr)
			}
		}
		// Only the checkpoints older than the damaged one.
		i := 0
		for i < len(entries) && entries[i].Step < found.Step {
			i++
		}
		entries = entries[:i]
		older, skipped, lerr := LatestIn(ctx, run, entries, false)
		for _, s := range skipped {
			logf("skipping %s: %s", s.Entry.URL, s.Reason)
		}
		if lerr != nil {
			return nil, nil, fmt.Errorf("%w; and no older checkpoint is valid: %w", err, lerr)
		}
		logf("checkpoint %s is damaged (%v); falling back to the next older valid checkpoint, %s", c.URL(), err, older.Checkpoint.URL())
		found = older
	}
}
