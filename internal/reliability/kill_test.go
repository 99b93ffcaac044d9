package reliability

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	_ "github.com/ckptkit/ckptkit/backend/fs"
	_ "github.com/ckptkit/ckptkit/backend/s3"
	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/loader"
)

type trainOut struct {
	Step          int64  `json:"step"`
	WeightsSHA256 string `json:"weights_sha256"`
}

// trainArgs is the training job every kill point interrupts.
func trainArgs(url string) []string {
	return []string{"train", "--json", "--url", url, "--steps", "8", "--save-every", "1", "--ranks", "2", "--seed", "11"}
}

// SIGKILL at a uniformly random point of a training run that saves every
// step, then train --resume: safe when the resumed run ends with the
// weights of a run that was never interrupted.
func TestSIGKILLDuringSaves(t *testing.T) {
	backends := map[string]func(i int) string{
		"fs": func(i int) string { return filepath.Join(t.TempDir(), fmt.Sprint("run", i)) },
	}
	if s3Run("x") != "" {
		backends["s3"] = func(int) string { return s3Run("kill") }
	}
	if gcsRun("x") != "" {
		backends["gcs"] = func(int) string { return gcsRun("kill") }
	}
	for name, newRun := range backends {
		t.Run(name, func(t *testing.T) {
			n := size(100, 5)
			ref := run(t, 2*time.Minute, trainArgs(newRun(-1))...)
			require.Equal(t, 0, ref.code, ref.errs)
			var want trainOut
			require.NoError(t, lastJSON(ref.out, &want))
			safe, lost := 0, 0
			var firstLoss string
			for i := range n {
				url := newRun(i)
				cmd := exec.Command(ckptBin, trainArgs(url)...)
				require.NoError(t, cmd.Start())
				time.Sleep(time.Duration(rand.Int64N(int64(ref.elapsed) + 1)))
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				res := run(t, 2*time.Minute, append(trainArgs(url), "--resume", "--allow-fresh")...)
				var got trainOut
				ok := res.code == 0 && lastJSON(res.out, &got) == nil && got.WeightsSHA256 == want.WeightsSHA256
				if ok {
					safe++
					continue
				}
				lost++
				if firstLoss == "" {
					firstLoss = fmt.Sprintf("exit %d: %s", res.code, res.errs)
				}
			}
			note := fmt.Sprintf("kill at a uniform point of an 8-step run saving every step (%s), then resume to the reference weights", ref.elapsed.Round(time.Millisecond))
			record(row{Class: "SIGKILL during saves, " + name, Tried: n, Survived: safe, Lost: lost, Note: note})
			require.Zero(t, lost, "first loss: %s", firstLoss)
		})
	}
}

// Two ckpt train processes (seeds 3 and 4) saving every step of one run at
// once, as in the issue: every committed checkpoint must verify --deep.
func TestConcurrentWritersOnOneRun(t *testing.T) {
	backends := map[string]func() string{"fs": func() string { return filepath.Join(t.TempDir(), "run") }}
	if s3Run("x") != "" {
		backends["s3"] = func() string { return s3Run("writers") }
	}
	for name, newRun := range backends {
		t.Run(name, func(t *testing.T) {
			runs, saves := size(20, 2), size(30, 6)
			ctx := context.Background()
			committed, bad := 0, 0
			var firstBad string
			for range runs {
				url := newRun()
				var cmds []*exec.Cmd
				for _, seed := range []string{"3", "4"} {
					cmd := exec.Command(ckptBin, "train", "--url", url, "--steps", fmt.Sprint(saves), "--save-every", "1", "--ranks", "2", "--seed", seed)
					require.NoError(t, cmd.Start())
					cmds = append(cmds, cmd)
				}
				for _, c := range cmds {
					// The loser of a commit stops with exit 6 (conflict);
					// any other failure means the run tested nothing.
					if err := c.Wait(); err != nil {
						var ee *exec.ExitError
						require.ErrorAs(t, err, &ee)
						require.Equal(t, 6, ee.ExitCode(), "a writer failed otherwise than by losing a commit: %v", err)
					}
				}
				st, err := backend.Open(ctx, url)
				require.NoError(t, err)
				entries, err := catalog.List(ctx, st)
				require.NoError(t, err)
				for _, e := range entries {
					if !e.Committed {
						continue
					}
					committed++
					sub, err := st.Sub(e.Name)
					require.NoError(t, err)
					c, err := loader.Open(ctx, sub)
					var rep *loader.VerifyReport
					if err == nil {
						rep, err = c.Verify(ctx, loader.VerifyOptions{Deep: true})
					}
					if err != nil || !rep.Resumable {
						bad++
						if firstBad == "" {
							firstBad = fmt.Sprintf("%s: %v %v", e.URL, err, rep)
						}
					}
				}
				st.Close()
			}
			record(row{Class: "concurrent writers, " + name, Tried: committed, Survived: committed - bad, Lost: bad,
				Note: fmt.Sprintf("%d runs x 2 writers x %d saves; committed checkpoints that fail verify --deep are lost", runs, saves)})
			require.Positive(t, committed, "no checkpoint was committed: nothing was checked")
			require.Zero(t, bad, firstBad)
		})
	}
}
