package gc_test

import (
	"context"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/ops/gc"
	"github.com/ckptkit/ckptkit/progress"
	"github.com/ckptkit/ckptkit/saver"
)

// hookDriver lets a test intercept Put and Delete of a real driver.
type hookDriver struct {
	backend.Driver
	put    func(ctx context.Context, key string) error
	delete func(ctx context.Context, key string) error
}

func (h *hookDriver) Put(ctx context.Context, key string, size int64, r io.Reader, opts backend.PutOptions) error {
	if h.put != nil {
		if err := h.put(ctx, key); err != nil {
			return err
		}
	}
	return h.Driver.Put(ctx, key, size, r, opts)
}

func (h *hookDriver) Delete(ctx context.Context, key string) error {
	if h.delete != nil {
		if err := h.delete(ctx, key); err != nil {
			return err
		}
	}
	return h.Driver.Delete(ctx, key)
}

func steps(t *testing.T, run *backend.Store) map[int64]catalog.Entry {
	t.Helper()
	es, err := catalog.ListDetailed(context.Background(), run)
	require.NoError(t, err)
	out := map[int64]catalog.Entry{}
	for _, e := range es {
		out[e.Step] = e
	}
	return out
}

func sub(t *testing.T, run *backend.Store, step int64) *backend.Store {
	st, err := run.Sub(catalog.StepName(step))
	require.NoError(t, err)
	return st
}

func TestGCKeepsPolicyAndDeletesTheRest(t *testing.T) {
	for _, b := range ckpttest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			run := b.Open(t)
			states := map[int64]*ckpttest.State{}
			for _, s := range []int64{10, 20, 30, 40, 50} {
				states[s] = ckpttest.NewState(uint64(s), 4)
				ckpttest.SaveStep(t, run, s, states[s], 2)
			}
			// An abandoned save and a prefix a human put a file into.
			require.NoError(t, run.PutBytes(ctx, catalog.StepName(5)+"/rank-00000-000.data", []byte("dead"), backend.PutOptions{}))
			require.NoError(t, run.PutBytes(ctx, catalog.StepName(7)+"/README", []byte("keep me"), backend.PutOptions{}))

			// Everything looks two hours old to the planner.
			plan, err := gc.PlanRun(ctx, run, gc.Policy{KeepLast: 2, KeepEvery: 20, Grace: time.Hour}, false, time.Now().Add(2*time.Hour))
			require.NoError(t, err)
			assert.Equal(t, catalog.StepName(50), plan.NewestValid)
			assert.Equal(t, 3, plan.Deletions) // 5 (abandoned), 10, 30

			var updates []progress.Update
			res, err := gc.Execute(ctx, run, plan.Decisions, gc.Options{Concurrency: 2, Progress: func(p progress.Update) { updates = append(updates, p) }})
			require.NoError(t, err)
			require.Len(t, res.Deleted, 3)
			require.Len(t, updates, 3)
			assert.Equal(t, progress.Update{Done: 3, Total: 3, Unit: progress.Checkpoints, Item: res.Deleted[2].Name, Objects: res.Deleted[2].Objects, Bytes: res.Deleted[2].Bytes}, updates[2])
			assert.Equal(t, 1+3+3, res.ObjectsDeleted)

			left := steps(t, run)
			assert.ElementsMatch(t, []int64{7, 20, 40, 50}, keys(left))
			for _, s := range []int64{20, 40, 50} {
				ckpttest.RequireLoads(t, sub(t, run, s), states[s])
			}
			readme, err := run.ReadAll(ctx, catalog.StepName(7)+"/README", 0)
			require.NoError(t, err)
			assert.Equal(t, "keep me", string(readme))
		})
	}
}

func keys(m map[int64]catalog.Entry) []int64 {
	var out []int64
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestGCWithConcurrentWriter: a save of step 4 is in progress (data written,
// its metadata Put held back) while gc runs with keep-last 1. gc keeps the
// newest valid checkpoint and the one being written; once released, the
// save commits and loads.
func TestGCWithConcurrentWriter(t *testing.T) {
	for _, b := range ckpttest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			run := b.Open(t)
			for s := int64(1); s <= 3; s++ {
				ckpttest.SaveStep(t, run, s, ckpttest.NewState(uint64(s), 4), 2)
			}
			s3, s4 := ckpttest.NewState(3, 4), ckpttest.NewState(4, 4)

			reached, release := make(chan struct{}), make(chan struct{})
			commitKey := catalog.StepName(4) + "/" + metadata.ObjectKey
			writer := run.WithDriver(&hookDriver{Driver: run.Driver(), put: func(ctx context.Context, key string) error {
				if strings.HasSuffix(key, commitKey) {
					close(reached)
					select {
					case <-release:
					case <-ctx.Done():
						return ctx.Err()
					}
				}
				return nil
			}})
			saved := make(chan error, 1)
			go func() {
				_, err := saver.SaveLocal(ctx, sub(t, writer, 4), s4.Shard(2), saver.Options{Iteration: 4})
				saved <- err
			}()
			<-reached

			plan, err := gc.PlanRun(ctx, run, gc.Policy{KeepLast: 1, Grace: time.Hour}, false, time.Now())
			require.NoError(t, err)
			assert.Equal(t, catalog.StepName(3), plan.NewestValid)
			_, err = gc.Execute(ctx, run, plan.Decisions, gc.Options{})
			require.NoError(t, err)
			left := steps(t, run)
			assert.ElementsMatch(t, []int64{3, 4}, keys(left))
			assert.False(t, left[4].Committed)

			close(release)
			require.NoError(t, <-saved)
			ckpttest.RequireLoads(t, sub(t, run, 3), s3)
			ckpttest.RequireLoads(t, sub(t, run, 4), s4)
		})
	}
}

// TestGCInterrupted: gc is cancelled right after its first deletion. Every
// checkpoint left either loads or is uncommitted; none looks committed with
// data missing.
func TestGCInterrupted(t *testing.T) {
	for _, b := range ckpttest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			run := b.Open(t)
			states := map[int64]*ckpttest.State{}
			for s := int64(1); s <= 4; s++ {
				states[s] = ckpttest.NewState(uint64(s), 4)
				ckpttest.SaveStep(t, run, s, states[s], 3)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			plan, err := gc.PlanRun(ctx, run, gc.Policy{KeepLast: 1}, false, time.Now())
			require.NoError(t, err)
			require.Equal(t, 3, plan.Deletions)

			var deletes atomic.Int32
			gcStore := run.WithDriver(&hookDriver{Driver: run.Driver(), delete: func(ctx context.Context, key string) error {
				if err := ctx.Err(); err != nil {
					return err
				}
				if deletes.Add(1) > 1 {
					cancel()
					return context.Canceled
				}
				return nil
			}})
			_, err = gc.Execute(ctx, gcStore, plan.Decisions, gc.Options{Concurrency: 1})
			require.ErrorIs(t, err, context.Canceled)

			left := steps(t, run)
			require.Contains(t, left, int64(1), "the interrupted checkpoint keeps some data")
			assert.False(t, left[1].Committed, "metadata went first")
			for s, e := range left {
				if e.Committed {
					ckpttest.RequireLoads(t, sub(t, run, s), states[s])
				}
			}
			assert.True(t, left[4].Committed)
		})
	}
}

// TestGCSkipsPrefixChangedSincePlanning: a writer adds to an abandoned
// prefix between planning and deletion; gc leaves it alone.
func TestGCSkipsPrefixChangedSincePlanning(t *testing.T) {
	for _, b := range ckpttest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			run := b.Open(t)
			ckpttest.SaveStep(t, run, 2, ckpttest.NewState(2, 4), 1)
			require.NoError(t, run.PutBytes(ctx, catalog.StepName(1)+"/rank-00000-000.data", []byte("a"), backend.PutOptions{}))
			plan, err := gc.PlanRun(ctx, run, gc.Policy{KeepLast: 1, Grace: time.Hour}, false, time.Now().Add(2*time.Hour))
			require.NoError(t, err)
			require.Equal(t, 1, plan.Deletions)
			require.NoError(t, run.PutBytes(ctx, catalog.StepName(1)+"/rank-00001-000.data", []byte("b"), backend.PutOptions{}))
			res, err := gc.Execute(ctx, run, plan.Decisions, gc.Options{})
			require.NoError(t, err)
			assert.Empty(t, res.Deleted)
			require.Len(t, res.Skipped, 1)
			assert.Contains(t, res.Skipped[0].Reason, "changed since planning")
			assert.Equal(t, 2, steps(t, run)[1].Objects)
		})
	}
}
