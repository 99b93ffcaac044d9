package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

// Issue 17's data-loss trap: a fresh train into a run holding another
// run's steps 3..12 replaced 3 and 6, kept 9 and 12, and exited 0.
func TestTrainRefusesToReplaceAnotherRunsCheckpoints(t *testing.T) {
	run := filepath.Join(t.TempDir(), "run")
	first := trainJSON(t, run, "--steps", "12", "--save-every", "3")
	md := filepath.Join(run, "step-00000003", "ckptkit.metadata.json")
	before, err := os.ReadFile(md)
	require.NoError(t, err)

	code, out, errs := ckpt(t, "train", run, "--steps", "6", "--seed", "5")
	require.Equal(t, 6, code, "conflict: %s", errs)
	require.Empty(t, out)
	require.Contains(t, errs, "4 checkpoint(s)")
	require.Contains(t, errs, "--resume")
	require.Contains(t, errs, "--force")
	after, err := os.ReadFile(md)
	require.NoError(t, err)
	require.Equal(t, before, after, "nothing was written")

	code, _, errs = ckpt(t, "train", "--url", run, "--steps", "6", "--seed", "5", "--json")
	require.Equal(t, 6, code, "--url is the same argument: %s", errs)

	code, _, errs = ckpt(t, "train", run, "--url", filepath.Join(run, "x"), "--steps", "6")
	require.Equal(t, 2, code, "two different URLs: %s", errs)
	code, _, errs = ckpt(t, "train", run, "--steps", "6", "--resume", "--force")
	require.Equal(t, 2, code, errs)

	// --resume past the target: says so, exits 0, no made-up loss.
	code, out, errs = ckpt(t, "train", run, "--steps", "5", "--resume", "--json", "--seed", "7")
	require.Equal(t, 0, code, errs)
	var res trainResult
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	require.Equal(t, int64(12), res.Step)
	require.Contains(t, res.Note, "already at step 12")
	require.Equal(t, first.WeightsSHA256, res.WeightsSHA256, "the restored weights")
	require.NotContains(t, out, `"loss"`)
	code, out, _ = ckpt(t, "train", run, "--steps", "5", "--resume", "--seed", "7")
	require.Equal(t, 0, code)
	require.Contains(t, out, "nothing to train")
	require.NotContains(t, out, "loss")

	// --force replaces the steps it saves.
	forced := trainJSON(t, run, "--steps", "6", "--save-every", "3", "--seed", "5", "--force")
	require.Len(t, forced.Checkpoints, 2)
	after, err = os.ReadFile(md)
	require.NoError(t, err)
	require.NotEqual(t, before, after)
}

func TestConvertAndCopyRefuseToOverwriteWithoutForce(t *testing.T) {
	dir := t.TempDir()
	run := filepath.Join(dir, "run")
	trainJSON(t, run, "--steps", "3", "--save-every", "3")
	src := filepath.Join(run, "step-00000003")
	for _, to := range []string{"safetensors", "ckptkit"} {
		dst := filepath.Join(dir, to)
		code, _, errs := ckpt(t, "convert", src, dst, "--to", to)
		require.Equal(t, 0, code, errs)
		code, _, errs = ckpt(t, "convert", src, dst, "--to", to)
		require.Equal(t, 6, code, "%s onto its own output: %s", to, errs)
		require.Contains(t, errs, "pass --force")
		require.NotContains(t, errs, "pass Overwrite", "no flag the CLI does not have")
		code, _, errs = ckpt(t, "convert", src, dst, "--to", to, "--force")
		require.Equal(t, 0, code, errs)
	}
	dst := filepath.Join(dir, "copy")
	code, _, errs := ckpt(t, "copy", src, dst)
	require.Equal(t, 0, code, errs)
	code, _, errs = ckpt(t, "copy", src, dst)
	require.Equal(t, 6, code, errs)
	require.Contains(t, errs, "--force")
	code, _, errs = ckpt(t, "copy", "--force", src, dst)
	require.Equal(t, 0, code, errs)
}

// A typo'd path is "no such path" with the URL and exit 3, not a bad
// checkpoint (verify said [uncommitted], ls exited 0).
func TestMissingPathIsNotFound(t *testing.T) {
	dir := t.TempDir()
	trainJSON(t, filepath.Join(dir, "run"), "--steps", "3", "--save-every", "3")
	for _, u := range []string{filepath.Join(dir, "run-typo"), "mem://nothing/here"} {
		for _, c := range []string{"ls", "latest", "inspect", "verify"} {
			code, out, errs := ckpt(t, c, u)
			require.Equal(t, 3, code, "%s %s: %s%s", c, u, out, errs)
			require.Contains(t, errs, "no such path: ")
			require.Contains(t, errs, filepath.Base(u))
			require.NotContains(t, out+errs, "uncommitted")
		}
	}
	step := filepath.Join(dir, "run", "step-00000003")
	typo := filepath.Join(dir, "run", "step-0000003")
	for _, args := range [][]string{
		{"copy", typo, filepath.Join(dir, "dst")},
		{"diff", step, typo},
		{"convert", typo, filepath.Join(dir, "st"), "--to", "safetensors"},
		{"gc", filepath.Join(dir, "run-typo"), "--keep-last", "1"},
	} {
		code, out, errs := ckpt(t, args...)
		require.Equal(t, 3, code, "%v: %s%s", args, out, errs)
		require.Contains(t, errs, "no such path: ")
	}

	code, out, _ := ckpt(t, "ls", "--json", filepath.Join(dir, "run-typo"))
	require.Equal(t, 3, code)
	d := validDocument(t, out)
	require.Equal(t, "not-found", d.Error.Class)
	require.Equal(t, "file://"+filepath.Join(dir, "run-typo"), d.Error.URL)

	// The run itself exists: ls lists it, latest finds its checkpoint.
	code, out, _ = ckpt(t, "ls", filepath.Join(dir, "run"))
	require.Equal(t, 0, code)
	require.Contains(t, out, "step-00000003")
}

func TestShallowVerifySaysWhatItDidNotCheck(t *testing.T) {
	run := filepath.Join(t.TempDir(), "run")
	trainJSON(t, run, "--steps", "3", "--save-every", "3")
	step := filepath.Join(run, "step-00000003")
	data := dataObject(t, step, 0)
	b, err := os.ReadFile(data)
	require.NoError(t, err)
	b[len(b)/2] ^= 0x01
	require.NoError(t, os.WriteFile(data, b, 0o644))
	code, out, _ := ckpt(t, "verify", step)
	require.Equal(t, 0, code, "sizes and metadata are fine")
	require.Contains(t, out, "--deep reads every byte")
	code, out, _ = ckpt(t, "verify", "--deep", step)
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "checksum")
}

func TestVersion(t *testing.T) {
	code, out, errs := ckpt(t, "--version")
	require.Equal(t, 0, code, errs)
	require.Regexp(t, `^ckpt \S+ \(module github\.com/ckptkit/ckptkit, commit \S+\)\n$`, out)

	// The binary as make build links it: the commit it is given.
	if testing.Short() {
		return
	}
	bin := filepath.Join(t.TempDir(), "ckpt")
	build, err := exec.Command("go", "build", "-ldflags", "-X main.commit=0123456789abcdef", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", build)
	v, err := exec.Command(bin, "--version").Output()
	require.NoError(t, err)
	require.Contains(t, string(v), "commit 0123456789ab)")
}

func TestEveryCommandHasExamplesAndTheHelpTopicsExist(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden || c.Name() == "help" || c.Name() == "completion" {
			return
		}
		require.NotEmpty(t, c.Example, "ckpt %s has no Examples", commandName(c))
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	root := newRootCmd(&invocation{})
	root.InitDefaultCompletionCmd()
	walk(root)
	for _, topic := range []string{"urls", "env"} {
		code, out, errs := ckpt(t, "help", topic)
		require.Equal(t, 0, code, errs)
		require.Contains(t, out, "Examples:")
	}
	code, out, _ := ckpt(t, "help", "copy")
	require.Equal(t, 0, code)
	require.Contains(t, out, "Examples:")
	code, out, errs := ckpt(t, "completion", "bash")
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "bash completion")
}

func TestDurationsSuggestDays(t *testing.T) {
	run := filepath.Join(t.TempDir(), "run")
	trainJSON(t, run, "--steps", "3", "--save-every", "3")
	code, _, errs := ckpt(t, "gc", run, "--keep-last", "1", "--older-than", "7days")
	require.Equal(t, 2, code)
	require.Contains(t, errs, "7d")
	code, _, errs = ckpt(t, "gc", run, "--keep-last", "1", "--older-than", "7d", "--dry-run", "--parallel", "2")
	require.Equal(t, 0, code, errs)
}

func TestStalePluginDirNamesTheVariable(t *testing.T) {
	t.Setenv("CKPTKIT_PLUGIN_DIR", filepath.Join(t.TempDir(), "gone"))
	code, _, errs := ckpt(t, "ls", t.TempDir())
	require.Equal(t, 2, code)
	require.Contains(t, errs, "$CKPTKIT_PLUGIN_DIR=")
}

// Keys holding terminal escapes and bidi overrides reach the terminal
// escaped, in every command's human output; --json keeps them exact.
func TestHostileKeysAreEscapedInHumanOutput(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	hostile := "model.w\x1b[2J\x1b]0;pwned\x07\u202egnp.exe\r"
	sd := statedict.New()
	sd.Tensors[hostile] = &statedict.Shard{DType: statedict.Float32, GlobalShape: []int64{2}, Offsets: []int64{0}, Sizes: []int64{2}, Data: make([]byte, 8)}
	sd.Bytes["scheduler.\u2066note\u2069"] = []byte("x")
	st, err := backend.Open(ctx, filepath.Join(dir, "run", "step-00000001"))
	require.NoError(t, err)
	_, err = saver.SaveLocal(ctx, st, []*statedict.StateDict{sd}, saver.Options{Iteration: 1})
	require.NoError(t, err)
	step := filepath.Join(dir, "run", "step-00000001")
	other := filepath.Join(dir, "other")
	require.NoError(t, os.MkdirAll(other, 0o755))
	sd2 := statedict.New()
	sd2.Tensors["model.plain"] = sd.Tensors[hostile]
	st2, err := backend.Open(ctx, other)
	require.NoError(t, err)
	_, err = saver.SaveLocal(ctx, st2, []*statedict.StateDict{sd2}, saver.Options{Iteration: 1})
	require.NoError(t, err)

	for _, args := range [][]string{
		{"inspect", step},
		{"inspect", "--hash", filepath.Join(dir, "run")},
		{"diff", step, other},
		{"verify", "--deep", step},
		{"ls", filepath.Join(dir, "run")},
	} {
		_, out, errs := ckpt(t, args...)
		for _, bad := range []string{"\x1b", "\x07", "\r", "\u202e", "\u2066"} {
			require.NotContains(t, out+errs, bad, "ckpt %v", args)
		}
		if args[0] == "inspect" || args[0] == "diff" {
			require.Contains(t, out, `model.w\x1b[2J\x1b]0;pwned\x07\u202egnp.exe\x0d`, "ckpt %v", args)
		}
	}
	_, out, _ := ckpt(t, "inspect", "--json", step)
	var doc inspectOutput
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	require.Equal(t, hostile, doc.Tensors[0].Key, "--json carries the exact key")
	require.True(t, strings.HasPrefix(doc.Values[0].Key, "scheduler."))
}

// latest with nothing valid: no zero-valued checkpoint in the JSON, an
// error instead; exit 3 when nothing is committed, 1 when the committed
// ones all fail verification.
func TestLatestWithoutAValidCheckpoint(t *testing.T) {
	run := filepath.Join(t.TempDir(), "run")
	trainJSON(t, run, "--steps", "3", "--save-every", "3")
	md := filepath.Join(run, "step-00000003", "ckptkit.metadata.json")
	data := dataObject(t, filepath.Join(run, "step-00000003"), 0)
	require.NoError(t, os.Truncate(data, 10))

	code, out, _ := ckpt(t, "latest", "--json", run)
	require.Equal(t, 1, code, out)
	d := validDocument(t, out)
	require.Equal(t, "bad-checkpoint", d.Error.Class)
	require.NotContains(t, out, `"checkpoint"`)
	require.Contains(t, out, `"skipped":[{"name":"step-00000003"`)

	require.NoError(t, os.Remove(md))
	code, out, _ = ckpt(t, "latest", "--json", run)
	require.Equal(t, 3, code, out)
	require.Equal(t, "not-found", validDocument(t, out).Error.Class)
}

// The "no such path" check runs only after a command found nothing: the
// inspect of a checkpoint stays one metadata read, no listing.
func TestNoSuchPathCheckCostsNothingOnSuccess(t *testing.T) {
	run := filepath.Join(t.TempDir(), "run")
	trainJSON(t, run, "--steps", "3", "--save-every", "3")
	code, _, errs := ckpt(t, "-vv", "inspect", filepath.Join(run, "step-00000003"))
	require.Equal(t, 0, code, errs)
	require.Equal(t, 1, strings.Count(errs, `msg="storage request"`), errs)
	require.Contains(t, errs, "op=read")
}
