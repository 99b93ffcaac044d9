package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	_ "github.com/ckptkit/ckptkit/backend/fs"
	_ "github.com/ckptkit/ckptkit/backend/mem"
	"github.com/ckptkit/ckptkit/coordinator"
)

var fast = coordinator.StoreOptions{PollInterval: time.Millisecond, MaxPollInterval: 20 * time.Millisecond}

// urls returns one fs and one mem location, each opened separately by
// every rank: the ranks share nothing but the store.
func urls(t *testing.T) map[string]string {
	return map[string]string{
		"fs":  t.TempDir(),
		"mem": "mem://coord-" + t.Name() + fmt.Sprint(time.Now().UnixNano()) + "/run",
	}
}

func open(t *testing.T, url string, group string, rank, world int) *coordinator.StoreCoordinator {
	t.Helper()
	st, err := backend.Open(context.Background(), url)
	require.NoError(t, err)
	c, err := coordinator.NewStore(st, group, rank, world, fast)
	require.NoError(t, err)
	return c
}

// each runs f for every rank of world concurrently, each rank with its
// own store opened from url.
func each(t *testing.T, url, group string, world int, f func(c *coordinator.StoreCoordinator) error) []error {
	t.Helper()
	coords := make([]*coordinator.StoreCoordinator, world)
	for r := range coords {
		coords[r] = open(t, url, group, r, world)
	}
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range coords {
		wg.Go(func() { errs[r] = f(coords[r]) })
	}
	wg.Wait()
	return errs
}

func count(t *testing.T, url, prefix string) int {
	t.Helper()
	st, err := backend.Open(context.Background(), url)
	require.NoError(t, err)
	n := 0
	require.NoError(t, st.List(context.Background(), prefix, func(backend.ObjectInfo) error { n++; return nil }))
	return n
}

func TestStoreAllGatherAndBroadcast(t *testing.T) {
	for name, url := range urls(t) {
		t.Run(name, func(t *testing.T) {
			const world, rounds = 3, 4
			ctx := context.Background()
			errs := each(t, url, "coord/step-00000012", world, func(c *coordinator.StoreCoordinator) error {
				for i := range rounds {
					vals, err := c.AllGather(ctx, fmt.Sprintf("rank %d round %d", c.Rank(), i))
					if err != nil {
						return err
					}
					for r, v := range vals {
						if want := fmt.Sprintf("rank %d round %d", r, i); v != want {
							return fmt.Errorf("rank %d round %d: vals[%d] = %v, want %q", c.Rank(), i, r, v, want)
						}
					}
					b, err := c.Broadcast(ctx, c.Rank()*100+i)
					if err != nil {
						return err
					}
					if b != i {
						return fmt.Errorf("rank %d round %d: broadcast %v, want %d", c.Rank(), i, b, i)
					}
				}
				return c.Close(ctx)
			})
			for _, err := range errs {
				require.NoError(t, err)
			}
			require.Zero(t, count(t, url, "coord/"), "rank 0's Close removes the group")
		})
	}
}

// waitForValues returns once the store at url holds n objects under
// prefix (an event of the other ranks, observed instead of slept for).
func waitForValues(url, prefix string, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := backend.Open(ctx, url)
	if err != nil {
		return err
	}
	defer st.Close()
	for {
		got := 0
		if err := st.List(ctx, prefix, func(backend.ObjectInfo) error { got++; return nil }); err != nil {
			return err
		}
		if got >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d values under %s: %w", got, n, prefix, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

func TestStoreAbortUnblocksEveryRank(t *testing.T) {
	for name, url := range urls(t) {
		t.Run(name, func(t *testing.T) {
			reason := fmt.Errorf("rank 2 cannot write: %w", backend.ErrPermission)
			errs := each(t, url, "g", 3, func(c *coordinator.StoreCoordinator) error {
				if _, err := c.AllGather(context.Background(), c.Rank()); err != nil {
					return err
				}
				if c.Rank() == 2 {
					// Abort once ranks 0 and 1 have written their values of
					// the second round: from then on they are polling it.
					if err := waitForValues(url, "g/000001/", 2); err != nil {
						return err
					}
					c.Abort(reason)
				}
				_, err := c.AllGather(context.Background(), c.Rank())
				return err
			})
			for r, err := range errs {
				require.ErrorIs(t, err, coordinator.ErrAborted, "rank %d", r)
				require.ErrorIs(t, err, backend.ErrPermission, "rank %d: the reason's class crosses the store", r)
				require.ErrorContains(t, err, "rank 2 cannot write", "rank %d", r)
				require.ErrorContains(t, err, "by rank 2", "rank %d", r)
			}
			// Later calls fail at once too.
			c := open(t, url, "g", 0, 3)
			_, err := c.Broadcast(context.Background(), 1)
			require.ErrorIs(t, err, coordinator.ErrAborted)
			st, err := backend.Open(context.Background(), url)
			require.NoError(t, err)
			require.NoError(t, coordinator.RemoveGroup(context.Background(), st, "g"))
			require.Zero(t, count(t, url, "g/"))
		})
	}
}

func TestStoreMissingRankTimesOut(t *testing.T) {
	url := t.TempDir()
	c := open(t, url, "g", 0, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.AllGather(ctx, "alone")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 2*time.Second)

	// The waiting rank aborted the group: the late rank fails at once.
	late := open(t, url, "g", 1, 2)
	start = time.Now()
	_, err = late.AllGather(context.Background(), "late")
	require.ErrorIs(t, err, coordinator.ErrAborted)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), time.Second)
}

func TestStoreCancelStopsPollingPromptly(t *testing.T) {
	st, err := backend.Open(context.Background(), t.TempDir())
	require.NoError(t, err)
	slow := fast
	slow.PollInterval, slow.MaxPollInterval = time.Second, 10*time.Second
	c, err := coordinator.NewStore(st, "g", 1, 2, slow)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	_, err = c.Broadcast(ctx, nil)
	require.ErrorIs(t, err, context.Canceled)
	require.Less(t, time.Since(start), 900*time.Millisecond)
}

func TestStoreStaleGroupIsRefused(t *testing.T) {
	url := t.TempDir()
	c := open(t, url, "g", 0, 1)
	_, err := c.AllGather(context.Background(), 1) // left behind, never closed
	require.NoError(t, err)
	again := open(t, url, "g", 0, 1)
	_, err = again.AllGather(context.Background(), 1)
	require.ErrorIs(t, err, backend.ErrAlreadyExists)
}

func TestStoreOptionsTimeout(t *testing.T) {
	st, err := backend.Open(context.Background(), t.TempDir())
	require.NoError(t, err)
	o := fast
	o.Timeout = 100 * time.Millisecond
	c, err := coordinator.NewStore(st, "g", 0, 2, o)
	require.NoError(t, err)
	_, err = c.AllGather(context.Background(), 1)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestNewStoreValidates(t *testing.T) {
	st, err := backend.Open(context.Background(), t.TempDir())
	require.NoError(t, err)
	for _, tc := range []struct {
		group       string
		rank, world int
	}{{"g", 0, 0}, {"g", 2, 2}, {"g", -1, 2}, {"", 0, 1}, {"a/../b", 0, 1}} {
		_, err := coordinator.NewStore(st, tc.group, tc.rank, tc.world, coordinator.StoreOptions{})
		require.Error(t, err, "%+v", tc)
	}
}

func TestRemoteErrorKeepsRegisteredClasses(t *testing.T) {
	err := fmt.Errorf("save: %w", fmt.Errorf("read x: %w", backend.ErrNotFound))
	re := coordinator.ToRemote(err)
	require.Equal(t, err.Error(), re.Error())
	require.ErrorIs(t, re, backend.ErrNotFound)
	require.NotErrorIs(t, re, backend.ErrPermission)
	// A received error wrapped again keeps its classes on the next hop.
	again := coordinator.ToRemote(fmt.Errorf("rank 1: %w", re))
	require.ErrorIs(t, again, backend.ErrNotFound)
	require.Nil(t, coordinator.ToRemote(nil))
	require.NoError(t, coordinator.FromRemote(nil))
	require.True(t, errors.Is(coordinator.FromRemote(re), backend.ErrNotFound))
}

func TestStoreUnencodableValueAbortsTheGroup(t *testing.T) {
	type unregistered struct{ X int }
	errs := each(t, t.TempDir(), "g", 2, func(c *coordinator.StoreCoordinator) error {
		var v any = c.Rank()
		if c.Rank() == 1 {
			v = unregistered{X: 1}
		}
		_, err := c.AllGather(context.Background(), v)
		return err
	})
	require.ErrorContains(t, errs[1], "gob.Register")
	require.ErrorIs(t, errs[0], coordinator.ErrAborted)
	require.ErrorContains(t, errs[0], "by rank 1")
}

// Regression (review): a late abort made rank 1 fail a Broadcast whose
// value rank 0 had already published (the saver's commit outcome), so the
// ranks disagreed about a committed checkpoint.
func TestBroadcastValueWinsOverLaterAbort(t *testing.T) {
	for name, url := range urls(t) {
		t.Run(name, func(t *testing.T) {
			c := []*coordinator.StoreCoordinator{open(t, url, "late-abort", 0, 3), open(t, url, "late-abort", 1, 3), open(t, url, "late-abort", 2, 3)}
			ctx := context.Background()
			v, err := c[0].Broadcast(ctx, "committed")
			require.NoError(t, err)
			require.Equal(t, "committed", v)
			c[2].Abort(errors.New("rank 2 gave up late"))
			v, err = c[1].Broadcast(ctx, nil)
			require.NoError(t, err)
			require.Equal(t, "committed", v)
		})
	}
}
