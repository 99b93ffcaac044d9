package run_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/coordinator"
	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/run"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

// saveSteps saves the state of seed = step under r for each step, sharded
// over world ranks, and returns the states.
func saveSteps(t *testing.T, st *backend.Store, world int, steps ...int64) map[int64]*ckpttest.State {
	t.Helper()
	out := map[int64]*ckpttest.State{}
	for _, s := range steps {
		out[s] = ckpttest.NewState(uint64(s), 6)
		_, err := run.New(st).SaveLocal(context.Background(), s, out[s].Shard(world), saver.Options{})
		require.NoError(t, err)
	}
	return out
}

// loadInto returns a LoadFunc loading rank's shard (of world) into fresh
// targets each call, the last of which *got receives, and counting calls.
func loadInto(s *ckpttest.State, rank, world int, got *[]*statedict.StateDict, calls *atomic.Int32) run.LoadFunc {
	return run.Into(func() []*statedict.StateDict {
		calls.Add(1)
		*got = ckpttest.Targets(s.Shard(world)[rank : rank+1])
		return *got
	}, loader.Options{})
}

// requireShard checks that got holds rank's shard of s.
func requireShard(t *testing.T, s *ckpttest.State, rank, world int, got []*statedict.StateDict) {
	t.Helper()
	want := s.Shard(world)[rank]
	for k, sh := range want.Tensors {
		require.Equal(t, sh.Data, got[0].Tensors[k].Data, "rank %d: %s", rank, k)
	}
	for k, b := range want.Bytes {
		require.Equal(t, b, got[0].Bytes[k], "rank %d: %s", rank, k)
	}
}

func whys(ss []run.Skipped) []string {
	out := []string{}
	for _, s := range ss {
		out = append(out, fmt.Sprintf("%s:%s", s.Entry.Name, s.Why))
	}
	return out
}

// fast polls the store coordinator quickly.
var fast = coordinator.StoreOptions{PollInterval: time.Millisecond, MaxPollInterval: 20 * time.Millisecond, Timeout: 2 * time.Minute}
