package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/run"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

// tierPlace is where a tiers figure puts the node-local tier.
type tierPlace struct {
	label string // "/dev/shm", "disk"
	dir   string // parent of the local runs
}

// benchTiers measures a run with a node-local tier in front of the durable
// one on the S3 test server (run.Tiered, docs/TIERS.md), against saving to
// the durable run alone, with the local tier in RAM (/dev/shm) and on the
// scratch directory's disk. Per round, interleaved: a synchronous save to
// the durable run (the baseline stall), a save to the local tier (the
// stall with tiers) and the background persist of that step to the durable
// run, then a resume from the local tier and, the local tier removed, from
// the durable one.
func benchTiers(ctx context.Context, cfg *config) ([]Row, error) {
	rawURL := os.Getenv("CKPTKIT_TEST_S3_URL")
	if rawURL == "" {
		return []Row{{Figure: "tiers", Goal: "local stall < durable", Skipped: "skipped: CKPTKIT_TEST_S3_URL not set (eval \"$(scripts/test-servers.sh start)\")"}}, nil
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("tiers: parse S3 URL: %w", err)
	}
	places := []tierPlace{{"disk", cfg.work}}
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		places = append([]tierPlace{{"/dev/shm", "/dev/shm"}}, places...)
	}
	const world = 4
	specs := modelSpec(cfg.size)
	sds := sourceState(specs, world)
	targets := targetState(specs, world)
	var rows []Row
	for _, p := range places {
		r, err := benchTierPlace(ctx, cfg, u, p, sds, targets)
		if err != nil {
			return nil, fmt.Errorf("tiers (%s): %w", p.label, err)
		}
		rows = append(rows, r...)
		runtime.GC()
	}
	return rows, nil
}

// tierRound is one round's figures.
type tierRound struct {
	durableSave, localSave, persist, fromLocal, fromDurable time.Duration
}

func benchTierPlace(ctx context.Context, cfg *config, u *url.URL, p tierPlace, sds, targets []*statedict.StateDict) ([]Row, error) {
	name := fmt.Sprintf("ckptbench-tiers-%d-%d", os.Getpid(), time.Now().UnixNano())
	localDir, err := os.MkdirTemp(p.dir, name)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(localDir)
	// The durable run of the tiers and a durable-only run, removed at the end.
	var durable, only *run.Run
	for _, o := range []struct {
		r    **run.Run
		name string
	}{{&durable, "durable"}, {&only, "only"}} {
		r, err := run.Open(ctx, subURL(u, name+"/"+o.name))
		if err != nil {
			return nil, err
		}
		defer func() {
			clearPrefix(context.Background(), r.Store())
			r.Close()
		}()
		*o.r = r
	}
	var rounds []tierRound
	for i := 0; i < cfg.runs; i++ {
		r, err := tierOnce(ctx, cfg, int64(i+1), filepath.Join(localDir, fmt.Sprint(i)), durable, only, sds, targets)
		if err != nil {
			return nil, err
		}
		cfg.logf("tiers %s round %d: durable save %s, local save %s, persist %s, resume local %s, durable %s",
			p.label, i, r.durableSave, r.localSave, r.persist, r.fromLocal, r.fromDurable)
		rounds = append(rounds, r)
	}
	col := func(f func(tierRound) time.Duration) []float64 {
		out := make([]float64, len(rounds))
		for i, r := range rounds {
			out[i] = f(r).Seconds()
		}
		return out
	}
	durSave, locSave := col(func(r tierRound) time.Duration { return r.durableSave }), col(func(r tierRound) time.Duration { return r.localSave })
	fromLoc, fromDur := col(func(r tierRound) time.Duration { return r.fromLocal }), col(func(r tierRound) time.Duration { return r.fromDurable })
	note := fmt.Sprintf("%s state, 4 ranks; durable: the S3 test server", humanBytes(specBytes(modelSpec(cfg.size))))
	stall := Row{Figure: "tiers: save stall, local " + p.label, Unit: "s", Value: statp(newStat(locSave)), Baseline: statp(newStat(durSave)),
		Ratio: statp(newStat(pairRatios(durSave, locSave))), Goal: "local < durable-only save", Note: note}
	stall.Met = boolp(stall.Ratio.Median > 1)
	persist := Row{Figure: "tiers: background persist, local " + p.label, Unit: "s", Value: statp(newStat(col(func(r tierRound) time.Duration { return r.persist }))),
		Baseline: statp(newStat(durSave)), Goal: "", Note: "baseline: the synchronous durable save of the same state"}
	recovery := Row{Figure: "tiers: resume from local " + p.label, Unit: "s", Value: statp(newStat(fromLoc)), Baseline: statp(newStat(fromDur)),
		Ratio: statp(newStat(pairRatios(fromDur, fromLoc))), Goal: "", Note: "baseline: resume from the durable tier (local tier removed)"}
	return []Row{stall, persist, recovery}, nil
}

// tierOnce runs one round at step: see benchTiers.
func tierOnce(ctx context.Context, cfg *config, step int64, localDir string, durable, only *run.Run, sds, targets []*statedict.StateDict) (tierRound, error) {
	var r tierRound
	start := time.Now()
	if _, err := only.SaveLocal(ctx, step, sds, saver.Options{}); err != nil {
		return r, fmt.Errorf("durable-only save: %w", err)
	}
	r.durableSave = time.Since(start)

	local, err := run.Open(ctx, localDir)
	if err != nil {
		return r, err
	}
	defer local.Close()
	t := run.NewTiered(local, durable, run.TierOptions{})
	defer t.Close(0)
	start = time.Now()
	if _, _, err := t.SaveLocal(ctx, step, sds, saver.Options{}); err != nil {
		return r, fmt.Errorf("local save: %w", err)
	}
	r.localSave = time.Since(start)
	ended, err := t.Wait(ctx, 0)
	r.persist = time.Since(start) - r.localSave
	if err != nil {
		return r, err
	}
	for _, p := range ended {
		if p.Err != nil {
			return r, fmt.Errorf("persist of step %d: %w", p.Step, p.Err)
		}
	}

	resume := func() (*run.TierResumed, time.Duration, error) {
		runtime.GC()
		start := time.Now()
		res, err := t.ResumeTiered(ctx, run.ResumeOptions{Load: run.Into(func() []*statedict.StateDict { return targets }, loader.Options{})})
		return res, time.Since(start), err
	}
	res, d, err := resume()
	if err != nil {
		return r, fmt.Errorf("resume from local: %w", err)
	}
	if res.Tier != run.TierLocal || res.Entry.Step != step {
		return r, fmt.Errorf("resume took step %d from the %s tier (%s), want step %d from local", res.Entry.Step, res.Tier, res.Why, step)
	}
	r.fromLocal = d
	if err := os.RemoveAll(localDir); err != nil {
		return r, err
	}
	res, d, err = resume()
	if err != nil {
		return r, fmt.Errorf("resume from durable: %w", err)
	}
	if res.Tier != run.TierDurable || res.Entry.Step != step {
		return r, fmt.Errorf("resume took step %d from the %s tier (%s), want step %d from durable", res.Entry.Step, res.Tier, res.Why, step)
	}
	r.fromDurable = d
	return r, nil
}
