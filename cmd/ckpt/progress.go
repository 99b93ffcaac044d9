package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	prog "github.com/ckptkit/ckptkit/progress"
)

// progressInterval is how often the plain progress line is printed when
// stderr is not a terminal (with -v).
var progressInterval = 5 * time.Second

// progress shows how far a long operation is on stderr: a bar with done /
// total, rate and ETA (github.com/schollz/progressbar) on a terminal, or
// with --progress anywhere; a plain line every progressInterval when stderr
// is not a terminal and -v is set; nothing with -q, with --json (unless
// --progress), or otherwise. Its methods are safe for concurrent use and do
// nothing on a nil or disabled progress.
type progress struct {
	label string
	bytes bool // done and total are bytes (else items, e.g. steps)
	unit  string

	mu     sync.Mutex
	newBar func(total int64) *progressbar.ProgressBar // bar mode
	bar    *progressbar.ProgressBar
	w      io.Writer // plain-line mode when bar is nil
	start  time.Time
	last   time.Time
}

// newProgress returns the progress of one operation of cmd counted in
// bytes; newItemProgress counts items of unit (e.g. "steps").
func newProgress(cmd *cobra.Command, label string) *progress {
	return startProgress(cmd, label, true, "")
}

func newItemProgress(cmd *cobra.Command, label, unit string) *progress {
	return startProgress(cmd, label, false, unit)
}

func startProgress(cmd *cobra.Command, label string, bytes bool, unit string) *progress {
	in := inv(cmd)
	w := cmd.ErrOrStderr()
	p := &progress{label: label, bytes: bytes, unit: unit, start: time.Now()}
	switch {
	case in.progress:
	case in.quiet || wantsJSON(cmd):
		return nil
	case isTerminal(w):
	case in.logs(slog.LevelInfo):
		p.w = w
		p.last = p.start
		return p
	default:
		return nil
	}
	opts := []progressbar.Option{
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(label),
		progressbar.OptionThrottle(100 * time.Millisecond),
		progressbar.OptionShowCount(),
		// The ETA is ours (see eta): the bar's own counts whole seconds,
		// so it reads 0s through the last second of every operation.
		progressbar.OptionSetPredictTime(false),
		progressbar.OptionSetElapsedTime(false),
		progressbar.OptionSetWidth(20),
		progressbar.OptionClearOnFinish(),
	}
	if bytes {
		opts = append(opts, progressbar.OptionShowBytes(true), progressbar.OptionShowTotalBytes(true), progressbar.OptionUseIECUnits(true))
	} else {
		opts = append(opts, progressbar.OptionShowIts(), progressbar.OptionSetItsString(unit))
	}
	// The bar is made on the first update, when the total is known: a bar
	// started without a total never predicts an ETA.
	p.newBar = func(total int64) *progressbar.ProgressBar { return progressbar.NewOptions64(total, opts...) }
	in.bar = p
	return p
}

// update reports done of total.
func (p *progress) update(done, total int64) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.newBar != nil {
		if p.bar == nil {
			p.bar = p.newBar(total)
		} else if p.bar.GetMax64() != total {
			p.bar.ChangeMax64(total)
		}
		p.bar.Describe(p.label + " ETA " + p.eta(done, total, time.Now()))
		_ = p.bar.Set64(done)
		return
	}
	if now := time.Now(); now.Sub(p.last) >= progressInterval || done == total {
		p.last = now
		fmt.Fprintln(p.w, p.line(done, total, now))
	}
}

// line is the plain progress line: done / total, rate, ETA.
func (p *progress) line(done, total int64, now time.Time) string {
	rate := p.rate(done, now)
	eta := "?"
	if rate > 0 && total >= done {
		eta = (time.Duration(float64(total-done) / rate * float64(time.Second))).Round(time.Second).String()
	}
	if p.bytes {
		return fmt.Sprintf("%s: %s / %s, %s/s, ETA %s", p.label, humanize.IBytes(uint64(done)), humanize.IBytes(uint64(total)), humanize.IBytes(uint64(rate)), eta)
	}
	return fmt.Sprintf("%s: %d / %d %s, %.1f %s/s, ETA %s", p.label, done, total, p.unit, rate, p.unit, eta)
}

// rate is the average rate since the start, per second.
func (p *progress) rate(done int64, now time.Time) float64 {
	if el := now.Sub(p.start).Seconds(); el > 0 {
		return float64(done) / el
	}
	return 0
}

// eta is the time left at the average rate so far: tenths of a second
// under 10s, whole seconds above; "?" before the first byte.
func (p *progress) eta(done, total int64, now time.Time) string {
	rate := p.rate(done, now)
	if rate <= 0 || total < done {
		return "?"
	}
	left := time.Duration(float64(total-done) / rate * float64(time.Second))
	if left < 10*time.Second {
		return left.Round(100 * time.Millisecond).String()
	}
	return left.Round(time.Second).String()
}

// finish ends the bar (it is cleared from the terminal).
func (p *progress) finish() { p.onBar((*progressbar.ProgressBar).Finish) }

// clear erases the bar from the terminal until the next update.
func (p *progress) clear() { p.onBar((*progressbar.ProgressBar).Clear) }

// onBar calls f on the bar, if one is drawn.
func (p *progress) onBar(f func(*progressbar.ProgressBar) error) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bar != nil {
		_ = f(p.bar)
	}
}

// callback returns the progress.Func of the library operations that
// shows their updates on p, or nil when p shows nothing (so the operation
// skips its progress accounting).
func (p *progress) callback() prog.Func {
	if p == nil {
		return nil
	}
	return func(u prog.Update) { p.update(u.Done, u.Total) }
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
