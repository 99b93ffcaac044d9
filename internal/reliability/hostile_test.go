package reliability

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
	"github.com/ckptkit/ckptkit/metadata"
)

// hostile is one corpus entry: a checkpoint directory built by make, and
// the exit codes its commands may end with.
type hostile struct {
	name  string
	make  func(t *testing.T, dir string)
	codes []int // allowed exit codes of verify --deep and inspect --hash
}

// editMetadata rewrites dir's metadata with f, sealed again unless raw.
func editMetadata(t *testing.T, dir string, raw bool, f func(string) string) {
	t.Helper()
	p := filepath.Join(dir, metadata.ObjectKey)
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	out := []byte(f(string(b)))
	if !raw {
		out, err = metadata.Seal(out)
		require.NoError(t, err)
	}
	require.NoError(t, os.WriteFile(p, out, 0o644))
}

// The hostile inputs of the issue, each through verify --deep and
// inspect --hash as separate processes: no crash, no hang (30 s), peak RSS
// under 1 GiB, and an exit code the taxonomy allows (1: bad checkpoint).
func TestHostileCorpus(t *testing.T) {
	base := filepath.Join(t.TempDir(), "run")
	r := run(t, time.Minute, "train", "--url", base, "--steps", "2", "--save-every", "2", "--ranks", "2")
	require.Equal(t, 0, r.code, r.errs)
	good := filepath.Join(base, catalog.StepName(2))
	big := int64(size(3<<30, 256<<20))
	corpus := []hostile{
		{"flipped bit in iteration", func(t *testing.T, d string) {
			editMetadata(t, d, true, func(s string) string { return strings.Replace(s, `"iteration":2`, `"iteration":3`, 1) })
		}, []int{1}},
		{"case-folded member (sealed)", func(t *testing.T, d string) {
			editMetadata(t, d, false, func(s string) string { return strings.Replace(s, `"shape":`, `"shaPe":`, 1) })
		}, []int{1}},
		{"duplicate format member (sealed)", func(t *testing.T, d string) {
			editMetadata(t, d, false, func(s string) string {
				return strings.Replace(s, `"format":"ckptkit",`, `"format":"ckptkit","format":"torch-dcp",`, 1)
			})
		}, []int{1}},
		{"float32 [2^62] with an empty chunk (sealed)", func(t *testing.T, d string) {
			editMetadata(t, d, false, func(s string) string {
				i := strings.Index(s, `"object":"`) + len(`"object":"`)
				obj := s[i : i+strings.Index(s[i:], `"`)]
				return strings.Replace(s, `"tensors":[`, `"tensors":[{"key":"a.huge","dtype":"float32","shape":[4611686018427387904],"chunks":[{"offsets":[0],"sizes":[0],"object":"`+obj+`","offset":0,"length":0,"crc32c":0}]},`, 1)
			})
		}, []int{1}},
		{"64 GiB chunk declared over a small object (sealed)", func(t *testing.T, d string) {
			ckpttest.SparseTensorCheckpoint(t, d, 16)
			editMetadata(t, d, false, func(s string) string {
				s = strings.Replace(s, `"shape":[16]`, `"shape":[68719476736]`, 1)
				s = strings.Replace(s, `"sizes":[16]`, `"sizes":[68719476736]`, 1)
				s = strings.Replace(s, `"length":16`, `"length":68719476736`, 1)
				return strings.Replace(s, `"size":16`, `"size":68719476736`, 1)
			})
		}, []int{1}},
		{fmt.Sprintf("%d MiB chunk in a sparse object", big>>20), func(t *testing.T, d string) { ckpttest.SparseTensorCheckpoint(t, d, big) }, []int{0}},
		{"FIFO at the metadata key", func(t *testing.T, d string) {
			require.NoError(t, os.Remove(filepath.Join(d, metadata.ObjectKey)))
			require.NoError(t, syscall.Mkfifo(filepath.Join(d, metadata.ObjectKey), 0o644))
		}, []int{1}},
		{"2 GiB metadata object (sparse)", func(t *testing.T, d string) {
			require.NoError(t, os.Truncate(filepath.Join(d, metadata.ObjectKey), 2<<30))
		}, []int{1}},
		{"truncated DCP .metadata", func(t *testing.T, d string) {
			require.NoError(t, os.RemoveAll(d))
			ckpttest.CopyDir(t, "../../interop/torchdcp/testdata/dense", d)
			b, err := os.ReadFile(filepath.Join(d, ".metadata"))
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(filepath.Join(d, ".metadata"), b[:len(b)/2], 0o644))
		}, []int{1}},
	}
	tried, survived := 0, 0
	var worstRSS int64
	var failures []string
	for i, h := range corpus {
		d := filepath.Join(t.TempDir(), fmt.Sprint("h", i))
		if strings.Contains(h.name, "sparse object") || strings.Contains(h.name, "small object") {
			require.NoError(t, os.MkdirAll(d, 0o755))
		} else {
			ckpttest.CopyDir(t, good, d)
		}
		h.make(t, d)
		cmds := [][]string{{"verify", "--deep", d}, {"inspect", "--hash", d}}
		for _, args := range cmds {
			tried++
			res := run(t, 30*time.Second, args...)
			worstRSS = max(worstRSS, res.maxRSS)
			crashed := strings.Contains(res.errs, "panic:") || strings.Contains(res.errs, "fatal error:")
			okCode := false
			for _, c := range h.codes {
				okCode = okCode || res.code == c
			}
			if !res.timedOut && !crashed && okCode && res.maxRSS < 1<<30 {
				survived++
				continue
			}
			failures = append(failures, fmt.Sprintf("%s: ckpt %s: exit %d, timed out %v, RSS %d MiB: %.300s", h.name, args[0], res.code, res.timedOut, res.maxRSS>>20, res.errs))
		}
	}
	record(row{Class: "hostile inputs (verify --deep, inspect --hash)", Tried: tried, Survived: survived, Lost: tried - survived,
		Note: fmt.Sprintf("%d inputs; survived = no crash, no hang (30 s), RSS < 1 GiB (worst %d MiB), exit code of its class", len(corpus), worstRSS>>20)})
	require.Empty(t, failures)
}
