package reliability

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/metadata"
)

// Single-bit flips at uniformly random bit positions of a committed
// checkpoint (every byte of every object, metadata included): each must be
// caught by verify --deep and by a load.
func TestBitFlipsAreDetected(t *testing.T) {
	n := size(1000, 200)
	ctx := context.Background()
	run := ckpttest.OpenURL(t, "file://"+t.TempDir())
	s := ckpttest.NewState(21, 16)
	st := ckpttest.SaveStep(t, run, 1, s, 2)
	dir := st.String()[len("file://"):]
	files, err := filepath.Glob(filepath.Join(dir, "*"))
	require.NoError(t, err)
	sort.Strings(files)
	type object struct {
		path string
		data []byte
	}
	var objs []object
	total := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		objs = append(objs, object{f, b})
		total += len(b)
	}
	targets := ckpttest.Targets(s.Shard(2))
	detected, missed, inMeta := 0, 0, 0
	var firstMiss string
	for range n {
		pos := rand.IntN(total)
		o := 0
		for pos >= len(objs[o].data) {
			pos -= len(objs[o].data)
			o++
		}
		bit := byte(1) << rand.IntN(8)
		if filepath.Base(objs[o].path) == metadata.ObjectKey {
			inMeta++
		}
		bad := append([]byte(nil), objs[o].data...)
		bad[pos] ^= bit
		require.NoError(t, os.WriteFile(objs[o].path, bad, 0o644))
		verifyCaught, loadCaught := false, false
		c, err := loader.Open(ctx, st)
		if err != nil {
			verifyCaught, loadCaught = true, true
		} else {
			rep, err := c.Verify(ctx, loader.VerifyOptions{Deep: true})
			verifyCaught = err != nil || !rep.Resumable
			_, err = c.Load(ctx, targets, loader.Options{})
			loadCaught = err != nil
		}
		require.NoError(t, os.WriteFile(objs[o].path, objs[o].data, 0o644))
		if verifyCaught && loadCaught {
			detected++
			continue
		}
		missed++
		if firstMiss == "" {
			firstMiss = fmt.Sprintf("%s byte %d bit %02x: verify %v load %v", filepath.Base(objs[o].path), pos, bit, verifyCaught, loadCaught)
		}
	}
	record(row{Class: "single-bit flips (data and metadata)", Tried: n, Survived: detected, Lost: missed,
		Note: fmt.Sprintf("uniform over the %d bytes of a 2-rank checkpoint (%d flips in the metadata object); detected = verify --deep and load both fail", total, inMeta)})
	require.Zero(t, missed, firstMiss)
}
