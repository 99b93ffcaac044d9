package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
)

// The fair baselines of figures 1 and 2 (issue 15): what N ranks really
// compete with is N files written (or read) at the same time, not one
// stream. N is the number of data objects ckptkit writes.

// parallelWrite writes n files of size bytes each under dir, one writer
// goroutine per file, in 8 MiB blocks, each fdatasync'd and closed, and
// returns the wall time until the last one is done; the files are removed
// afterwards (not timed).
func parallelWrite(dir string, sizes []int64, block []byte) (time.Duration, error) {
	paths := make([]string, len(sizes))
	for i := range sizes {
		paths[i] = filepath.Join(dir, fmt.Sprintf("par-%d.bin", i))
	}
	defer func() {
		for _, p := range paths {
			os.Remove(p)
		}
	}()
	start := time.Now()
	var g errgroup.Group
	for i, n := range sizes {
		g.Go(func() error { return writeSynced(paths[i], n, block) })
	}
	if err := g.Wait(); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// writeSynced writes n bytes to path in len(block) writes, then fdatasyncs
// and closes it.
func writeSynced(path string, n int64, block []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("baseline write: %w", err)
	}
	for left := n; left > 0; {
		b := block[:min(int64(len(block)), left)]
		if _, err := f.Write(b); err != nil {
			f.Close()
			return fmt.Errorf("baseline write %s: %w", path, err)
		}
		left -= int64(len(b))
	}
	if err := syscall.Fdatasync(int(f.Fd())); err != nil {
		f.Close()
		return fmt.Errorf("baseline fdatasync %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("baseline close %s: %w", path, err)
	}
	return nil
}

// parallelRead reads every file whole into its own reused buffer, one
// reader goroutine per file, from the page cache: the fair load baseline.
func parallelRead(files []string, bufs [][]byte) (time.Duration, int64, error) {
	start := time.Now()
	sizes := make([]int64, len(files))
	var g errgroup.Group
	for i, p := range files {
		g.Go(func() error {
			f, err := os.Open(p)
			if err != nil {
				return fmt.Errorf("baseline read: %w", err)
			}
			defer f.Close()
			fi, err := f.Stat()
			if err != nil {
				return fmt.Errorf("baseline read: %w", err)
			}
			if int64(cap(bufs[i])) < fi.Size() {
				bufs[i] = make([]byte, fi.Size())
			}
			if _, err := io.ReadFull(f, bufs[i][:fi.Size()]); err != nil {
				return fmt.Errorf("baseline read %s: %w", p, err)
			}
			sizes[i] = fi.Size()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return 0, 0, err
	}
	var total int64
	for _, n := range sizes {
		total += n
	}
	return time.Since(start), total, nil
}

// splitEven splits total bytes into n near-equal parts.
func splitEven(total int64, n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = total/int64(n) + map[bool]int64{true: 1}[int64(i) < total%int64(n)]
	}
	return out
}

// withLoad appends the 1-minute load average now to a row's note.
func withLoad(r Row) Row {
	la := loadAvg()
	if r.Note != "" {
		r.Note += "; "
	}
	r.Note += "load average " + la
	return r
}

// cpuNow returns the process's user and system CPU time so far
// (getrusage): on a machine shared with other jobs the CPU a step burns is
// steadier than its wall time, which includes waiting for a core.
func cpuNow() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuRow is the CPU-time twin of a throughput row: MiB per CPU second of
// the baseline and of ckptkit, measured in the same interleaved runs.
func cpuRow(name string, n int64, base, ck []time.Duration, goal float64) Row {
	r := throughputRow(name+", CPU time", n, base, ck, goal)
	r.Unit = "MiB/CPU-s"
	r.Note = "getrusage user+system of the process, same runs; steadier than wall time on a shared machine"
	return withLoad(r)
}
