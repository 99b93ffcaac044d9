package saver_test

import (
	"context"
	"errors"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

func newOverlapSaver(t *testing.T, budget int64) *saver.Saver {
	t.Helper()
	return newSaverWith(t, saver.AsyncOptions{StagingBytes: budget, Overlap: true})
}

// With Overlap, SaveAsync returns once the save is planned, while staging
// still reads the caller's buffers: a state three times the budget cannot
// be staged while its uploads are held, yet the call returns. The caller
// mutates every tensor right after Staged; the checkpoint holds the values
// of the moment of the call.
func TestOverlapReturnsBeforeStagingAndCommitsPreMutationValues(t *testing.T) {
	ctx := context.Background()
	st := store(t)
	gated, g := newGate(st, nil)
	sd := bigState(3, 12<<20+64*5, 10<<20+64*3, 4096)
	want := snapshot(sd)
	s := newOverlapSaver(t, 8<<20)

	h, err := s.SaveLocalAsync(ctx, gated, []*statedict.StateDict{sd}, saver.Options{Iteration: 7})
	require.NoError(t, err)
	require.Equal(t, saver.Staging, h.State(), "returned before the state is staged (its uploads are held)")
	select {
	case <-h.Staged():
		t.Fatal("staged although uploads are held and the state exceeds the budget")
	default:
	}
	require.Zero(t, h.Staging(), "no staging time before the state is staged")
	close(g.open)
	require.NoError(t, h.WaitStaged(ctx))
	require.Positive(t, h.Staging())
	require.LessOrEqual(t, h.Staging(), h.Elapsed())
	mutate(sd)
	res, err := h.Wait(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(7), res.Metadata.Training.Iteration)
	require.Equal(t, want, loadAll(t, st, sd))
	require.Less(t, h.Stall(), h.Elapsed(), "the call blocked for planning only")
}

// A failure while staging in the background (here: the uploads that
// staging waits on fail) surfaces on Wait and on the next save, which
// does not start; nothing is committed.
func TestOverlapStagingFailureSurfacesOnWaitAndNextSave(t *testing.T) {
	ctx := context.Background()
	run := store(t)
	st1, err := run.Sub("step-1")
	require.NoError(t, err)
	errDisk := errors.New("disk on fire")
	gated, g := newGate(st1, errDisk)
	s := newOverlapSaver(t, 8<<20)
	h, err := s.SaveLocalAsync(ctx, gated, []*statedict.StateDict{bigState(4, 12<<20, 10<<20)}, saver.Options{Iteration: 1})
	require.NoError(t, err, "the failure comes after planning")
	close(g.open)
	require.NoError(t, h.WaitStaged(ctx), "staging ends (here by failing): the buffers are free")
	_, err = h.Wait(ctx)
	require.ErrorIs(t, err, errDisk)
	require.Equal(t, saver.Failed, h.State())
	require.False(t, committed(t, st1))

	st2, err := run.Sub("step-2")
	require.NoError(t, err)
	_, err = s.SaveLocalAsync(ctx, st2, ranks(2), saver.Options{Iteration: 2})
	require.ErrorIs(t, err, errDisk, "the next save reports the failure")
	require.False(t, committed(t, st2), "and does not start")
}

// With Overlap a failure after planning is never the call's, however soon
// it comes (here the first upload fails at once): the call returns the
// handle, Wait and the next save report the failure. The call used to
// return it when the save had already ended by the time it looked, so a
// caller saw it from the call in some runs and from Wait in others, and
// the next save then started.
func TestOverlapFailureRightAfterPlanningIsWaitsAndTheNextSaves(t *testing.T) {
	ctx := context.Background()
	errDisk := errors.New("disk on fire")
	// One processor: the save goroutine then runs on from the plan to its
	// failure before the caller looks, which is when the call used to
	// return the failure (13 of 15 runs failed so).
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for i := range 40 {
		run := store(t)
		st1, err := run.Sub("step-1")
		require.NoError(t, err)
		failing, g := newGate(st1, errDisk)
		close(g.open)
		s := newOverlapSaver(t, 1<<20)
		h, err := s.SaveLocalAsync(ctx, failing, []*statedict.StateDict{bigState(6, 3<<20)}, saver.Options{Iteration: 1})
		require.NoError(t, err, "run %d: the failure comes after planning", i)
		_, err = h.Wait(ctx)
		require.ErrorIs(t, err, errDisk, "run %d", i)
		st2, err := run.Sub("step-2")
		require.NoError(t, err)
		_, err = s.SaveLocalAsync(ctx, st2, ranks(1), saver.Options{Iteration: 2})
		require.ErrorIs(t, err, errDisk, "run %d: the next save reports it", i)
		require.False(t, committed(t, st2))
	}
}

// Cancelling the save's context while staging waits aborts it: nothing is
// committed, Wait says canceled, and the buffers are released.
func TestOverlapCancelAbortsStaging(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	st := store(t)
	gated, _ := newGate(st, nil) // never opened
	s := newOverlapSaver(t, 8<<20)
	h, err := s.SaveLocalAsync(ctx, gated, []*statedict.StateDict{bigState(5, 12<<20, 10<<20)}, saver.Options{Iteration: 1})
	require.NoError(t, err)
	require.Equal(t, saver.Staging, h.State())
	cancel()
	_, err = h.Wait(context.Background())
	require.ErrorIs(t, err, context.Canceled)
	require.NoError(t, h.WaitStaged(context.Background()))
	require.False(t, committed(t, st))
}

// A save that fails before its plan (two ranks give one tensor different
// shapes) is returned by the call itself, as without Overlap.
func TestOverlapPlanFailureIsReturnedByTheCall(t *testing.T) {
	ctx := context.Background()
	st := store(t)
	a, b := statedict.New(), statedict.New()
	a.Tensors["model.w"] = statedict.Whole(statedict.NewTensor(statedict.Float32, 4))
	b.Tensors["model.w"] = statedict.Whole(statedict.NewTensor(statedict.Float32, 5))
	s := newOverlapSaver(t, 8<<20)
	h, err := s.SaveLocalAsync(ctx, st, []*statedict.StateDict{a, b}, saver.Options{})
	require.Error(t, err)
	require.Equal(t, saver.Failed, h.State())
	require.False(t, committed(t, st))
}
