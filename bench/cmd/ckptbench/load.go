package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuSnapshot is the machine's CPU time and this process's (with its
// children's) at one moment, to tell how much of the machine others used
// while the benchmark ran.
type cpuSnapshot struct {
	at          time.Time
	busy, total float64 // machine-wide, in clock ticks
	own         time.Duration
}

const clockTicks = 100 // USER_HZ on Linux

func takeCPUSnapshot() (cpuSnapshot, error) {
	s := cpuSnapshot{at: time.Now()}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s, fmt.Errorf("read /proc/stat: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return s, fmt.Errorf("unexpected /proc/stat line %q", line)
	}
	for i, v := range f[1:] {
		n, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return s, fmt.Errorf("parse /proc/stat: %w", err)
		}
		s.total += n
		if i != 3 && i != 4 { // idle and iowait
			s.busy += n
		}
	}
	for _, who := range []int{syscall.RUSAGE_SELF, syscall.RUSAGE_CHILDREN} {
		var ru syscall.Rusage
		if err := syscall.Getrusage(who, &ru); err != nil {
			return s, fmt.Errorf("getrusage: %w", err)
		}
		s.own += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return s, nil
}

// othersShare returns the fraction of the machine's CPU capacity used by
// other processes between a and b, and this benchmark's own share.
func othersShare(a, b cpuSnapshot) (others, own float64) {
	total := b.total - a.total
	if total <= 0 {
		return 0, 0
	}
	own = (b.own - a.own).Seconds() * clockTicks / total
	others = (b.busy-a.busy)/total - own
	return max(others, 0), own
}
