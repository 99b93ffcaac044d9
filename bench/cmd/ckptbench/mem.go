package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ckptkit/ckptkit/loader"
)

// memPhaseResult is what a memory phase subprocess prints (JSON).
type memPhaseResult struct {
	BaseRSS   int64  `json:"base_rss"`
	PeakRSS   int64  `json:"peak_rss"`
	BaseHeap  int64  `json:"base_heap"`
	PeakHeap  int64  `json:"peak_heap"`
	Mode      string `json:"mode,omitempty"`
	GoMemLim  string `json:"gomemlimit,omitempty"`
	DataBytes int64  `json:"data_bytes"`
}

// procStatusKB returns a "Vm..." field of /proc/self/status in bytes.
func procStatusKB(field string) (int64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, fmt.Errorf("read status: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parse %s: %w", field, err)
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("%s not in /proc/self/status", field)
}

// heapSampler records the peak of the live-and-unswept heap objects every
// few milliseconds until stopped.
type heapSampler struct {
	peak atomic.Int64
	stop chan struct{}
	done chan struct{}
}

func heapObjects() int64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}

func startHeapSampler() *heapSampler {
	h := &heapSampler{stop: make(chan struct{}), done: make(chan struct{})}
	h.peak.Store(heapObjects())
	go func() {
		defer close(h.done)
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-h.stop:
				return
			case <-t.C:
				if v := heapObjects(); v > h.peak.Load() {
					h.peak.Store(v)
				}
			}
		}
	}()
	return h
}

func (h *heapSampler) finish() int64 {
	close(h.stop)
	<-h.done
	if v := heapObjects(); v > h.peak.Load() {
		h.peak.Store(v)
	}
	return h.peak.Load()
}

// runMemPhase is the body of the "mem-phase" subprocess: it builds the
// buffers of one save or load, resets the peak RSS, runs the operation and
// prints how far RSS and heap rose above the buffers.
func runMemPhase(args []string) error {
	fs := flag.NewFlagSet("mem-phase", flag.ContinueOnError)
	op := fs.String("op", "save", "save or load")
	dir := fs.String("dir", "", "checkpoint directory (fresh for save)")
	sizeS := fs.String("size", "1GiB", "data size")
	world := fs.Int("world", 4, "ranks")
	mode := fs.String("mode", "default", "load mode: default, transactional or staged (transactional, staging everything)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	size, err := positiveSize(*sizeS)
	if err != nil {
		return err
	}
	ctx := context.Background()
	specs := modelSpec(size)
	res := memPhaseResult{DataBytes: specBytes(specs), GoMemLim: os.Getenv("GOMEMLIMIT")}
	var run func() error
	switch *op {
	case "save":
		sds := sourceState(specs, *world)
		run = func() error {
			_, _, err := saveOnce(ctx, *dir, sds)
			return err
		}
		defer runtime.KeepAlive(sds)
	case "load":
		tg := targetState(specs, *world)
		opts := loader.Options{}
		switch *mode {
		case "transactional":
			opts.Transactional = true
		case "staged":
			opts.Transactional, opts.StagingLimit = true, 2*size+64*mib
		}
		run = func() error {
			lr, err := loadOnce(ctx, *dir, tg, opts)
			if err == nil {
				res.Mode = lr.rep.Mode
			}
			return err
		}
		defer runtime.KeepAlive(tg)
	default:
		return fmt.Errorf("mem-phase: unknown op %q", *op)
	}
	if res.BaseRSS, err = resetPeakRSS(); err != nil {
		return err
	}
	res.BaseHeap = heapObjects()
	h := startHeapSampler()
	if err := run(); err != nil {
		return err
	}
	res.PeakHeap = h.finish()
	if res.PeakRSS, err = procStatusKB("VmHWM"); err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

// resetPeakRSS collects garbage, returns free memory to the OS, resets
// VmHWM and returns the RSS from which a phase's peak is measured.
func resetPeakRSS() (int64, error) {
	runtime.GC()
	debug.FreeOSMemory()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		return 0, fmt.Errorf("reset peak RSS: %w", err)
	}
	return procStatusKB("VmRSS")
}

// memPhase runs one memory phase in a subprocess (so each starts with a
// fresh heap and peak RSS) and decodes its result.
func memPhase(ctx context.Context, cfg *config, env []string, args ...string) (memPhaseResult, error) {
	var r memPhaseResult
	err := runPhase(ctx, env, append([]string{"mem-phase"}, args...), &r)
	return r, err
}

// runPhase runs this executable with args (a phase subcommand) and env
// added to the environment, and decodes its JSON output into v.
func runPhase(ctx context.Context, env, args []string, v any) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%v: %w: %s", args, err, strings.TrimSpace(errb.String()))
	}
	if err := json.Unmarshal(out.Bytes(), v); err != nil {
		return fmt.Errorf("%v output %q: %w", args, out.String(), err)
	}
	return nil
}

// benchMemory measures figure 6: RSS and heap growth above the source or
// destination buffers during a save and during loads in each mode.
func benchMemory(ctx context.Context, cfg *config, ckptDir string) ([]Row, error) {
	type phase struct {
		name string
		env  []string
		args []string
	}
	sz := strconv.FormatInt(cfg.size, 10)
	phases := []phase{
		{"save 4 ranks", nil, []string{"-op", "save", "-size", sz}},
		{"load 4->4 default", nil, []string{"-op", "load", "-mode", "default", "-size", sz, "-dir", ckptDir}},
		{"load 4->4 staged", nil, []string{"-op", "load", "-mode", "staged", "-size", sz, "-dir", ckptDir}},
		{"load 4->4 transactional", nil, []string{"-op", "load", "-mode", "transactional", "-size", sz, "-dir", ckptDir}},
	}
	if cfg.memLimitVariant {
		// The same transactional load with a soft memory limit just above the
		// buffers: shows how much of the growth is GC pacing.
		lim := fmt.Sprintf("GOMEMLIMIT=%dMiB", specBytes(modelSpec(cfg.size))/mib+256)
		phases = append(phases,
			phase{"load 4->4 transactional, " + lim, []string{lim}, []string{"-op", "load", "-mode", "transactional", "-size", sz, "-dir", ckptDir}},
			phase{"load 4->4 default, " + lim, []string{lim}, []string{"-op", "load", "-mode", "default", "-size", sz, "-dir", ckptDir}})
	}
	var rows []Row
	for _, p := range phases {
		var rss, heap []float64
		var mode string
		for i := 0; i < cfg.runs; i++ {
			args := p.args
			var tmp string
			if p.args[1] == "save" {
				tmp = filepath.Join(cfg.work, fmt.Sprintf("memsave-%d", i))
				args = append(append([]string(nil), args...), "-dir", tmp)
			}
			r, err := memPhase(ctx, cfg, p.env, args...)
			if tmp != "" {
				os.RemoveAll(tmp)
			}
			if err != nil {
				return nil, err
			}
			rss = append(rss, float64(r.PeakRSS-r.BaseRSS)/mib)
			heap = append(heap, float64(r.PeakHeap-r.BaseHeap)/mib)
			mode = r.Mode
		}
		name := "memory " + p.name
		if mode != "" {
			name += " (mode " + mode + ")"
		}
		rs, hs := newStat(rss), newStat(heap)
		cfg.logf("%s: extra RSS %v MiB, extra heap %v MiB", name, rss, heap)
		goal, metR, metH := "<= 128 MiB", boolp(rs.Median <= 128), boolp(hs.Median <= 128)
		if mode == loader.ModeStaged {
			// Staging holds the whole read in memory by design.
			goal, metR, metH = fmt.Sprintf("~%d MiB (1x data, staged by design)", specBytes(modelSpec(cfg.size))/mib), nil, nil
		}
		rows = append(rows, Row{Figure: name + ": peak RSS above buffers", Unit: "MiB", Value: &rs, Goal: goal,
			Met: metR, Note: "VmHWM after clear_refs, subprocess per run"})
		rows = append(rows, Row{Figure: name + ": peak heap above buffers", Unit: "MiB", Value: &hs, Goal: goal,
			Met: metH, Note: "runtime/metrics heap objects, sampled every 2 ms"})
	}
	return rows, nil
}
