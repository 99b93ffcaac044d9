package catalog_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/instrument"
	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
	_ "github.com/ckptkit/ckptkit/interop/torchdcp" // the DCP format and the names its ckptkit writer gives objects
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/progress"
	"github.com/ckptkit/ckptkit/saver"
)

// flipDataByte flips one byte in the middle of the first data object of the
// checkpoint at st, keeping its size (so only a deep verify notices).
func flipDataByte(t *testing.T, st *backend.Store) {
	t.Helper()
	ctx := context.Background()
	c, err := loader.Open(ctx, st)
	require.NoError(t, err)
	obj := c.Metadata().Objects[0].Key
	data, err := st.ReadAll(ctx, obj, 0)
	require.NoError(t, err)
	data[len(data)/2] ^= 0x40
	require.NoError(t, st.PutBytes(ctx, obj, data, backend.PutOptions{}))
}

func TestLatestSkipsUncommittedAndCorrupt(t *testing.T) {
	for _, b := range ckpttest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			run := b.Open(t)
			s10, s20, s30 := ckpttest.NewState(10, 5), ckpttest.NewState(20, 5), ckpttest.NewState(30, 5)
			ckpttest.SaveStep(t, run, 10, s10, 2)
			st20 := ckpttest.SaveStep(t, run, 20, s20, 2)
			st30 := ckpttest.SaveStep(t, run, 30, s30, 2)
			// step 30 loses its commit point: uncommitted.
			require.NoError(t, st30.Delete(ctx, metadata.ObjectKey))

			e, skipped, err := catalog.Latest(ctx, run, false)
			require.NoError(t, err)
			assert.Equal(t, int64(20), e.Step)
			require.Len(t, skipped, 1)
			assert.Equal(t, int64(30), skipped[0].Entry.Step)
			assert.Contains(t, skipped[0].Reason, "uncommitted")

			// A flipped data byte in step 20: shallow still picks it, deep skips it.
			flipDataByte(t, st20)
			e, _, err = catalog.Latest(ctx, run, false)
			require.NoError(t, err)
			assert.Equal(t, int64(20), e.Step)
			var mu sync.Mutex
			var items []string // the candidates a deep verify reported bytes of, in order
			e, skipped, err = catalog.LatestWith(ctx, run, catalog.LatestOptions{Deep: true, Progress: func(u progress.Update) {
				mu.Lock()
				defer mu.Unlock()
				assert.Equal(t, progress.Bytes, u.Unit)
				if len(items) == 0 || items[len(items)-1] != u.Item {
					items = append(items, u.Item)
				}
			}})
			require.NoError(t, err)
			assert.Equal(t, int64(10), e.Step)
			assert.Equal(t, []string{st20.String(), e.URL}, items, "progress names each candidate verified, newest first")
			require.Len(t, skipped, 2)
			assert.Contains(t, skipped[1].Reason, loader.RuleChecksum)
			sub, err := run.Sub(e.Name)
			require.NoError(t, err)
			ckpttest.RequireLoads(t, sub, s10)
		})
	}
}

func TestLatestNone(t *testing.T) {
	for _, b := range ckpttest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			run := b.Open(t)
			_, _, err := catalog.Latest(context.Background(), run, false)
			require.ErrorIs(t, err, catalog.ErrNoCommittedCheckpoint)
		})
	}
}

func TestListReportsEveryPrefix(t *testing.T) {
	for _, b := range ckpttest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			run := b.Open(t)
			ckpttest.SaveStep(t, run, 3, ckpttest.NewState(3, 4), 2)
			require.NoError(t, run.PutBytes(ctx, catalog.StepName(7)+"/rank-00000-000.data", []byte("partial"), backend.PutOptions{}))
			require.NoError(t, run.PutBytes(ctx, catalog.StepName(9)+"/notes.txt", []byte("hand-made"), backend.PutOptions{}))
			require.NoError(t, run.PutBytes(ctx, "other/x", []byte("x"), backend.PutOptions{}))

			before := time.Now()
			es, err := catalog.ListDetailed(ctx, run)
			require.NoError(t, err)
			require.Len(t, es, 3)
			assert.Equal(t, []int64{3, 7, 9}, []int64{es[0].Step, es[1].Step, es[2].Step})
			assert.True(t, es[0].Committed)
			assert.Equal(t, metadata.FormatName, es[0].Format)
			assert.Equal(t, 3, es[0].Objects) // two ranks + metadata
			assert.Zero(t, es[0].ForeignObjects)
			assert.False(t, es[1].Committed)
			assert.Equal(t, int64(7), es[1].Bytes)
			assert.Zero(t, es[1].ForeignObjects)
			assert.Equal(t, 1, es[2].ForeignObjects)
			assert.Less(t, es[0].Age(before.Add(time.Minute)), 2*time.Minute)
			assert.Equal(t, run.URL(catalog.StepName(3)), es[0].URL)
		})
	}
}

// TestListDoesNotEnumerateCheckpointObjects: List finds the checkpoints
// of a run with one delimited listing and one metadata Stat each; no data
// object of any checkpoint is listed.
func TestListDoesNotEnumerateCheckpointObjects(t *testing.T) {
	for _, b := range ckpttest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			run := b.Open(t)
			const n = 6
			for i := 1; i <= n; i++ {
				ckpttest.SaveStep(t, run, int64(i), ckpttest.NewState(uint64(i), 4), 4) // 4 data objects + metadata each
			}
			require.NoError(t, run.PutBytes(ctx, catalog.StepName(n+1)+"/rank-00000-000.data", []byte("partial"), backend.PutOptions{}))
			counter := instrument.Wrap(run.Driver())
			es, err := catalog.List(ctx, run.WithDriver(counter))
			require.NoError(t, err)
			require.Len(t, es, n+1)
			for i, e := range es {
				assert.Equal(t, int64(i+1), e.Step)
				assert.Equal(t, i < n, e.Committed, e.Name)
				if e.Committed {
					assert.Equal(t, metadata.FormatName, e.Format)
					assert.False(t, e.ModTime.IsZero(), "the metadata object's time")
				}
			}
			assert.Equal(t, int64(1), counter.Count(instrument.OpListDelimited), "one delimited listing of the run")
			assert.Zero(t, counter.Count(instrument.OpList), "no full listing")
			assert.Equal(t, int64(n+1), counter.Listed(), "the listing enumerates the checkpoint prefixes only, not their 5 objects each")
			assert.Zero(t, counter.Count(instrument.OpRead), "no metadata is read to list")
			assert.Equal(t, int64(n+len(metadata.Formats())), counter.Count(instrument.OpStat), "one Stat per committed checkpoint; the uncommitted one probes every format")
		})
	}
}

// TestLatestThenLoadReadsMetadataOnce: the library's resume path, choosing
// with Latest and loading from the opened checkpoint it returns, reads the
// chosen checkpoint's metadata object exactly once and lists no
// checkpoint's objects to choose.
func TestLatestThenLoadReadsMetadataOnce(t *testing.T) {
	for _, b := range ckpttest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			run := b.Open(t)
			for i := int64(1); i <= 4; i++ {
				ckpttest.SaveStep(t, run, i, ckpttest.NewState(uint64(i), 4), 2)
			}
			counter := instrument.Wrap(run.Driver())
			found, skipped, err := catalog.Latest(ctx, run.WithDriver(counter), false)
			require.NoError(t, err)
			require.Empty(t, skipped)
			assert.Equal(t, int64(4), found.Step)
			assert.True(t, found.Report.Resumable)
			sds := ckpttest.NewState(4, 4).Shard(2)
			targets := ckpttest.Targets(sds)
			rep, err := found.Checkpoint.Load(ctx, targets, loader.Options{})
			require.NoError(t, err)
			assert.Equal(t, int64(4), rep.Iteration)
			for r, sd := range sds {
				for k, v := range sd.Tensors {
					assert.Equal(t, v.Data, targets[r].Tensors[k].Data, "rank %d %s", r, k)
				}
				for k, v := range sd.Bytes {
					assert.Equal(t, v, targets[r].Bytes[k], "rank %d %s", r, k)
				}
			}
			mdKey := run.Prefix() + catalog.StepName(4) + "/" + metadata.ObjectKey
			assert.Equal(t, int64(1), counter.CountKey(instrument.OpRead, mdKey), "the metadata object is read once for choose + load")
			assert.Equal(t, int64(1), counter.CountKeySuffix(instrument.OpRead, metadata.ObjectKey), "and no other checkpoint's metadata")
			assert.Zero(t, counter.CountKeySuffix(instrument.OpStat, metadata.ObjectKey), "nor stat-ed")
		})
	}
}

func TestOwnedObject(t *testing.T) {
	for name, want := range map[string]bool{
		metadata.ObjectKey:                     true,
		"rank-00000-000.data":                  true,
		"rank-12-3.data":                       true,
		"rank-00000-000.0f3a9c2e41d7b5a8.data": true,
		"rank-00000-000..data":                 false,
		"rank-00000-000.0F3A.data":             false,
		"rank-00000-000.x1.data":               false,
		"rank-00000-000.ab.cd.data":            false,
		"rank--000.data":                       false,
		"rank-00000-000.data2":                 false,
		"rank-0a000-000.data":                  false,
		"rank-00000.data":                      false,
		"sub/rank-0-0.data":                    false,
		// DCP, as ckptkit.torch.save writes it: objects named for the save
		// (a 16-hex-digit tag) and the commit point; torch's own names
		// carry no tag and are not ckptkit's.
		".metadata":                           true,
		"__0_0.b40d2d5fb22f4cbb.distcp":       true,
		"__12_3.b40d2d5fb22f4cbb.distcp":      true,
		".ckptkit-integrity.b40d2d5fb22f4cbb": true,
		"__0_0.distcp":                        false,
		".ckptkit-integrity":                  false,
		"__0_0.B40D2D5FB22F4CBB.distcp":       false,
		"__0_0.b40d2d5f.distcp":               false,
		"__x_0.b40d2d5fb22f4cbb.distcp":       false,
		"0_0.b40d2d5fb22f4cbb.distcp":         false,
		"ckptkit.metadata.json~":              false,
	} {
		assert.Equal(t, want, catalog.OwnedObject(name), name)
	}
}

// TestPerRankOpaqueState: each rank saves its own opaque resume state
// (RNG state, data-loader position) under "rank_state.<rank>.<name>"
// bytes keys; a resume reads every rank's entries back byte for byte.
func TestPerRankOpaqueState(t *testing.T) {
	for _, b := range ckpttest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			run := b.Open(t)
			const world = 4
			s := ckpttest.NewState(5, 8)
			sds := s.Shard(world)
			want := map[string][]byte{}
			for r := range world {
				rng := make([]byte, 5056) // a Mersenne Twister state is this size
				for i := range rng {
					rng[i] = byte(i*7 + r*13)
				}
				pos := []byte(fmt.Sprintf(`{"epoch":3,"sample":%d}`, 1000+r))
				for k, v := range map[string][]byte{"rng": rng, "dataloader": pos, "empty": {}} {
					key := fmt.Sprintf("rank_state.%d.%s", r, k)
					sds[r].Bytes[key] = v
					want[key] = v
				}
			}
			st, err := run.Sub(catalog.StepName(42))
			require.NoError(t, err)
			_, err = saver.SaveLocal(ctx, st, sds, saver.Options{Iteration: 42})
			require.NoError(t, err)

			// Each rank of a resume with the same world size asks for its own keys.
			targets := ckpttest.Targets(sds)
			rep, err := loader.Load(ctx, st, targets, loader.Options{})
			require.NoError(t, err)
			assert.Equal(t, int64(42), rep.Iteration)
			for r := range world {
				for k, v := range sds[r].Bytes {
					// An empty value reads back empty (as a nil slice).
					assert.True(t, bytes.Equal(v, targets[r].Bytes[k]), "rank %d key %s", r, k)
				}
			}
			// And any reader sees every rank's entries.
			c, err := loader.Open(ctx, st)
			require.NoError(t, err)
			for k, v := range want {
				got, err := c.ReadBytes(ctx, k)
				require.NoError(t, err)
				assert.True(t, bytes.Equal(v, got), k)
			}
		})
	}
}
