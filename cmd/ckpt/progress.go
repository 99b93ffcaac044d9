package main

import (
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progressBar returns a byte progress callback that draws a bar (bytes,
// rate, ETA) on stderr when it is a terminal, and a function that ends the
// bar. With quiet set, or when stderr is not a terminal, both do nothing.
func progressBar(label string, quiet bool) (update func(done, total int64), finish func()) {
	if quiet || !isTerminal(os.Stderr) {
		return nil, func() {}
	}
	bar := progressbar.NewOptions64(-1, progressbar.OptionSetWriter(os.Stderr), progressbar.OptionShowBytes(true),
		progressbar.OptionSetDescription(label), progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionClearOnFinish())
	return func(done, total int64) {
			if bar.GetMax64() != total {
				bar.ChangeMax64(total)
			}
			_ = bar.Set64(done)
		}, func() {
			_ = bar.Finish()
		}
}

// isTerminal reports whether f is a character device (a terminal).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
