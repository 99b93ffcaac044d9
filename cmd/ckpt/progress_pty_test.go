package main

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

// The real binary, its stderr a terminal (a pty), copying a 512 MiB
// checkpoint one object at a time: the progress line shows bytes done,
// the total and a non-zero ETA.
func TestCopyProgressOnATerminal(t *testing.T) {
	if testing.Short() {
		t.Skip("writes and copies 512 MiB")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "ckpt")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "build: %s", out)

	// 16 tensors of 32 MiB over 4 ranks.
	ctx := context.Background()
	src := filepath.Join(dir, "src")
	st, err := backend.Open(ctx, src)
	require.NoError(t, err)
	const per = 32 << 20
	ranks := make([]*statedict.StateDict, 4)
	for r := range ranks {
		ranks[r] = statedict.New()
		for i := 0; i < 4; i++ {
			data := bytes.Repeat([]byte{byte(r), byte(i), 7, 1}, per/4)
			key := "model.layer" + string(rune('a'+r)) + string(rune('a'+i)) + ".weight"
			ranks[r].Tensors[key] = &statedict.Shard{DType: statedict.Float32, GlobalShape: []int64{per / 4}, Offsets: []int64{0}, Sizes: []int64{per / 4}, Data: data}
		}
	}
	_, err = saver.SaveLocal(ctx, st, ranks, saver.Options{Iteration: 1})
	require.NoError(t, err)
	ranks = nil

	cmd := exec.Command(bin, "copy", "--parallel", "1", src, filepath.Join(dir, "dst"))
	ptmx, tty, err := pty.Open()
	require.NoError(t, err)
	defer ptmx.Close()
	require.NoError(t, pty.Setsize(ptmx, &pty.Winsize{Rows: 24, Cols: 160}))
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, tty
	require.NoError(t, cmd.Start())
	tty.Close()

	var mu sync.Mutex
	var screen strings.Builder
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			n, err := ptmx.Read(buf)
			mu.Lock()
			screen.Write(buf[:n])
			mu.Unlock()
			if err != nil { // io.EOF, or EIO once the child is gone
				return
			}
		}
	}()
	require.NoError(t, cmd.Wait(), "stdout %s", stdout.String())
	select {
	case <-done:
	case <-time.After(time.Second):
	}
	mu.Lock()
	text := screen.String()
	mu.Unlock()
	require.Contains(t, stdout.String(), "copied ")

	// A bar frame: "copy ETA 1.3s  37% |███...| (190/512 MiB, 190 MiB/s)"
	// (the bar may print a no-break space before a unit).
	sp := `[\s\x{00a0}]`
	frame := regexp.MustCompile(`copy ETA ([0-9.]+(?:ms|s|m))\s+(\d+)% \|[^|]*\| \(([\d.]+)(?:` + sp + `[KMG]?i?B)?/([\d.]+)` + sp + `MiB, [\d.]+` + sp + `[KMG]?i?B/s\)`)
	var best []string
	for _, m := range frame.FindAllStringSubmatch(text, -1) {
		eta, err := time.ParseDuration(m[1])
		require.NoError(t, err)
		if m[4] == "512" && m[3] != "0" && eta > 0 {
			best = m
			break
		}
	}
	require.NotNil(t, best, "a frame with bytes done, total 512 MiB and a non-zero ETA; the terminal showed %q", lastBytes(text, 2000))
	t.Logf("progress frame: %s", best[0])
}

func lastBytes(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
