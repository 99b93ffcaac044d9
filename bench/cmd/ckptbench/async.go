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
	"strconv"
	"strings"
	"time"

	"github.com/ckptkit/ckptkit/catalog"
	"github.com/ckptkit/ckptkit/internal/bytesize"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

// asyncPhaseResult is what an async-phase subprocess prints (JSON).
type asyncPhaseResult struct {
	Stall       []float64 `json:"stall_s"`       // per save: time the loop was blocked
	Waited      []float64 `json:"waited_s"`      // per save: the part of Stall waiting for the previous save
	Save        []float64 `json:"save_s"`        // per save: start to commit
	Step        []float64 `json:"step_s"`        // per training step (the compute between two saves)
	BaseRSS     int64     `json:"base_rss"`      // with the state built
	PeakRSS     int64     `json:"peak_rss"`      // VmHWM
	RSSAfter    []int64   `json:"rss_after"`     // after each save's commit
	RSSSettled  []int64   `json:"rss_settled"`   // the same, after runtime.GC + debug.FreeOSMemory (-settle)
	LiveAfter   []int64   `json:"live_after"`    // live heap at the last GC, same moments
	StagingPeak int64     `json:"staging_peak"`  // saver.Stats().PeakBytes
	StateBytes  int64     `json:"state_bytes"`   // the caller's state
	BudgetBytes int64     `json:"budget_bytes"`  // the staging budget
	Objects     int       `json:"objects"`       // data objects of the last save
	LastSaveURL string    `json:"last_save_url"` // the last checkpoint
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

// runAsyncPhase is the body of the "async-phase" subprocess: it builds a
// state of -size bytes over -world ranks and saves it -saves times, sync or
// async, with a training step of -step-passes passes over every tensor
// before each save, under -url (a directory or an object-store URL; one
// sub-prefix per save, the previous one removed with -keep-last 1).
func runAsyncPhase(args []string) error {
	fs := flag.NewFlagSet("async-phase", flag.ContinueOnError)
	mode := fs.String("mode", "async", "sync or async")
	rawURL := fs.String("url", "", "run directory or URL")
	sizeS := fs.String("size", "1GiB", "state size")
	budgetS := fs.String("budget", "0", "staging budget (0: the state size + 1 MiB)")
	saves := fs.Int("saves", 5, "number of saves")
	world := fs.Int("world", 4, "ranks")
	keepLast := fs.Int("keep-last", 0, "remove older checkpoints, keeping this many (0: keep all)")
	passes := fs.Int("step-passes", 4, "passes over the whole state per training step (the compute between saves)")
	settle := fs.Bool("settle", false, "after each commit, also record RSS after a GC that returns free memory to the OS")
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
		budget = res.StateBytes + mib
	}
	var sv *saver.Saver
	if *mode == "async" {
		if sv, err = saver.NewSaver(saver.AsyncOptions{StagingBytes: budget}); err != nil {
			return err
		}
		res.BudgetBytes = budget
	}
	if res.BaseRSS, err = resetPeakRSS(); err != nil {
		return err
	}
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
	for i := range *saves {
		t0 := time.Now()
		for p := range *passes {
			trainingStep(sds, uint64(i**passes+p)+1)
		}
		res.Step = append(res.Step, time.Since(t0).Seconds())
		u := subPath(*rawURL, catalog.StepName(int64(i+1)))
		st, err := openStore(ctx, u)
		if err != nil {
			return err
		}
		if sv == nil {
			t0 := time.Now()
			sr, err := saver.SaveLocal(ctx, st, sds, saver.Options{Iteration: int64(i + 1)})
			st.Close()
			if err != nil {
				return err
			}
			d := time.Since(t0).Seconds()
			res.Stall, res.Save = append(res.Stall, d), append(res.Save, d)
			res.Objects = len(sr.Metadata.Objects)
			rss, _ := procStatusKB("VmRSS")
			res.RSSAfter = append(res.RSSAfter, rss)
		} else {
			h, err := sv.SaveLocalAsync(ctx, st, sds, saver.Options{Iteration: int64(i + 1)})
			if err != nil {
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
	runtime.KeepAlive(sds)
	return json.NewEncoder(os.Stdout).Encode(res)
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

// benchAsync measures figure 7: sync vs async saves of a cfg.size state,
// 5 saves with a training step before each, on the filesystem and on the
// S3 test server; stall per save, save time, peak RSS above the state, the
// ratio async stall / sync save time; and 100 consecutive async saves'
// RSS.
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
		// state+1MiB, then a budget below the state; on an object store also
		// that one with GOMEMLIMIT at state + budget + 64 MiB, which makes
		// the GC collect the SDK's per-request garbage in time.
		type variant struct {
			budget int64
			env    []string
		}
		below := int64(256 * mib)
		variants := []variant{{0, nil}, {below, nil}}
		if tg.label != "fs" {
			variants = append(variants, variant{below, []string{fmt.Sprintf("GOMEMLIMIT=%dMiB", (specBytes(modelSpec(cfg.size))+below)/mib+64)}})
		}
		sync, err := asyncPhase(ctx, nil, "-mode", "sync", "-url", subPath(tg.url, "sync"), "-size", sz, "-keep-last", "1")
		if err != nil {
			return nil, err
		}
		cfg.logf("async %s sync: stall %v save %v steps %v", tg.label, sync.Stall, sync.Save, sync.Step)
		syncSave := newStat(sync.Save)
		rows = append(rows, Row{Figure: fmt.Sprintf("%s sync save (%s, 5 saves)", tg.label, humanBytes(sync.StateBytes)), Unit: "s", Value: statp(syncSave),
			Goal: "-", Note: fmt.Sprintf("stall = save time; %d objects; peak RSS above state %d MiB; training step between saves %.2f s", sync.Objects, (sync.PeakRSS-sync.BaseRSS)/mib, newStat(sync.Step).Median)})
		for vi, v := range variants {
			b := strconv.FormatInt(v.budget, 10)
			a, err := asyncPhase(ctx, v.env, "-mode", "async", "-url", subPath(tg.url, fmt.Sprintf("async-%d", vi)), "-size", sz, "-budget", b, "-keep-last", "1")
			if err != nil {
				return nil, err
			}
			cfg.logf("async %s budget %s: stall %v (waiting %v) save %v steps %v peak RSS +%d MiB", tg.label, humanBytes(a.BudgetBytes), a.Stall, a.Waited, a.Save, a.Step, (a.PeakRSS-a.BaseRSS)/mib)
			stall, save := newStat(a.Stall), newStat(a.Save)
			ratio := newStat(divAll(a.Stall, syncSave.Median))
			name := fmt.Sprintf("%s async, budget %s", tg.label, humanBytes(a.BudgetBytes))
			if len(v.env) > 0 {
				name += ", " + strings.Join(v.env, " ")
			}
			goal, met := "-", (*bool)(nil)
			if tg.label == "fs" && a.BudgetBytes >= a.StateBytes {
				goal, met = "<= 0.1x", boolp(ratio.Median <= 0.1)
			}
			rows = append(rows,
				Row{Figure: name + ": stall per save", Unit: "s", Value: statp(stall), Baseline: statp(syncSave), Ratio: statp(ratio), Goal: goal, Met: met,
					Note: fmt.Sprintf("ratio = async stall / sync save time (baseline); waiting for the previous save %.3f s of it (median); 1st save allocates the pool", newStat(a.Waited).Median)},
				Row{Figure: name + ": save time", Unit: "s", Value: statp(save), Goal: "-", Note: fmt.Sprintf("start to commit, overlapping the next step; %d objects", a.Objects)})
			above := float64(a.PeakRSS-a.BaseRSS) / mib
			lim := float64(a.BudgetBytes)/mib + 64
			rows = append(rows, Row{Figure: name + ": peak RSS above the state", Unit: "MiB", Value: statp(newStat([]float64{above})),
				Goal: fmt.Sprintf("<= budget + 64 MiB (%.0f)", lim), Met: boolp(above <= lim),
				Note: fmt.Sprintf("VmHWM after clear_refs; staging peak %d MiB", a.StagingPeak/mib)})
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

func divAll(xs []float64, d float64) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = x / d
	}
	return out
}
