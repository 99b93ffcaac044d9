package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend/fs"
)

// mount runs mount(8) with args onto dir and unmounts it at cleanup; the
// test skips, saying why, when this process may not mount.
func mount(t *testing.T, dir string, args ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a file system needs root")
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	out, err := exec.Command("mount", append(args, dir)...).CombinedOutput()
	if err != nil {
		t.Skipf("mount %v not permitted here: %v: %s", args, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
}

// tempFiles lists the fs driver's temporary files below dir.
func tempFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	require.NoError(t, filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if errors.Is(err, os.ErrNotExist) {
			return nil // not created yet, or removed meanwhile
		}
		if err == nil && strings.HasPrefix(d.Name(), fs.TempPrefix) {
			out = append(out, p)
		}
		return err
	}))
	return out
}

// Issue 30: a full file system made train exit 10 ("a bug, please report
// it"). On a real 64 MiB tmpfs, a save that does not fit exits 4 (access:
// storage refuses it), naming the path and saying to free space, and
// leaves no temporary file behind; the run's earlier checkpoint stays
// listed and resumable.
func TestFullFileSystemIsAccessWithAHint(t *testing.T) {
	mnt := filepath.Join(t.TempDir(), "tmpfs")
	mount(t, mnt, "-t", "tmpfs", "-o", "size=64m", "tmpfs")
	run := filepath.Join(mnt, "run")
	trainJSON(t, "--url", run, "--steps", "1", "--save-every", "1", "--state-size", "40MiB")

	// The second checkpoint does not fit beside the first.
	code, out, errs := ckpt(t, "train", "--url", run, "--steps", "2", "--save-every", "1", "--resume", "--state-size", "40MiB")
	require.Equal(t, 4, code, "%s%s", out, errs)
	require.Contains(t, errs, "no space left on device")
	require.Contains(t, errs, "free space there")
	require.Contains(t, errs, mnt, "the message names the path")
	require.NotContains(t, errs, "report it")
	require.Empty(t, tempFiles(t, mnt), "a failed Put removes its temporary file")

	code, out, errs = ckpt(t, "latest", run)
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "step 1")
}

// Issue 30: a read-only file system made train exit 10. On a read-only
// ext4 loop mount holding a run, ls, latest and the resume's reads work;
// the next save exits 4 naming the path and saying to remount read-write.
func TestReadOnlyFileSystemIsAccessWithAHint(t *testing.T) {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("mkfs.ext4 not installed")
	}
	base := t.TempDir()
	img := filepath.Join(base, "fs.img")
	require.NoError(t, os.WriteFile(img, nil, 0o644))
	require.NoError(t, os.Truncate(img, 64<<20))
	out, err := exec.Command("mkfs.ext4", "-q", "-F", img).CombinedOutput()
	require.NoError(t, err, "%s", out)
	mnt := filepath.Join(base, "mnt")
	mount(t, mnt, "-o", "loop", img)
	run := filepath.Join(mnt, "run")
	trainJSON(t, "--url", run, "--steps", "2", "--save-every", "2")
	out, err = exec.Command("mount", "-o", "remount,ro", mnt).CombinedOutput()
	require.NoError(t, err, "%s", out)

	code, sout, errs := ckpt(t, "ls", run)
	require.Equal(t, 0, code, errs)
	require.Contains(t, sout, "step-00000002")
	code, _, errs = ckpt(t, "train", "--url", run, "--steps", "4", "--save-every", "2", "--resume")
	require.Equal(t, 4, code, errs)
	require.Contains(t, errs, "resumed from")
	require.Contains(t, errs, "read-only file system")
	require.Contains(t, errs, "remount it read-write")
	require.Contains(t, errs, mnt)
}

// unprivileged runs the ckpt binary bin as root without the capabilities
// that bypass file permissions, so a mode-000 directory is really
// unreadable to it; it skips when setpriv cannot.
func unprivileged(t *testing.T, bin string, args ...string) (int, string, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to drop CAP_DAC_OVERRIDE")
	}
	sp, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("setpriv not installed")
	}
	cmd := exec.Command(sp, append([]string{"--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all", bin}, args...)...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return code, out.String(), errb.String()
}

// Issue 30: one unreadable step directory made ls, latest and train
// --resume fail outright. It is now a checkpoint listed as unreadable with
// its reason, skipped by latest and resume (which take the newest readable
// one), and kept by gc.
func TestUnreadableCheckpointIsSkippedNotAFailedListing(t *testing.T) {
	bin := buildCkpt(t)
	run := filepath.Join(t.TempDir(), "run")
	trainJSON(t, "--url", run, "--steps", "3", "--save-every", "1")
	for _, step := range []string{"step-00000001", "step-00000003"} {
		dir := filepath.Join(run, step)
		require.NoError(t, os.Chmod(dir, 0))
		t.Cleanup(func() { _ = os.Chmod(dir, 0o755) })
	}
	if code, _, _ := unprivileged(t, "/bin/ls", filepath.Join(run, "step-00000003")); code == 0 {
		t.Skip("a mode-000 directory is still readable without CAP_DAC_OVERRIDE here")
	}

	code, out, errs := unprivileged(t, bin, "ls", run, "--json")
	require.Equal(t, 0, code, errs)
	var ls lsOutput
	require.NoError(t, json.Unmarshal([]byte(out), &ls))
	require.Len(t, ls.Checkpoints, 3)
	for i, c := range ls.Checkpoints {
		if i == 1 {
			require.Empty(t, c.Unreadable)
			require.True(t, c.Committed)
			continue
		}
		require.Contains(t, c.Unreadable, "permission denied", c.Name)
		require.Contains(t, c.Unreadable, c.Name, "the reason names the path")
	}
	code, out, errs = unprivileged(t, bin, "ls", run)
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "unreadable")

	code, out, errs = unprivileged(t, bin, "latest", run)
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "step 2")
	require.Contains(t, errs, "skipped step-00000003: unreadable")

	code, _, errs = unprivileged(t, bin, "train", "--url", run, "--steps", "4", "--save-every", "2", "--resume")
	require.Equal(t, 0, code, errs)
	require.Contains(t, errs, "resumed from")
	require.Contains(t, errs, "step-00000002")
	require.Contains(t, errs, "step-00000003: unreadable")

	code, _, errs = unprivileged(t, bin, "copy", run, filepath.Join(t.TempDir(), "copy"))
	require.Equal(t, 0, code, errs)
	require.Contains(t, errs, "skipping step-00000001: unreadable")

	code, out, errs = unprivileged(t, bin, "gc", run, "--keep-last", "1", "--grace", "0s")
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "unreadable")
	_, err := os.Lstat(filepath.Join(run, "step-00000001"))
	require.NoError(t, err, "gc keeps what it cannot read")
	_, err = os.Lstat(filepath.Join(run, "step-00000002"))
	require.ErrorIs(t, err, os.ErrNotExist, "and deletes what the policy does not keep")

	// Every checkpoint unreadable: resume refuses to start over.
	require.NoError(t, os.Chmod(filepath.Join(run, "step-00000004"), 0))
	t.Cleanup(func() { _ = os.Chmod(filepath.Join(run, "step-00000004"), 0o755) })
	code, _, errs = unprivileged(t, bin, "train", "--url", run, "--steps", "6", "--save-every", "2", "--resume")
	require.Equal(t, 4, code, errs)
	require.NotContains(t, errs, "fresh start")
	code, _, errs = unprivileged(t, bin, "latest", run)
	require.Equal(t, 4, code, errs)
}

// killMidSave starts `bin train` with args and SIGKILLs it once a
// temporary file under dir/step holds data: a save cut short.
func killMidSave(t *testing.T, bin, dir, step string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	require.NoError(t, cmd.Start())
	killAt(t, cmd, dir, step, func() { require.NoError(t, cmd.Process.Signal(syscall.SIGKILL)) })
}

// killAt waits until a temporary file under dir/step holds data, calls
// kill, and waits for cmd (started) to end; it returns cmd's error.
func killAt(t *testing.T, cmd *exec.Cmd, dir, step string, kill func()) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	deadline := time.After(2 * time.Minute)
	for {
		select {
		case err := <-done:
			t.Fatalf("train ended (%v) before a temporary file of %s appeared", err, step)
			return err
		case <-deadline:
			_ = cmd.Process.Kill()
			t.Fatalf("no temporary file of %s within 2 minutes", step)
			return nil
		case <-time.After(2 * time.Millisecond):
		}
		for _, p := range tempFiles(t, filepath.Join(dir, step)) {
			if fi, err := os.Stat(p); err == nil && fi.Size() > 0 {
				kill()
				return <-done
			}
		}
	}
}

// tempBytes totals the temporary files below dir.
func tempBytes(t *testing.T, dir string) int64 {
	var n int64
	for _, p := range tempFiles(t, dir) {
		fi, err := os.Stat(p)
		require.NoError(t, err)
		n += fi.Size()
	}
	return n
}

// Issue 30: a SIGKILLed save left full-size .ckptkit-tmp-* files that ls
// and gc never saw and resume left behind. ls counts them, gc removes those
// older than --grace, and the next save into the same step directory
// removes those of the dead process itself.
func TestKilledSaveTempFilesAreListedAndRemoved(t *testing.T) {
	bin := buildCkpt(t)
	run := filepath.Join(t.TempDir(), "run")
	train := []string{"train", "--url", run, "--steps", "2", "--save-every", "1", "--state-size", "256MiB"}
	killMidSave(t, bin, run, "step-00000002", train...)
	left := tempFiles(t, run)
	require.NotEmpty(t, left)
	size := tempBytes(t, run)

	code, out, errs := ckpt(t, "ls", run, "--json")
	require.Equal(t, 0, code, errs)
	var ls lsOutput
	require.NoError(t, json.Unmarshal([]byte(out), &ls))
	require.NotNil(t, ls.Uploads)
	require.Equal(t, len(left), ls.Uploads.Count)
	require.Equal(t, size, ls.Uploads.Bytes)
	code, out, errs = ckpt(t, "ls", run)
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, fmt.Sprintf("%d incomplete upload(s), %s", len(left), humanBytes(size)))

	// The resume saves step 2 again: the dead writer's files go.
	code, _, errs = ckpt(t, append(train, "--resume")...)
	require.Equal(t, 0, code, errs)
	require.Empty(t, tempFiles(t, run), "the next save of the step removed the killed one's temporary files")

	// Killed again; gc keeps them within --grace and removes them after.
	killMidSave(t, bin, run, "step-00000003", "train", "--url", run, "--steps", "3", "--save-every", "1", "--state-size", "256MiB", "--resume")
	left = tempFiles(t, run)
	require.NotEmpty(t, left)
	code, out, errs = ckpt(t, "gc", run, "--keep-last", "5", "--json")
	require.Equal(t, 0, code, errs)
	require.Equal(t, left, tempFiles(t, run), "younger than the default grace (1h): kept")
	var plan gcOutput
	require.NoError(t, json.Unmarshal([]byte(out), &plan))
	require.Empty(t, plan.Uploads)
	code, out, errs = ckpt(t, "gc", run, "--keep-last", "5", "--grace", "0s")
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, fmt.Sprintf("aborted %d incomplete upload(s)", len(left)))
	require.Empty(t, tempFiles(t, run))
	_, err := os.Stat(filepath.Join(run, "step-00000003"))
	require.ErrorIs(t, err, os.ErrNotExist, "the killed save's step directory, left empty, goes too")
	code, _, errs = ckpt(t, "latest", run)
	require.Equal(t, 0, code, errs)
}

// A crashed fs plugin (SIGKILLed mid-save) leaves its temporary files in
// the run's directory, where gc of the directory's path finds and removes
// them.
func TestCrashedFsPluginTempFilesAreRemovedByGC(t *testing.T) {
	bin := buildCkpt(t)
	plugins := t.TempDir()
	out, err := exec.Command("go", "build", "-o", filepath.Join(plugins, "fsplugin"), "github.com/ckptkit/ckptkit/plugins/examples/fsplugin").CombinedOutput()
	require.NoError(t, err, "build fsplugin: %s", out)
	run := filepath.Join(t.TempDir(), "run")
	cmd := exec.Command(bin, "--plugin-dir", plugins, "train", "--url", "localdir://"+run, "--steps", "1", "--save-every", "1", "--state-size", "256MiB")
	var errb strings.Builder
	cmd.Stderr = &errb
	require.NoError(t, cmd.Start())
	_ = killAt(t, cmd, run, "step-00000001", func() {
		pids, err := exec.Command("pgrep", "-P", strconv.Itoa(cmd.Process.Pid), "fsplugin").Output()
		require.NoError(t, err, "the plugin process")
		for _, f := range strings.Fields(string(pids)) {
			pid, err := strconv.Atoi(f)
			require.NoError(t, err)
			require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
		}
	})
	t.Logf("train after the plugin's crash: %s", errb.String())
	require.Contains(t, errb.String(), "plugin process exited during the write")
	left := tempFiles(t, run)
	require.NotEmpty(t, left, "the write is not replayed: the dead plugin's file stays")
	code, out2, errs := ckpt(t, "ls", run)
	require.Equal(t, 0, code, errs)
	require.Contains(t, out2, fmt.Sprintf("%d incomplete upload(s)", len(left)))
	code, out2, errs = ckpt(t, "gc", run, "--keep-last", "1", "--grace", "0s")
	require.Equal(t, 0, code, errs)
	require.Contains(t, out2, fmt.Sprintf("aborted %d incomplete upload(s)", len(left)))
	require.Empty(t, tempFiles(t, run))
}

// The fs plugin's refusal crosses the plugin protocol: a full tmpfs behind
// localdir:// is the same access error (exit 4) with the same hint.
func TestFullFileSystemThroughThePlugin(t *testing.T) {
	plugins := t.TempDir()
	out, err := exec.Command("go", "build", "-o", filepath.Join(plugins, "fsplugin"), "github.com/ckptkit/ckptkit/plugins/examples/fsplugin").CombinedOutput()
	require.NoError(t, err, "build fsplugin: %s", out)
	mnt := filepath.Join(t.TempDir(), "tmpfs")
	mount(t, mnt, "-t", "tmpfs", "-o", "size=64m", "tmpfs")
	code, sout, errs := ckpt(t, "--plugin-dir", plugins, "train", "--url", "localdir://"+mnt+"/run", "--steps", "1", "--save-every", "1", "--state-size", "100MiB")
	require.Equal(t, 4, code, "%s%s", sout, errs)
	require.Contains(t, errs, "no space left on device")
	require.Contains(t, errs, "free space there")
	require.Contains(t, errs, mnt)
	require.Empty(t, tempFiles(t, mnt))
}
