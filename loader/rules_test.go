package loader_test

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

func tensor(shape ...int64) *statedict.Shard {
	t := statedict.NewTensor(statedict.Float32, shape...)
	for i := range t.Data {
		t.Data[i] = byte(i + 1)
	}
	return statedict.Whole(t)
}

func zeros(shape ...int64) *statedict.Shard {
	return statedict.Whole(statedict.NewTensor(statedict.Float32, shape...))
}

func saveOne(t *testing.T, name string, sd *statedict.StateDict, opts saver.Options) *backend.Store {
	t.Helper()
	st, err := backend.Open(context.Background(), "mem://"+name+"/ck")
	require.NoError(t, err)
	_, err = saver.SaveLocal(context.Background(), st, []*statedict.StateDict{sd}, opts)
	require.NoError(t, err)
	return st
}

func adamTarget(sd *statedict.StateDict, prefix, fqn string, shape ...int64) {
	sd.Tensors[statedict.StateKey(prefix, fqn, statedict.SlotStep)] = zeros()
	sd.Tensors[statedict.StateKey(prefix, fqn, statedict.SlotExpAvg)] = zeros(shape...)
	sd.Tensors[statedict.StateKey(prefix, fqn, statedict.SlotExpAvgSq)] = zeros(shape...)
}

// Regression (review): a checkpoint whose optimizer lives under another
// prefix records "none" for the default prefix; loading a target that asks
// for optimizer state silently reset the optimizer.
func TestRecordNoneDoesNotSilentlyResetTheOptimizer(t *testing.T) {
	sd := statedict.New()
	sd.Tensors["model.w"] = tensor(2)
	sd.Tensors["optim.state.w.step"] = tensor()
	sd.Tensors["optim.state.w.exp_avg"] = tensor(2)
	sd.Tensors["optim.state.w.exp_avg_sq"] = tensor(2)
	st := saveOne(t, "none-record", sd, saver.Options{})

	target := statedict.New()
	target.Tensors["model.w"] = zeros(2)
	adamTarget(target, "optimizer", "w", 2)
	_, err := loader.Load(context.Background(), st, []*statedict.StateDict{target}, loader.Options{Logger: quiet()})
	require.ErrorIs(t, err, loader.ErrMissingKeys)
	require.Contains(t, err.Error(), "NoLoadOptimizer")

	rep, err := loader.Load(context.Background(), st, []*statedict.StateDict{target}, loader.Options{NoLoadOptimizer: true, Logger: quiet()})
	require.NoError(t, err)
	require.False(t, rep.OptimizerLoaded)
	require.Equal(t, tensor(2).Data, target.Tensors["model.w"].Data)
}

// Regression (review): a target whose parameters are all lazily absent
// (a rank holding only unrouted experts) was refused as a layout mismatch
// although the checkpoint's state belongs to its own other parameters.
func TestAllLazyTargetWithMatchingLayoutLoads(t *testing.T) {
	sd := statedict.New()
	sd.Tensors["model.a"] = tensor(2)
	sd.Tensors["model.b"] = tensor(3)
	sd.Tensors["optimizer.state.a.step"] = tensor()
	sd.Tensors["optimizer.state.a.exp_avg"] = tensor(2)
	sd.Tensors["optimizer.state.a.exp_avg_sq"] = tensor(2)
	st := saveOne(t, "all-lazy", sd, saver.Options{})

	target := statedict.New()
	target.Tensors["model.b"] = zeros(3)
	adamTarget(target, "optimizer", "b", 3)
	rep, err := loader.Load(context.Background(), st, []*statedict.StateDict{target}, loader.Options{Logger: quiet()})
	require.NoError(t, err)
	require.Equal(t, []string{"b"}, rep.LazyParams)
}

// failReadsAfter fails every data read after the first n.
type failReadsAfter struct {
	backend.Driver
	n, after int64
}

func (f *failReadsAfter) NewRangeReader(ctx context.Context, k string, o, l int64) (io.ReadCloser, error) {
	if atomic.AddInt64(&f.n, 1) > f.after {
		return nil, errors.New("injected read failure")
	}
	return f.Driver.NewRangeReader(ctx, k, o, l)
}

// Regression (review): a read failure in the copy pass of verify-then-copy
// left the targets partly filled without saying so.
func TestCopyPassFailureSaysTargetsArePartlyFilled(t *testing.T) {
	st, full := modesState(t, "copy-pass-fail")
	opts := loader.Options{Transactional: true, StagingLimit: 1, MaxReadBytes: 4096, Concurrency: 1, Logger: quiet()}
	counter := &failReadsAfter{Driver: st.Driver(), after: 1 << 40}
	rep, err := loader.Load(context.Background(), st.WithDriver(counter), modesTargets(full, 2), opts)
	require.NoError(t, err)
	perPass := int64(rep.ReadRequests / 2)

	failing := &failReadsAfter{Driver: st.Driver(), after: 1 + perPass + perPass/2}
	_, err = loader.Load(context.Background(), st.WithDriver(failing).WithRetry(backend.RetryPolicy{Attempts: 1}), modesTargets(full, 2), opts)
	require.ErrorIs(t, err, loader.ErrTargetsPartlyFilled)

	// A failure in the verify pass still leaves the targets untouched.
	failing = &failReadsAfter{Driver: st.Driver(), after: 1 + perPass/2}
	targets := modesTargets(full, 2)
	_, err = loader.Load(context.Background(), st.WithDriver(failing).WithRetry(backend.RetryPolicy{Attempts: 1}), targets, opts)
	require.Error(t, err)
	require.NotErrorIs(t, err, loader.ErrTargetsPartlyFilled)
	for _, sd := range targets {
		for k, s := range sd.Tensors {
			require.Equal(t, make([]byte, len(s.Data)), s.Data, "%s modified by a load that failed in the verify pass", k)
		}
	}
}
