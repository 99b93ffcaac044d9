package main

import (
	"context"
	"net/url"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/fs"
	"github.com/ckptkit/ckptkit/backend/instrument"
	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/metadata"
)

// countfs://HOST/abs/dir is the file system at /abs/dir behind a counting
// driver, so a test can see what a command asked of storage.
var (
	countMu  sync.Mutex
	counters []*instrument.Counter
)

func init() {
	backend.MustRegister("countfs", func(_ context.Context, u *url.URL) (backend.Driver, string, error) {
		d, err := fs.New(u.Path)
		if err != nil {
			return nil, "", err
		}
		c := instrument.Wrap(d)
		countMu.Lock()
		counters = append(counters, c)
		countMu.Unlock()
		return c, "", nil
	})
}

// counted runs the command line and returns the counter of the one store
// it opened.
func counted(t *testing.T, args ...string) (*instrument.Counter, string) {
	t.Helper()
	countMu.Lock()
	counters = nil
	countMu.Unlock()
	code, out, errs := ckpt(t, args...)
	require.Equal(t, 0, code, "%v: %s", args, errs)
	countMu.Lock()
	defer countMu.Unlock()
	require.Len(t, counters, 1, "the command opens the run once")
	return counters[0], out
}

// TestTrainResumeReadsMetadataOnce: `ckpt train --resume` chooses the
// newest checkpoint and loads it reading its metadata object exactly once,
// reads no older checkpoint's metadata, and finds the checkpoints without
// listing their objects.
func TestTrainResumeReadsMetadataOnce(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	trainJSON(t, "--url", dir, "--steps", "9", "--save-every", "3", "--ranks", "2")
	run := "countfs://" + dir

	c, _ := counted(t, "train", "--json", "--seed", "7", "--url", run, "--steps", "12", "--save-every", "3", "--ranks", "2", "--resume")
	assert.Equal(t, int64(1), c.CountKey(instrument.OpRead, catalog.StepName(9)+"/"+metadata.ObjectKey), "the resumed checkpoint's metadata is read once")
	assert.Equal(t, int64(1), c.CountKeySuffix(instrument.OpRead, metadata.ObjectKey), "no other metadata object is read")
	assert.Equal(t, int64(1), c.CountKey(instrument.OpListDelimited, ""), "one delimited listing of the run")
	assert.Zero(t, c.CountKey(instrument.OpList, ""), "no full listing of the run")
	assert.Equal(t, int64(1), c.CountKey(instrument.OpList, catalog.StepName(9)+"/"), "one listing of the chosen checkpoint (verify compares its objects)")

	// ckpt latest chooses the same way: one metadata read.
	c, out := counted(t, "latest", run)
	assert.Contains(t, out, "step 12")
	assert.Equal(t, int64(1), c.CountKeySuffix(instrument.OpRead, metadata.ObjectKey), "latest reads one metadata object")
	assert.Zero(t, c.CountKey(instrument.OpList, ""), "no full listing of the run")
}
