package gc_test

import (
	"context"
	"path"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/ops/gc"
	"github.com/ckptkit/ckptkit/saver"
)

// objectKeys lists the object keys under st.
func objectKeys(t *testing.T, st *backend.Store) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	require.NoError(t, st.List(context.Background(), "", func(o backend.ObjectInfo) error { out[o.Key] = true; return nil }))
	return out
}

// Issue 16: the data objects of a save attempt that lost the commit to a
// concurrent writer, or that an overwrite replaced, stay under a committed
// checkpoint. gc removes exactly them once older than the grace period and
// the checkpoint still verifies deep and loads.
func TestGCRemovesLosingAndReplacedAttempts(t *testing.T) {
	for _, b := range ckpttest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			run := b.Open(t)
			a, c := ckpttest.NewState(3, 8), ckpttest.NewState(4, 8)
			// step 1: saved, then overwritten by another attempt.
			ckpttest.SaveStep(t, run, 1, a, 2)
			st1 := sub(t, run, 1)
			_, err := saver.SaveLocal(ctx, st1, c.Shard(2), saver.Options{Iteration: 1, Overwrite: true})
			require.NoError(t, err)
			// step 2: two writers race; c loses: a commits while c's
			// metadata is on its way.
			st2 := sub(t, run, 2)
			var once sync.Once
			racing := st2.WithDriver(&hookDriver{Driver: st2.Driver(), put: func(ctx context.Context, key string) error {
				if path.Base(key) == metadata.ObjectKey {
					once.Do(func() { ckpttest.SaveStep(t, run, 2, a, 2) })
				}
				return nil
			}})
			_, err = saver.SaveLocal(ctx, racing, c.Shard(2), saver.Options{Iteration: 2})
			require.ErrorIs(t, err, saver.ErrCommitted)
			ckpttest.SaveStep(t, run, 3, a, 2)

			p := gc.Policy{KeepLast: 5, Grace: time.Hour}
			plan, err := gc.PlanRun(ctx, run, p, false, time.Now())
			require.NoError(t, err)
			require.Empty(t, plan.Orphans, "younger than the grace period: a save may be writing them")

			plan, err = gc.PlanRun(ctx, run, p, false, time.Now().Add(2*time.Hour))
			require.NoError(t, err)
			require.Zero(t, plan.Deletions)
			want := map[string]bool{}
			for _, st := range []*backend.Store{st1, st2} {
				c, err := loader.Open(ctx, st)
				require.NoError(t, err)
				named := map[string]bool{metadata.ObjectKey: true}
				for _, o := range c.Metadata().Objects {
					named[o.Key] = true
				}
				name := strings.TrimSuffix(strings.TrimPrefix(st.Prefix(), run.Prefix()), "/")
				for k := range objectKeys(t, st) {
					if !named[k] {
						want[name+"/"+k] = true
					}
				}
			}
			require.Len(t, want, 4, "two ranks' objects of one losing and one replaced attempt")
			got := map[string]bool{}
			for _, o := range plan.Orphans {
				got[o.Key] = true
			}
			require.Equal(t, want, got)
			n, size, err := gc.DeleteOrphans(ctx, run, plan.Orphans, gc.Options{})
			require.NoError(t, err)
			require.Equal(t, 4, n)
			require.Equal(t, plan.OrphanBytes, size)
			for _, st := range []*backend.Store{st1, st2, sub(t, run, 3)} {
				c, err := loader.Open(ctx, st)
				require.NoError(t, err)
				require.Len(t, objectKeys(t, st), len(c.Metadata().Objects)+1, st.String())
				rep, err := c.Verify(ctx, loader.VerifyOptions{Deep: true})
				require.NoError(t, err)
				require.True(t, rep.Resumable, "%s: %v", st, rep.Problems)
			}
			ckpttest.RequireLoads(t, st1, c)
			es, err := catalog.ListDetailed(ctx, run)
			require.NoError(t, err)
			for _, e := range es {
				require.Equal(t, 1, e.Attempts, e.Name)
			}
		})
	}
}
