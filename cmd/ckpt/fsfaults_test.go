package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

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
