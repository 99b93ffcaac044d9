package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// forceFlag is the one overwrite flag: every command that can replace data
// refuses to without it.
const forceFlag = "force"

// addParallelFlag adds --parallel, the one name for parallelism.
func addParallelFlag(cmd *cobra.Command, p *int, what string) {
	cmd.Flags().IntVar(p, "parallel", 8, what)
}

// parseDuration accepts Go durations (90s, 36h, 1h30m) and a whole number
// of days ("7d").
func parseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if d, ok := strings.CutSuffix(s, "d"); ok {
		if n, err := strconv.ParseInt(d, 10, 64); err == nil && n >= 0 {
			return time.Duration(n) * 24 * time.Hour, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q: use a Go duration (90s, 36h, 1h30m) or whole days (7d)", s)
	}
	return d, nil
}
