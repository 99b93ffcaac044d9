package saver_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/saver"
)

// Regression (issue 16): two writers saving the same steps of one run at
// once. The loser's metadata commit was refused, but its data writes had
// already overwritten the winner's objects, so a committed checkpoint
// failed verify --deep. Each attempt now writes objects of its own: every
// step has exactly one commit, and it verifies deep and loads one writer's
// state bit for bit.
func TestConcurrentWritersNeverCorruptACommit(t *testing.T) {
	const steps = 8
	for _, b := range ckpttest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			run := b.Open(t)
			states := []*ckpttest.State{ckpttest.NewState(3, 16), ckpttest.NewState(4, 16)}
			wins := make([][]bool, len(states))
			for w := range wins {
				wins[w] = make([]bool, steps)
			}
			for step := range int64(steps) {
				st, err := run.Sub(catalog.StepName(step))
				require.NoError(t, err)
				var wg sync.WaitGroup
				start := make(chan struct{})
				errs := make([]error, len(states))
				for w, s := range states {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						_, errs[w] = saver.SaveLocal(ctx, st, s.Shard(2), saver.Options{Iteration: step})
					}()
				}
				close(start)
				wg.Wait()
				n := 0
				for w, err := range errs {
					if err == nil {
						wins[w][step] = true
						n++
						continue
					}
					require.ErrorIs(t, err, saver.ErrCommitted, "writer %d step %d", w, step)
				}
				require.Equal(t, 1, n, "step %d: exactly one commit (errors %v)", step, errs)
			}
			for step := range int64(steps) {
				st, err := run.Sub(catalog.StepName(step))
				require.NoError(t, err)
				c, err := loader.Open(ctx, st)
				require.NoError(t, err)
				rep, err := c.Verify(ctx, loader.VerifyOptions{Deep: true})
				require.NoError(t, err)
				require.True(t, rep.Resumable, "step %d: %d problem(s), first %v", step, len(rep.Problems), firstProblem(rep))
				winner := states[0]
				if wins[1][step] {
					winner = states[1]
				}
				ckpttest.RequireLoads(t, st, winner)
			}
		})
	}
}

func firstProblem(rep *loader.VerifyReport) string {
	if len(rep.Problems) == 0 {
		return ""
	}
	return rep.Problems[0].Message
}
