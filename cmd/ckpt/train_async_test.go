package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/backend/fs"
	"github.com/ckptkit/ckptkit/catalog"
)

// The same seed gives the same weights synchronously, asynchronously with
// a staging budget smaller than the state, over 1 or 3 ranks, and when
// interrupted and resumed.
func TestTrainAsyncIsBitIdentical(t *testing.T) {
	dir := t.TempDir()
	size := []string{"--state-size", "6MiB", "--steps", "12", "--save-every", "3"}
	sync := trainJSON(t, append(size, "--url", filepath.Join(dir, "sync"))...)
	require.InDelta(t, 6<<20, sync.StateBytes, 64<<10)
	require.Zero(t, sync.StagingPeakBytes)
	require.InDelta(t, sync.SaveSeconds, sync.SaveStallSeconds, 0.05, "a sync save blocks the loop throughout")

	// Every upload of slowfs:// waits first, so a save whose state exceeds
	// the staging budget is still staging when the next step starts.
	async := trainJSON(t, append(size, "--url", "slowfs://"+filepath.ToSlash(filepath.Join(dir, "async")), "--async", "--staging-bytes", "2MiB", "--ranks", "3")...)
	require.Equal(t, sync.WeightsSHA256, async.WeightsSHA256)
	require.Len(t, async.Checkpoints, 4)
	require.Positive(t, async.StagingPeakBytes)
	require.LessOrEqual(t, async.StagingPeakBytes, int64(2<<20), "staging stays within the budget")
	for _, c := range async.Checkpoints {
		code, out, _ := ckpt(t, "verify", "--deep", c)
		require.Equal(t, 0, code, out)
	}

	// --async is --async=overlap: staging ran during the next steps'
	// forward and backward passes, waited for before their updates.
	require.Equal(t, 3, async.StepTimes.OverlappedSteps, "the steps after the saves at 3, 6 and 9 overlapped staging")
	require.Equal(t, 12, async.StepTimes.OverlappedSteps+async.StepTimes.OtherSteps)
	require.LessOrEqual(t, async.StagingWaitSeconds, async.SaveStallSeconds, "waiting for staging is stall")
	blocking := trainJSON(t, append(size, "--url", filepath.Join(dir, "blocking"), "--async=blocking", "--staging-bytes", "2MiB")...)
	require.Equal(t, sync.WeightsSHA256, blocking.WeightsSHA256)
	require.Zero(t, blocking.StepTimes.OverlappedSteps, "a blocking save is staged when the call returns")
	require.Zero(t, blocking.StagingWaitSeconds)
	code, _, errs := ckpt(t, "train", "--url", filepath.Join(dir, "bad"), "--async=later")
	require.Equal(t, 2, code, errs)
	require.Contains(t, errs, "--async=later: want overlap (a bare --async) or blocking")

	split := filepath.Join(dir, "split")
	trainJSON(t, "--url", split, "--state-size", "6MiB", "--steps", "6", "--save-every", "3", "--async")
	resumed := trainJSON(t, append(size, "--url", split, "--resume", "--async", "--ranks", "2")...)
	require.Equal(t, int64(6), *resumed.ResumedFrom)
	require.Equal(t, sync.WeightsSHA256, resumed.WeightsSHA256)
}

// slowPuts is a file-system driver whose every Put waits putDelay first:
// staging that needs uploads to free its budget then outlasts the gap
// between a save's return and the next step's start by orders of
// magnitude (TestTrainAsyncIsBitIdentical counts overlapped steps; on a
// fast disk a 6 MiB save could otherwise finish staging within that gap).
type slowPuts struct{ backend.Driver }

const putDelay = 50 * time.Millisecond

func (d slowPuts) Put(ctx context.Context, key string, size int64, r io.Reader, opts backend.PutOptions) error {
	select {
	case <-time.After(putDelay):
	case <-ctx.Done():
		return ctx.Err()
	}
	return d.Driver.Put(ctx, key, size, r, opts)
}

func init() {
	backend.MustRegister("slowfs", func(ctx context.Context, u *url.URL) (backend.Driver, string, error) {
		drv, prefix, err := fs.Open(ctx, &url.URL{Scheme: "file", Path: u.Path})
		if err != nil {
			return nil, "", err
		}
		return slowPuts{drv}, prefix, nil
	})
}

// termOnEnv names a key prefix ("step-00000004/"): the first Put of termfs://
// under it sends SIGTERM to the process (TestTrainSIGTERMDuringOverlappedStaging).
const termOnEnv = "CKPT_TEST_TERM_ON"

// termPuts is a file-system driver that signals its own process with
// SIGTERM from within the first Put under $CKPT_TEST_TERM_ON, then writes
// as usual.
type termPuts struct {
	backend.Driver
	on   string
	once *sync.Once
}

func (d termPuts) Put(ctx context.Context, key string, size int64, r io.Reader, opts backend.PutOptions) error {
	if d.on != "" && strings.HasPrefix(key, d.on) {
		d.once.Do(func() { _ = syscall.Kill(os.Getpid(), syscall.SIGTERM) })
	}
	return d.Driver.Put(ctx, key, size, r, opts)
}

func init() {
	once := new(sync.Once)
	backend.MustRegister("termfs", func(ctx context.Context, u *url.URL) (backend.Driver, string, error) {
		drv, prefix, err := fs.Open(ctx, &url.URL{Scheme: "file", Path: u.Path})
		if err != nil {
			return nil, "", err
		}
		return termPuts{Driver: drv, on: os.Getenv(termOnEnv), once: once}, prefix, nil
	})
}

// runMainEnv makes the test binary run the ckpt command line it is given,
// as main does (the child of the signal tests).
const runMainEnv = "CKPT_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		os.Exit(runMain(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// startCkpt starts `ckpt args...` as a child process.
func startCkpt(t *testing.T, args ...string) (*exec.Cmd, *bytes.Buffer, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return cmd, &out, &errb
}

// waitCommitted waits until a checkpoint under run is committed.
func waitCommitted(t *testing.T, run string, stderr *bytes.Buffer) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		if m, _ := filepath.Glob(filepath.Join(run, "step-*", "ckptkit.metadata.json")); len(m) > 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no checkpoint was committed under %s; stderr: %s", run, stderr)
}

func exitStatus(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	err := cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	require.NoError(t, err)
	return 0
}

// SIGTERM while async saves are under way: ckpt lets the save in flight
// commit, saves the current step, says where, exits 143, and the job
// resumed from that checkpoint ends bit-identical to an uninterrupted one.
func TestTrainSIGTERMSavesTheCurrentStep(t *testing.T) {
	dir := t.TempDir()
	run := filepath.Join(dir, "run")
	// Seed 7, the seed of trainJSON, which runs the resume and the
	// reference below.
	cmd, out, errb := startCkpt(t, "train", "--json", "--seed", "7", "--url", run, "--state-size", "48MiB",
		"--steps", "100000", "--save-every", "4", "--async", "--staging-bytes", "16MiB")
	waitCommitted(t, run, errb)
	time.Sleep(30 * time.Millisecond)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 143, exitStatus(t, cmd), errb.String())

	var res trainResult
	require.NoError(t, json.Unmarshal(bytes.TrimSpace(out.Bytes()), &res), out.String())
	require.Equal(t, "SIGTERM", res.Preempted)
	d := validDocument(t, out.String())
	require.Equal(t, "canceled", d.Error.Class, "the document carries the preemption as its error")
	require.Less(t, res.Step, int64(100000))
	want := filepath.Join(run, catalog.StepName(res.Step))
	require.Contains(t, errb.String(), "SIGTERM at step "+strconv.FormatInt(res.Step, 10)+": saved file://"+want)
	require.Equal(t, "file://"+want, res.Checkpoints[len(res.Checkpoints)-1])

	ctx := context.Background()
	rst, err := backend.Open(ctx, run)
	require.NoError(t, err)
	latest, _, err := catalog.Latest(ctx, rst, true)
	require.NoError(t, err)
	require.Equal(t, catalog.StepName(res.Step), latest.Name, "the current step is the newest valid checkpoint")

	total := strconv.FormatInt(res.Step+3, 10)
	resumed := trainJSON(t, "--url", run, "--resume", "--state-size", "48MiB", "--steps", total, "--save-every", "0")
	require.Equal(t, res.Step, *resumed.ResumedFrom)
	straight := trainJSON(t, "--url", filepath.Join(dir, "straight"), "--state-size", "48MiB", "--steps", total, "--save-every", "0")
	require.Equal(t, straight.WeightsSHA256, resumed.WeightsSHA256)
}

// SIGTERM while an overlapped save stages (sent from within the save's
// first upload: a 48 MiB state through a 4 MiB budget is still staging
// then, while the loop runs the next step's forward and backward): the
// step finishes, the save in flight commits, the current step is saved,
// ckpt exits 143, and every checkpoint under the run is committed and
// complete (nothing half-written).
func TestTrainSIGTERMDuringOverlappedStaging(t *testing.T) {
	run := filepath.Join(t.TempDir(), "run")
	cmd := exec.Command(os.Args[0], "train", "--json", "--seed", "7", "--url", "termfs://"+filepath.ToSlash(run),
		"--state-size", "48MiB", "--steps", "100000", "--save-every", "2", "--async", "--staging-bytes", "4MiB")
	cmd.Env = append(os.Environ(), runMainEnv+"=1", termOnEnv+"="+catalog.StepName(4)+"/")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	require.Equal(t, 143, exitStatus(t, cmd), errb.String())

	var res trainResult
	require.NoError(t, json.Unmarshal(bytes.TrimSpace(out.Bytes()), &res), out.String())
	require.Equal(t, "SIGTERM", res.Preempted)
	t.Logf("preempted at step %d, checkpoints %v", res.Step, res.Checkpoints)
	require.GreaterOrEqual(t, res.Step, int64(4), "the signal came while step 4 was staging")
	require.Less(t, res.Step, int64(100000))
	require.Contains(t, errb.String(), "SIGTERM at step "+strconv.FormatInt(res.Step, 10)+": saved termfs://")
	require.Contains(t, res.Checkpoints, "termfs://"+filepath.ToSlash(filepath.Join(run, catalog.StepName(4))),
		"the save staging when the signal came committed")

	dirs, err := filepath.Glob(filepath.Join(run, "step-*"))
	require.NoError(t, err)
	require.Len(t, dirs, len(res.Checkpoints), "a directory per committed checkpoint, no other: %v", dirs)
	for _, d := range dirs {
		code, out, _ := ckpt(t, "verify", "--deep", d)
		require.Equal(t, 0, code, "%s: %s", d, out)
	}
	ctx := context.Background()
	rst, err := backend.Open(ctx, run)
	require.NoError(t, err)
	latest, _, err := catalog.Latest(ctx, rst, true)
	require.NoError(t, err)
	require.Equal(t, catalog.StepName(res.Step), latest.Name, "the current step is the newest valid checkpoint")
}

// A second signal aborts at once: exit 130 for SIGINT, and every committed
// checkpoint under the run is complete (deep verify).
func TestTrainSecondSignalAborts(t *testing.T) {
	run := filepath.Join(t.TempDir(), "run")
	cmd, _, errb := startCkpt(t, "train", "--seed", "3", "--url", run, "--state-size", "96MiB",
		"--steps", "100000", "--save-every", "2", "--async", "--staging-bytes", "8MiB")
	waitCommitted(t, run, errb)
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	time.Sleep(5 * time.Millisecond)
	t0 := time.Now()
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	require.Equal(t, 130, exitStatus(t, cmd), errb.String())
	require.Less(t, time.Since(t0), 10*time.Second, "the second signal does not wait for saves")

	steps, _ := filepath.Glob(filepath.Join(run, "step-*", "ckptkit.metadata.json"))
	require.NotEmpty(t, steps)
	for _, m := range steps {
		code, out, _ := ckpt(t, "verify", "--deep", filepath.Dir(m))
		require.Equal(t, 0, code, "%s: %s", filepath.Dir(m), out)
	}
	require.True(t, strings.Contains(errb.String(), "SIGINT"), errb.String())
}

// Bad sizes are usage errors (exit 2), before anything is trained.
func TestTrainAsyncFlagErrors(t *testing.T) {
	dir := t.TempDir()
	code, _, errs := ckpt(t, "train", "--url", dir, "--state-size", "lots")
	require.Equal(t, 2, code, errs)
	require.Contains(t, errs, "--state-size")
	code, _, errs = ckpt(t, "train", "--url", dir, "--async", "--staging-bytes", "1000")
	require.Equal(t, 2, code, errs)
	require.Contains(t, errs, "staging budget")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, entries, "nothing was saved")
}
