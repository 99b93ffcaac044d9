package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
)

// tierSteps lists the committed steps of the run at url, newest last.
func tierSteps(t *testing.T, url string) []int64 {
	t.Helper()
	st := ckpttest.OpenURL(t, url)
	es, err := catalog.List(context.Background(), st)
	require.NoError(t, err)
	var out []int64
	for _, e := range es {
		if e.Committed {
			out = append(out, e.Step)
		}
	}
	return out
}

// `ckpt train RUN --local LOCAL --persist-every 4 --save-every 2`, killed
// with SIGKILL: resume takes the local tier; with the local tier deleted,
// or the newest local step's data object cut, it takes the nearest valid
// copy behind it; every path ends with the straight run's weights. The
// durable tier is the S3 test server when it runs, else a directory.
func TestTrainLocalTierSurvivesSIGKILL(t *testing.T) {
	dir := t.TempDir()
	durable := filepath.Join(dir, "durable")
	if raw := os.Getenv(ckpttest.S3URLEnv); raw != "" {
		durable = ckpttest.WithPath(raw, fmt.Sprintf("tiers-%d", time.Now().UnixNano()))
	}
	local := filepath.Join(dir, "local")
	size := []string{"--state-size", "4MiB", "--ranks", "2"}
	cmd, _, errb := startCkpt(t, append([]string{"train", "--json", "--seed", "7", durable, "--local", local,
		"--persist-every", "4", "--save-every", "2", "--steps", "100000"}, size...)...)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if d := tierSteps(t, durable); len(d) >= 2 {
			break
		}
		require.True(t, time.Now().Before(deadline), "nothing persisted; stderr: %s", errb)
		time.Sleep(20 * time.Millisecond)
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	// A request the server received in full before the kill may still
	// complete (a persist's metadata object: then that step is committed).
	time.Sleep(200 * time.Millisecond)

	localSteps := tierSteps(t, "file://"+local)
	durableSteps := tierSteps(t, durable)
	require.LessOrEqual(t, len(localSteps), 3, "--local-keep 2 (a third may be committed before retention ran)")
	for _, s := range localSteps {
		require.Zero(t, s%2, "local commits every 2 steps")
	}
	for _, s := range durableSteps {
		require.Zero(t, s%4, "persists every 4th step")
	}
	newestLocal, newestDurable := localSteps[len(localSteps)-1], durableSteps[len(durableSteps)-1]
	t.Logf("after SIGKILL: local %v, durable %v", localSteps, durableSteps)
	require.GreaterOrEqual(t, newestLocal, newestDurable)
	total := newestLocal + 3
	steps := []string{"--steps", strconv.FormatInt(total, 10), "--save-every", "0"}
	straight := trainJSON(t, append(append([]string{filepath.Join(dir, "straight")}, steps...), size...)...)

	resume := func(local string) trainResult {
		t.Helper()
		res := trainJSON(t, append(append([]string{durable, "--resume", "--local", local}, steps...), size...)...)
		require.Equal(t, straight.WeightsSHA256, res.WeightsSHA256, "bit-identical to the straight run")
		return res
	}
	// Each scenario on its own copy of the local tier (a resume that saves
	// nothing changes neither tier).
	copyLocal := func(name string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.CopyFS(p, os.DirFS(local)))
		return p
	}

	// The --json document (persist figures included) matches the schema.
	code, out, errs := ckpt(t, append([]string{"train", "--json", "--seed", "7", filepath.Join(dir, "fig"), "--local", filepath.Join(dir, "fig-local"),
		"--save-every", "2", "--persist-every", "4", "--steps", "8"}, size...)...)
	require.Equal(t, 0, code, errs)
	validDocument(t, out)
	var fig trainResult
	require.NoError(t, json.Unmarshal([]byte(out), &fig))
	require.Equal(t, []int64{4, 8}, fig.Persist.Persisted)
	require.Zero(t, fig.Persist.Failed)
	require.Equal(t, int64(-1), fig.Persist.InFlight, "the run waited for its last persist")
	// ls and latest show both tiers.
	code, out, errs = ckpt(t, "ls", "--json", filepath.Join(dir, "fig"), "--local", filepath.Join(dir, "fig-local"))
	require.Equal(t, 0, code, errs)
	validDocument(t, out)
	var ls lsOutput
	require.NoError(t, json.Unmarshal([]byte(out), &ls))
	require.Len(t, ls.Checkpoints, 2, "durable: steps 4 and 8")
	require.Equal(t, []int64{6, 8}, []int64{ls.Local.Checkpoints[0].Step, ls.Local.Checkpoints[1].Step}, "local keeps 2")
	code, out, errs = ckpt(t, "latest", "--json", filepath.Join(dir, "fig"), "--local", filepath.Join(dir, "fig-local"))
	require.Equal(t, 0, code, errs)
	validDocument(t, out)
	var lt latestOutput
	require.NoError(t, json.Unmarshal([]byte(out), &lt))
	require.Equal(t, "local", lt.Nearest)
	require.Equal(t, int64(8), lt.Local.Checkpoint.Step)
	code, out, errs = ckpt(t, "latest", filepath.Join(dir, "fig"), "--local", filepath.Join(dir, "gone"))
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "nearest: durable")

	res := resume(copyLocal("intact"))
	require.Equal(t, "local", res.Tier, res.TierWhy)
	require.Equal(t, newestLocal, *res.ResumedFrom)

	res = resume(filepath.Join(dir, "gone"))
	require.Equal(t, "durable", res.Tier, res.TierWhy)
	require.Equal(t, newestDurable, *res.ResumedFrom)

	cut := copyLocal("cut")
	objs, err := filepath.Glob(filepath.Join(cut, catalog.StepName(newestLocal), "rank-00001-*"))
	require.NoError(t, err)
	require.NotEmpty(t, objs)
	fi, err := os.Stat(objs[0])
	require.NoError(t, err)
	require.NoError(t, os.Truncate(objs[0], fi.Size()/2))
	res = resume(cut)
	// The cut step is passed over: the next older local step when it is
	// as new as the newest durable one, else the durable one.
	if len(localSteps) > 1 && localSteps[len(localSteps)-2] >= newestDurable && newestDurable < newestLocal {
		require.Equal(t, "local", res.Tier, res.TierWhy)
		require.Equal(t, localSteps[len(localSteps)-2], *res.ResumedFrom)
	} else {
		require.Equal(t, "durable", res.Tier, res.TierWhy)
		require.Equal(t, newestDurable, *res.ResumedFrom)
	}
}

// A persist that fails is said: the run reports it in --json ("persist"),
// its error is the document's, and the exit status is not 0; the local
// tier holds every step.
func TestTrainLocalTierReportsAFailedPersist(t *testing.T) {
	dir := t.TempDir()
	durable := filepath.Join(dir, "durable")
	require.NoError(t, os.MkdirAll(durable, 0o755))
	// A file where step 4's prefix goes: its persist fails.
	require.NoError(t, os.WriteFile(filepath.Join(durable, catalog.StepName(4)), []byte("x"), 0o644))
	code, out, errs := ckpt(t, "train", "--json", durable, "--local", filepath.Join(dir, "local"), "--save-every", "2", "--persist-every", "4", "--steps", "8")
	require.NotEqual(t, 0, code, errs)
	d := validDocument(t, out)
	require.Contains(t, d.Error.Message, "1 persist(s)")
	var res trainResult
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	require.Equal(t, 1, res.Persist.Failed)
	require.Contains(t, res.Persist.Failures[0], "persist step 4")
	require.Equal(t, []int64{8}, res.Persist.Persisted)
	require.Equal(t, []int64{6, 8}, tierSteps(t, "file://"+filepath.Join(dir, "local")))
}
