package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/internal/bufpool"
	"github.com/ckptkit/ckptkit/internal/bytesize"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

// stateHeadroom is what a staging budget that holds the whole state needs
// above it: every object is staged into whole pages (1 MiB at this size),
// so each wastes up to one, and with a budget of the state + 1 MiB the last
// objects waited for an upload to free pages, which opened the uploads'
// gate during staging and put an fsync or an HTTP request in the stall.
const stateHeadroom = 64 * mib

// asyncPhaseResult is what an async-phase subprocess prints (JSON).
type asyncPhaseResult struct {
	Stall    []float64 `json:"stall_s"`     // per save: time the loop was blocked
	Waited   []float64 `json:"waited_s"`    // per save: the part of Stall waiting for the previous save
	Save     []float64 `json:"save_s"`      // per save: start to commit
	Step     []float64 `json:"step_s"`      // per training step (the compute between two saves)
	SyncSave []float64 `json:"sync_save_s"` // interleaved: per round, the synchronous save
	Copy     []float64 `json:"copy_s"`      // interleaved: per round, a plain copy of the state, one goroutine per processor
	Copy1    []float64 `json:"copy1_s"`     // interleaved: the same with one goroutine
	// Interleaved, per round, an overlapped save (AsyncOptions.Overlap):
	// the call plus the wait for staging before the update (OverlapStall),
	// that wait alone, and the forward/backward stand-in (read passes over
	// the state) while staging ran and, right after, without a save.
	OverlapStall []float64 `json:"overlap_stall_s"`
	OverlapWait  []float64 `json:"overlap_wait_s"`
	ReadOverlap  []float64 `json:"read_overlap_s"`
	ReadPlain    []float64 `json:"read_plain_s"`
	BaseRSS      int64     `json:"base_rss"`      // with the state built
	PeakRSS      int64     `json:"peak_rss"`      // VmHWM
	RSSAfter     []int64   `json:"rss_after"`     // after each save's commit
	RSSSettled   []int64   `json:"rss_settled"`   // the same, after runtime.GC + debug.FreeOSMemory (-settle)
	LiveAfter    []int64   `json:"live_after"`    // live heap at the last GC, same moments
	StagingPeak  int64     `json:"staging_peak"`  // saver.Stats().PeakBytes
	StateBytes   int64     `json:"state_bytes"`   // the caller's state
	BudgetBytes  int64     `json:"budget_bytes"`  // the staging budget
	Objects      int       `json:"objects"`       // data objects of the last save
	SyncObjects  int       `json:"sync_objects"`  // data objects of the last synchronous save
	LastSaveURL  string    `json:"last_save_url"` // the last checkpoint
}

// trainingStep stands for a training step: it changes every 8-byte word of
// every tensor (so every page of the state is written, as an optimizer
// step does) while the previous save may still be writing.
func trainingStep(sds []*statedict.StateDict, step uint64) {
	for _, sd := range sds {
		for _, t := range sd.Tensors {
			d := t.Data
			for i := 0; i+8 <= len(d); i += 8 {
				binary.LittleEndian.PutUint64(d[i:], binary.LittleEndian.Uint64(d[i:])^(step*0x9e3779b97f4a7c15))
			}
		}
	}
}

// readPass stands for a forward and backward pass: it reads every 8-byte
// word of every tensor and writes none (the saved state is only read until
// the optimizer step).
func readPass(sds []*statedict.StateDict) uint64 {
	var x uint64
	for _, sd := range sds {
		for _, t := range sd.Tensors {
			d := t.Data
			for i := 0; i+8 <= len(d); i += 8 {
				x ^= binary.LittleEndian.Uint64(d[i:])
			}
		}
	}
	return x
}

// runAsyncPhase is the body of the "async-phase" subprocess: it builds a
// state of -size bytes over -world ranks and saves it -saves times, sync or
// async, with a training step of -step-passes passes over every tensor
// before each save, under -url (a directory or an object-store URL; one
// sub-prefix per save, the previous one removed with -keep-last 1).
func runAsyncPhase(args []string) error {
	fs := flag.NewFlagSet("async-phase", flag.ContinueOnError)
	mode := fs.String("mode", "async", "sync, async, or interleaved (per round: a synchronous save, an async save, a plain copy of the state)")
	prefault := fs.Bool("prefault", true, "async: AsyncOptions.Prefault (the pool is faulted in when the saver is made, after the state's RSS is noted)")
	rawURL := fs.String("url", "", "run directory or URL")
	sizeS := fs.String("size", "1GiB", "state size")
	budgetS := fs.String("budget", "0", "staging budget (0: the state size + 64 MiB, which holds the whole state: each object's last page is partly used)")
	saves := fs.Int("saves", 5, "number of saves")
	world := fs.Int("world", 4, "ranks")
	keepLast := fs.Int("keep-last", 0, "remove older checkpoints, keeping this many (0: keep all)")
	passes := fs.Int("step-passes", 4, "passes over the whole state per training step (the compute between saves)")
	settle := fs.Bool("settle", false, "after each commit, also record RSS after a GC that returns free memory to the OS")
	cpuProf := fs.String("cpuprofile", "", "write a CPU profile of the saves (training steps excluded) to this file")
	memProf := fs.String("memprofile", "", "write a heap profile (allocations of the whole phase) to this file at the end")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *rawURL == "" {
		return fmt.Errorf("async-phase: -url is required: %w", errUsage)
	}
	size, err := positiveSize(*sizeS)
	if err != nil {
		return err
	}
	budget, err := bytesize.Parse(*budgetS)
	if err != nil {
		return err
	}
	ctx := context.Background()
	specs := modelSpec(size)
	sds := sourceState(specs, *world)
	res := asyncPhaseResult{StateBytes: specBytes(specs)}
	if budget == 0 {
		budget = res.StateBytes + stateHeadroom
	}
	switch *mode {
	case "sync", "async", "interleaved":
	default:
		return fmt.Errorf("async-phase: -mode %q is not sync, async or interleaved: %w", *mode, errUsage)
	}
	if *memProf != "" {
		runtime.MemProfileRate = 64 << 10
	}
	if res.BaseRSS, err = resetPeakRSS(); err != nil {
		return err
	}
	// Made after the state's RSS is noted: a prefaulted pool counts as
	// memory above the state.
	var sv *saver.Saver
	if *mode != "sync" {
		if sv, err = saver.NewSaver(saver.AsyncOptions{StagingBytes: budget, Prefault: *prefault}); err != nil {
			return err
		}
		res.BudgetBytes = budget
	}
	var copyDst *bufpool.Mapped // interleaved: the plain copy's destination, memory of the pool's kind
	var ov *saver.Saver         // interleaved: the overlapped saver
	if *mode == "interleaved" {
		if ov, err = saver.NewSaver(saver.AsyncOptions{StagingBytes: budget, Prefault: *prefault, Overlap: true}); err != nil {
			return err
		}
		if copyDst, err = bufpool.Map(int(res.StateBytes)); err != nil {
			return err
		}
		defer copyDst.Unmap()
		copyDst.Prefault()
	}
	if *cpuProf != "" {
		// Samples are labelled phase=step or phase=save (the save's
		// goroutines inherit it): go tool pprof -tagfocus phase=save.
		pf, err := os.Create(*cpuProf)
		if err != nil {
			return fmt.Errorf("cpuprofile: %w", err)
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			return fmt.Errorf("cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	saveLabels := pprof.WithLabels(ctx, pprof.Labels("phase", "save"))
	var prev *saver.Handle
	collect := func() error {
		if prev == nil {
			return nil
		}
		sr, err := prev.Wait(ctx)
		if err != nil {
			return err
		}
		res.Save = append(res.Save, prev.Elapsed().Seconds())
		res.Objects = len(sr.Metadata.Objects)
		prev = nil
		return nil
	}
	var urls []string
	removeOld := func() {
		for *keepLast > 0 && len(urls) > *keepLast {
			if st, err := openStore(ctx, urls[0]); err == nil {
				clearPrefix(ctx, st)
				st.Close()
			}
			if strings.HasPrefix(urls[0], "/") {
				os.RemoveAll(urls[0])
			}
			urls = urls[1:]
		}
	}
	step := func(n uint64) {
		t0 := time.Now()
		pprof.Do(ctx, pprof.Labels("phase", "step"), func(context.Context) {
			for p := range *passes {
				trainingStep(sds, n*uint64(*passes)+uint64(p)+1)
			}
		})
		res.Step = append(res.Step, time.Since(t0).Seconds())
		pprof.SetGoroutineLabels(saveLabels)
	}
	var steps, sink uint64
	// saveSync saves synchronously under u and returns the wall time.
	saveSync := func(u string, iter int64) (float64, error) {
		st, err := openStore(ctx, u)
		if err != nil {
			return 0, err
		}
		defer st.Close()
		t0 := time.Now()
		sr, err := saver.SaveLocal(ctx, st, sds, saver.Options{Iteration: iter})
		if err != nil {
			return 0, err
		}
		res.SyncObjects = len(sr.Metadata.Objects)
		return time.Since(t0).Seconds(), nil
	}
	// saveAsync starts an async save under u (waiting for the previous
	// one) and records its stall.
	saveAsync := func(u string, iter int64) error {
		st, err := openStore(ctx, u)
		if err != nil {
			return err
		}
		h, err := sv.SaveLocalAsync(ctx, st, sds, saver.Options{Iteration: iter})
		if err != nil {
			st.Close()
			return err
		}
		res.Stall = append(res.Stall, h.Stall().Seconds())
		res.Waited = append(res.Waited, h.Waited().Seconds())
		// The previous save has committed: collect it (and drop it, so
		// the phase itself retains nothing from save to save).
		if err := collect(); err != nil {
			return err
		}
		prev = h
		go func() { <-h.Done(); st.Close() }()
		return nil
	}
	for i := range *saves {
		iter := int64(i + 1)
		u := subPath(*rawURL, catalog.StepName(iter))
		switch *mode {
		case "sync":
			step(steps)
			steps++
			d, err := saveSync(u, iter)
			if err != nil {
				return err
			}
			res.Stall, res.Save = append(res.Stall, d), append(res.Save, d)
			res.Objects = res.SyncObjects
			rss, _ := procStatusKB("VmRSS")
			res.RSSAfter = append(res.RSSAfter, rss)
		case "async":
			step(steps)
			steps++
			if err := saveAsync(u, iter); err != nil {
				return err
			}
			// The previous save has committed (this one waited for it).
			rss, _ := procStatusKB("VmRSS")
			res.RSSAfter = append(res.RSSAfter, rss)
			res.LiveAfter = append(res.LiveAfter, liveHeap())
			if *settle {
				runtime.GC()
				debug.FreeOSMemory()
				rss, _ := procStatusKB("VmRSS")
				res.RSSSettled = append(res.RSSSettled, rss)
			}
		case "interleaved":
			// A step and a synchronous save; a step and an async save, a
			// step overlapping its upload, its commit; a plain copy of the
			// state (the memcpy ceiling of the stall), with one goroutine
			// per processor as staging copies, and with one.
			step(steps)
			d, err := saveSync(subPath(*rawURL, "sync-"+catalog.StepName(iter)), iter)
			if err != nil {
				return err
			}
			res.SyncSave = append(res.SyncSave, d)
			urls = append(urls, subPath(*rawURL, "sync-"+catalog.StepName(iter)))
			step(steps + 1)
			if err := saveAsync(u, iter); err != nil {
				return err
			}
			step(steps + 2)
			steps += 3
			if err := collect(); err != nil {
				return err
			}
			// Overlapped: the save returns once planned; read passes (the
			// next step's forward and backward) run while it stages; the
			// loop waits for staging, then the update writes the state.
			ou := subPath(*rawURL, "overlap-"+catalog.StepName(iter))
			ost, err := openStore(ctx, ou)
			if err != nil {
				return err
			}
			t0 := time.Now()
			oh, err := ov.SaveLocalAsync(ctx, ost, sds, saver.Options{Iteration: iter})
			if err != nil {
				return err
			}
			call := time.Since(t0)
			t1 := time.Now()
			for range max(*passes-1, 1) {
				sink ^= readPass(sds)
			}
			res.ReadOverlap = append(res.ReadOverlap, time.Since(t1).Seconds())
			t2 := time.Now()
			if err := oh.WaitStaged(ctx); err != nil {
				return err
			}
			wait := time.Since(t2)
			res.OverlapWait = append(res.OverlapWait, wait.Seconds())
			res.OverlapStall = append(res.OverlapStall, (call + wait).Seconds())
			trainingStep(sds, steps*uint64(*passes)+1)
			steps++
			if _, err := oh.Wait(ctx); err != nil {
				return err
			}
			ost.Close()
			urls = append(urls, ou)
			t3 := time.Now()
			for range max(*passes-1, 1) {
				sink ^= readPass(sds)
			}
			res.ReadPlain = append(res.ReadPlain, time.Since(t3).Seconds())
			res.Copy = append(res.Copy, copyState(sds, copyDst.Bytes(), runtime.GOMAXPROCS(0)).Seconds())
			res.Copy1 = append(res.Copy1, copyState(sds, copyDst.Bytes(), 1).Seconds())
		}
		urls = append(urls, u)
		removeOld()
	}
	if sv != nil {
		if err := collect(); err != nil {
			return err
		}
		rss, _ := procStatusKB("VmRSS")
		res.RSSAfter = append(res.RSSAfter, rss)
		res.StagingPeak = sv.Stats().PeakBytes
	}
	if res.PeakRSS, err = procStatusKB("VmHWM"); err != nil {
		return err
	}
	res.LastSaveURL = urls[len(urls)-1]
	if *memProf != "" {
		if err := writeHeapProfile(*memProf); err != nil {
			return err
		}
	}
	runtime.KeepAlive(sds)
	if sink == 1 {
		fmt.Fprintln(os.Stderr, "") // keeps the read passes from being optimised away
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

// copyState copies every tensor of sds back to back into dst with the
// given number of goroutines (disjoint, contiguous ranges of dst) and
// returns how long it took: what staging's copy cannot beat.
func copyState(sds []*statedict.StateDict, dst []byte, workers int) time.Duration {
	type job struct {
		src []byte
		off int
	}
	var jobs []job
	off := 0
	for _, sd := range sds {
		for _, k := range sd.Keys() {
			if t, ok := sd.Tensors[k]; ok {
				jobs = append(jobs, job{t.Data, off})
				off += len(t.Data)
			}
		}
	}
	per := (off + workers - 1) / workers
	t0 := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		lo, hi := w*per, min((w+1)*per, off)
		wg.Go(func() {
			for _, j := range jobs {
				a, b := max(lo, j.off), min(hi, j.off+len(j.src))
				if a < b {
					copy(dst[a:b], j.src[a-j.off:b-j.off])
				}
			}
		})
	}
	wg.Wait()
	return time.Since(t0)
}

// writeHeapProfile writes the allocation profile (every allocation since
// the start, sampled; -sample_index=alloc_space or inuse_space) to path.
func writeHeapProfile(path string) error {
	runtime.GC() // the profile is as of the last completed GC
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("memprofile: %w", err)
	}
	defer f.Close()
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		return fmt.Errorf("memprofile: %w", err)
	}
	return nil
}

// liveHeap is the heap marked live by the last GC.
func liveHeap() int64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}

// subPath appends name to a directory path or a URL's path.
func subPath(raw, name string) string {
	if strings.HasPrefix(raw, "/") {
		return filepath.Join(raw, name)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return raw + "/" + name
	}
	return subURL(u, name)
}

// asyncPhase runs one async-phase subprocess and decodes its result.
func asyncPhase(ctx context.Context, env []string, args ...string) (asyncPhaseResult, error) {
	var r asyncPhaseResult
	err := runPhase(ctx, env, append([]string{"async-phase"}, args...), &r)
	return r, err
}

// benchAsync measures figure 8 on the filesystem and on the S3 test
// server: sync saves, async saves of a cfg.size state (budget state +
// 64 MiB) and plain copies of the state, interleaved round by round with a
// training step before each save (stall per save, the ratio async stall /
// sync save of the same round, the memcpy ceiling); then, one phase per
// budget (state + 64 MiB, 256 MiB), save time and peak RSS above the state;
// and 100 consecutive async saves' RSS.
func benchAsync(ctx context.Context, cfg *config) ([]Row, error) {
	sz := strconv.FormatInt(cfg.size, 10)
	type target struct{ label, url string }
	targets := []target{{"fs", filepath.Join(cfg.work, "async")}}
	if u := os.Getenv("CKPTKIT_TEST_S3_URL"); u != "" {
		pu, err := url.Parse(u)
		if err != nil {
			return nil, fmt.Errorf("CKPTKIT_TEST_S3_URL: %w", err)
		}
		targets = append(targets, target{"s3", subURL(pu, fmt.Sprintf("ckptbench-async-%d-%d", os.Getpid(), time.Now().UnixNano()))})
	}
	var rows []Row
	for _, tg := range targets {
		// Timing: sync saves, async saves (budget state + 64 MiB) and plain
		// copies of the state, interleaved round by round in one process,
		// so that the ratios compare figures of the same moments.
		in, err := asyncPhase(ctx, nil, "-mode", "interleaved", "-url", subPath(tg.url, "interleaved"), "-size", sz, "-keep-last", "1")
		if err != nil {
			return nil, err
		}
		cfg.logf("async %s interleaved: sync %v stall %v (waiting %v) copy %v copy1 %v steps %v", tg.label, in.SyncSave, in.Stall, in.Waited, in.Copy, in.Copy1, in.Step)
		syncSave := newStat(in.SyncSave)
		name := fmt.Sprintf("%s async, budget %s", tg.label, humanBytes(in.BudgetBytes))
		stallRatio := newStat(divPairs(in.Stall, in.SyncSave))
		goal, met := "-", (*bool)(nil)
		if tg.label == "fs" {
			goal, met = "<= 0.1x", boolp(stallRatio.Median <= 0.1)
		}
		rows = append(rows,
			Row{Figure: fmt.Sprintf("%s sync save (%s, 5 saves)", tg.label, humanBytes(in.StateBytes)), Unit: "s", Value: statp(syncSave), Goal: "-",
				Note: fmt.Sprintf("stall = save time; %d objects; interleaved with the async saves (%d objects) and copies below; training step %.2f s", in.SyncObjects, in.Objects, newStat(in.Step).Median)},
			Row{Figure: name + ": stall per save", Unit: "s", Value: statp(newStat(in.Stall)), Baseline: statp(syncSave), Ratio: statp(stallRatio), Goal: goal, Met: met,
				Note: fmt.Sprintf("ratio = async stall / sync save of the same round (median [min, max] of the pairs); waiting for the previous save %.3f s of it (median); pool prefaulted", newStat(in.Waited).Median)},
			Row{Figure: fmt.Sprintf("%s memcpy ceiling: plain copy of the state, %d goroutines", tg.label, runtime.GOMAXPROCS(0)), Unit: "s", Value: statp(newStat(in.Copy)), Baseline: statp(syncSave),
				Ratio: statp(newStat(divPairs(in.Copy, in.SyncSave))), Goal: "- (reference)",
				Note: fmt.Sprintf("same round; into prefaulted huge-page memory; ratio = copy / sync save, the smallest stall ratio a copy allows; async stall / copy %.2f x; one goroutine %.3f s", newStat(divPairs(in.Stall, in.Copy)).Median, newStat(in.Copy1).Median)},
			Row{Figure: fmt.Sprintf("%s overlapped async (AsyncOptions.Overlap): stall per save", tg.label), Unit: "s", Value: statp(newStat(in.OverlapStall)), Baseline: statp(syncSave),
				Ratio: statp(newStat(divPairs(in.OverlapStall, in.SyncSave))), Goal: "<= 0.05x", Met: boolp(newStat(divPairs(in.OverlapStall, in.SyncSave)).Median <= 0.05),
				Note: fmt.Sprintf("same round; stall = the call (planning) + the wait for staging before the update (%.3f s median); staging overlaps 3 read passes over the state (the forward/backward stand-in; -step-passes 4 less the update)", newStat(in.OverlapWait).Median)},
			Row{Figure: fmt.Sprintf("%s forward/backward stand-in while a save stages", tg.label), Unit: "s", Value: statp(newStat(in.ReadOverlap)), Baseline: statp(newStat(in.ReadPlain)),
				Ratio: statp(newStat(divPairs(in.ReadOverlap, in.ReadPlain))), Goal: "- (the cost of overlap)",
				Note: "read passes over the whole state with staging running vs right after without a save, same round: the step-time cost of overlapped staging (memory bandwidth shared with the copy)"})

		// Memory: one phase per budget (state + 64 MiB, then below the state).
		for vi, budget := range []int64{0, 256 * mib} {
			a, err := asyncPhase(ctx, nil, "-mode", "async", "-url", subPath(tg.url, fmt.Sprintf("async-%d", vi)), "-size", sz, "-budget", strconv.FormatInt(budget, 10), "-keep-last", "1")
			if err != nil {
				return nil, err
			}
			cfg.logf("async %s budget %s: stall %v (waiting %v) save %v steps %v peak RSS +%d MiB", tg.label, humanBytes(a.BudgetBytes), a.Stall, a.Waited, a.Save, a.Step, (a.PeakRSS-a.BaseRSS)/mib)
			name := fmt.Sprintf("%s async, budget %s", tg.label, humanBytes(a.BudgetBytes))
			if a.BudgetBytes < a.StateBytes {
				rows = append(rows, Row{Figure: name + ": stall per save", Unit: "s", Value: statp(newStat(a.Stall)), Baseline: statp(syncSave), Ratio: statp(newStat(divAll(a.Stall, syncSave.Median))), Goal: "-",
					Note: fmt.Sprintf("ratio = async stall / median sync save above; a state larger than the budget is staged as uploads drain it; waiting %.3f s (median)", newStat(a.Waited).Median)})
			}
			above := float64(a.PeakRSS-a.BaseRSS) / mib
			lim := float64(a.BudgetBytes)/mib + 64
			rows = append(rows,
				Row{Figure: name + ": save time", Unit: "s", Value: statp(newStat(a.Save)), Goal: "-", Note: fmt.Sprintf("start to commit, overlapping the next step; %d objects", a.Objects)},
				Row{Figure: name + ": peak RSS above the state", Unit: "MiB", Value: statp(newStat([]float64{above})),
					Goal: fmt.Sprintf("<= budget + 64 MiB (%.0f)", lim), Met: boolp(above <= lim),
					Note: fmt.Sprintf("VmHWM after clear_refs, pool prefaulted after it; no GOMEMLIMIT; staging peak %d MiB", a.StagingPeak/mib)})
		}
	}
	// 100 consecutive async saves: RSS after each commit must not grow.
	const n = 100
	small := max(cfg.size/16, 16*mib)
	a, err := asyncPhase(ctx, nil, "-mode", "async", "-url", filepath.Join(cfg.work, "async-100"), "-size", strconv.FormatInt(small, 10),
		"-budget", strconv.FormatInt(small/4, 10), "-saves", strconv.Itoa(n), "-keep-last", "1", "-settle")
	if err != nil {
		return nil, err
	}
	// Raw RSS rises over the first saves while the Go heap grows to its
	// GC goal, then stays flat; the settled RSS (after a GC that returns
	// free memory) shows what the process keeps from save to save.
	const from = 10
	settled := a.RSSSettled
	var maxSettled, maxRaw int64
	for i := from - 1; i < len(settled); i++ {
		maxSettled = max(maxSettled, settled[i])
	}
	for _, v := range a.RSSAfter {
		maxRaw = max(maxRaw, v)
	}
	growth := float64(maxSettled-settled[from-1]) / mib
	cfg.logf("async x%d: settled RSS after save 1 %d MiB, %d: %d MiB, %d: %d MiB; raw RSS after save %d: %d MiB, max %d MiB", n,
		settled[0]/mib, from, settled[from-1]/mib, n, settled[len(settled)-1]/mib, n, a.RSSAfter[len(a.RSSAfter)-1]/mib, maxRaw/mib)
	rows = append(rows, Row{Figure: fmt.Sprintf("fs %d async saves (%s, budget %s): RSS growth, save %d -> %d", n, humanBytes(a.StateBytes), humanBytes(a.BudgetBytes), from, n),
		Unit: "MiB", Value: statp(newStat([]float64{growth})), Goal: "<= 8 MiB", Met: boolp(growth <= 8),
		Note: fmt.Sprintf("RSS after GC + FreeOSMemory at each commit: save 1 %d, %d %d, %d %d MiB; raw RSS (no forced GC) max %d MiB; state %d MiB; pool %d MiB reused",
			settled[0]/mib, from, settled[from-1]/mib, n, settled[len(settled)-1]/mib, maxRaw/mib, a.StateBytes/mib, a.StagingPeak/mib)})
	return rows, nil
}

// divPairs returns xs[i] / ys[i].
func divPairs(xs, ys []float64) []float64 {
	out := make([]float64, min(len(xs), len(ys)))
	for i := range out {
		out[i] = xs[i] / ys[i]
	}
	return out
}

func divAll(xs []float64, d float64) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = x / d
	}
	return out
}
