package reliability

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ckptkit/ckptkit/internal/testkit/ckpttest"
)

// ckptBin is the ckpt binary the campaign runs as a user would.
var ckptBin string

// full is true under CKPTKIT_RELIABILITY=full (make reliability): the
// issue's sizes. Otherwise the bounded subset of make test.
var full = os.Getenv("CKPTKIT_RELIABILITY") == "full"

// size returns the full-campaign count or the bounded one.
func size(fullN, boundedN int) int {
	if full {
		return fullN
	}
	return boundedN
}

// row is one line of the campaign's table.
type row struct {
	Class    string `json:"class"`
	Tried    int    `json:"tried"`
	Survived int    `json:"survived"`
	Lost     int    `json:"lost"`
	Note     string `json:"note"`
}

var (
	reportMu sync.Mutex
	report   []row
)

// record adds a row to the table printed at the end of the run.
func record(r row) {
	reportMu.Lock()
	defer reportMu.Unlock()
	report = append(report, r)
}

// wrapEnv names the file a wrapper process writes its child's peak RSS
// to: the test binary runs itself as that wrapper (see run).
const wrapEnv = "CKPTKIT_RELIABILITY_WRAP"

func TestMain(m *testing.M) {
	if out := os.Getenv(wrapEnv); out != "" {
		os.Exit(wrap(out, os.Args[1], os.Args[2:]))
	}
	dir, err := os.MkdirTemp("", "ckpt-rel-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ckptBin = filepath.Join(dir, "ckpt")
	build := exec.Command("go", "build", "-o", ckptBin, "github.com/ckptkit/ckptkit/cmd/ckpt")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build ckpt:", err)
		os.Exit(1)
	}
	code := m.Run()
	printReport()
	os.RemoveAll(dir)
	os.Exit(code)
}

// printReport prints the table (markdown) and writes it, with JSON rows,
// to $CKPTKIT_RELIABILITY_REPORT when set.
func printReport() {
	reportMu.Lock()
	defer reportMu.Unlock()
	if len(report) == 0 {
		return
	}
	sort.SliceStable(report, func(i, j int) bool { return report[i].Class < report[j].Class })
	var b strings.Builder
	mode := "bounded (make test)"
	if full {
		mode = "full (make reliability)"
	}
	fmt.Fprintf(&b, "reliability campaign, %s, %s\n\n", mode, time.Now().UTC().Format(time.RFC3339))
	b.WriteString("| class | tried | survived | lost | note |\n| --- | ---: | ---: | ---: | --- |\n")
	for _, r := range report {
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %s |\n", r.Class, r.Tried, r.Survived, r.Lost, r.Note)
	}
	fmt.Print(b.String())
	if p := os.Getenv("CKPTKIT_RELIABILITY_REPORT"); p != "" {
		js, _ := json.MarshalIndent(report, "", "  ")
		_ = os.WriteFile(p, []byte(b.String()+"\n"), 0o644)
		_ = os.WriteFile(p+".json", js, 0o644)
	}
}

// result is what one ckpt process did.
type result struct {
	code      int
	out, errs string
	maxRSS    int64 // bytes
	elapsed   time.Duration
	timedOut  bool
}

// wrap runs bin with args as a child, writes the child's peak RSS (bytes)
// to out and returns its exit code. A child's rusage counts the memory of
// the process it was forked from until its exec; forked from this small,
// fresh process, the figure is the child's own, not the test binary's.
func wrap(out, bin string, args []string) int {
	cmd := exec.Command(bin, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with a timed-out wrapper
	_ = cmd.Run()
	if cmd.ProcessState == nil {
		return 125
	}
	var rss int64
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		rss = ru.Maxrss * 1024 // KiB on Linux
	}
	_ = os.WriteFile(out, []byte(fmt.Sprint(rss)), 0o644)
	if code := cmd.ProcessState.ExitCode(); code >= 0 {
		return code
	}
	return 137 // killed
}

// run runs ckpt with args (through wrap, to measure its peak RSS),
// killing it after timeout.
func run(t *testing.T, timeout time.Duration, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	rssFile := filepath.Join(t.TempDir(), "rss")
	cmd := exec.CommandContext(ctx, os.Args[0], append([]string{ckptBin}, args...)...)
	cmd.Env = append(os.Environ(), wrapEnv+"="+rssFile)
	cmd.WaitDelay = time.Second
	var out, errs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errs
	start := time.Now()
	err := cmd.Run()
	r := result{out: out.String(), errs: errs.String(), elapsed: time.Since(start), timedOut: ctx.Err() != nil}
	if cmd.ProcessState == nil {
		t.Fatalf("ckpt %v: %v", args, err)
	}
	r.code = cmd.ProcessState.ExitCode()
	if b, err := os.ReadFile(rssFile); err == nil {
		fmt.Sscan(string(b), &r.maxRSS)
	}
	return r
}

// lastJSON decodes the last line of a --json command's output.
func lastJSON(s string, v any) error {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return json.Unmarshal([]byte(lines[len(lines)-1]), v)
}

// randName returns a fresh random name.
func randName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// s3Run returns a fresh run URL in the S3 test bucket, or "" when the test
// servers are not running.
func s3Run(name string) string {
	u := os.Getenv("CKPTKIT_TEST_S3_URL")
	if u == "" {
		return ""
	}
	return ckpttest.WithPath(u, randName(name+"-"))
}

// gcsRun returns a fresh run URL in the GCS test bucket, or "" when the
// test servers are not running.
func gcsRun(name string) string {
	u := os.Getenv(ckpttest.GCSURLEnv)
	if u == "" || os.Getenv("STORAGE_EMULATOR_HOST") == "" {
		return ""
	}
	return ckpttest.WithPath(u, randName(name+"-"))
}
