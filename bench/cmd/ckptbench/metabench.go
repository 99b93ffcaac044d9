package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/planner"
	"github.com/ckptkit/ckptkit/statedict"
)

// Synthetic metadata geometry: every tensor is [metaRows, 16] float32 saved
// as metaSaveWorld row chunks and loaded by metaLoadWorld ranks.
const (
	metaSaveWorld = 4
	metaLoadWorld = 3
	metaRows      = 12
)

// metaPlans builds the local plans of metaSaveWorld ranks each offering its
// row chunk of entries/metaSaveWorld tensors.
func metaPlans(entries int) []planner.LocalPlan {
	tensors := entries / metaSaveWorld
	shape := []int64{metaRows, 16}
	plans := make([]planner.LocalPlan, metaSaveWorld)
	for r := range plans {
		plans[r] = planner.LocalPlan{Rank: r, Items: make([]planner.SaveItem, 0, tensors)}
	}
	for t := 0; t < tensors; t++ {
		// Realistic keys: block, layer and parameter names of varying length.
		key := fmt.Sprintf("model.blocks.%d.layers.%d.%s.weight", t/1000, t%1000, [...]string{"attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"}[t%4])
		for r := range plans {
			lo, hi := statedict.SplitRange(shape[0], r, metaSaveWorld)
			sizes := []int64{hi - lo, shape[1]}
			plans[r].Items = append(plans[r].Items, planner.SaveItem{Key: key, Kind: planner.TensorItem, DType: "float32",
				GlobalShape: shape, Offsets: []int64{lo, 0}, Sizes: sizes, Length: statedict.NumElements(sizes) * 4})
		}
	}
	return plans
}

// metaRequests asks for every tensor, row-split over metaLoadWorld ranks.
func metaRequests(md *metadata.Checkpoint) []planner.ReadRequest {
	reqs := make([]planner.ReadRequest, 0, len(md.Tensors)*metaLoadWorld)
	for i := range md.Tensors {
		te := &md.Tensors[i]
		for r := 0; r < metaLoadWorld; r++ {
			lo, hi := statedict.SplitRange(te.Shape[0], r, metaLoadWorld)
			reqs = append(reqs, planner.ReadRequest{Key: te.Key, Kind: planner.TensorItem, DType: te.DType,
				Offsets: []int64{lo, 0}, Sizes: []int64{hi - lo, te.Shape[1]}})
		}
	}
	return reqs
}

// metaResult holds the timings of one size.
type metaResult struct {
	entries                                      int
	planSave, encode, decode, planLoad, coverage []time.Duration
	bytesPerEntry                                float64
	// cpu holds each step's CPU time per run, by profile name
	// ("plansave", "encode", ...).
	cpu map[string][]time.Duration
}

// timedCPU runs f after a GC (so that garbage of the previous step is not
// charged to it) and returns its wall time and the CPU time it used
// (getrusage, the whole process: garbage collection included, waiting for
// a core not).
func timedCPU(f func() error) (wall, cpu time.Duration, err error) {
	runtime.GC()
	c0, start := cpuNow(), time.Now()
	err = f()
	return time.Since(start), cpuNow() - c0, err
}

// benchMetaSize measures figure 4 for one entry count. With profDir set,
// CPU profiles of decode and plan-save are written there.
func benchMetaSize(cfg *config, entries int, profDir string) (*metaResult, error) {
	plans := metaPlans(entries)
	res := &metaResult{entries: entries, cpu: map[string][]time.Duration{}}
	var gp *planner.GlobalPlan
	var enc []byte
	var md *metadata.Checkpoint
	prof := func(name string, f func() error) (d time.Duration, err error) {
		perr := withCPUProfile(profDir, name, func() error {
			var cpu time.Duration
			d, cpu, err = timedCPU(f)
			step := strings.TrimSuffix(name, fmt.Sprintf("-%d.pprof", entries))
			res.cpu[step] = append(res.cpu[step], cpu)
			return nil
		})
		if perr != nil {
			return 0, perr
		}
		return d, err
	}
	for i := 0; i < cfg.runs; i++ {
		pd := ""
		if i == 0 {
			pd = profDir
		}
		profile := func(name string, f func() error) (time.Duration, error) {
			if pd == "" {
				d, cpu, err := timedCPU(f)
				res.cpu[name] = append(res.cpu[name], cpu)
				return d, err
			}
			return prof(fmt.Sprintf("%s-%d.pprof", name, entries), f)
		}
		d, err := profile("plansave", func() (err error) {
			gp, err = planner.PlanSave(plans, planner.SaveOptions{})
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("plan save %d entries: %w", entries, err)
		}
		res.planSave = append(res.planSave, d)
		// The saver fills CRCs; fill plausible values so encoded sizes are real.
		m := gp.Metadata
		var x uint32 = 2463534242
		for ti := range m.Tensors {
			for ci := range m.Tensors[ti].Chunks {
				x ^= x << 13
				x ^= x >> 17
				x ^= x << 5
				m.Tensors[ti].Chunks[ci].CRC32C = x
			}
		}
		m.Writer = "ckptkit/bench"
		m.CreatedAt = time.Now().UTC().Truncate(time.Millisecond)
		if d, err = profile("encode", func() (err error) {
			enc, err = metadata.Encode(m)
			return err
		}); err != nil {
			return nil, fmt.Errorf("encode %d entries: %w", entries, err)
		}
		res.encode = append(res.encode, d)
		if d, err = profile("decode", func() (err error) {
			md, err = metadata.Decode(enc)
			return err
		}); err != nil {
			return nil, fmt.Errorf("decode %d entries: %w", entries, err)
		}
		res.decode = append(res.decode, d)
		reqs := metaRequests(md)
		if d, err = profile("planload", func() error {
			lp, err := planner.PlanLoad(md, reqs, planner.LoadOptions{})
			if err == nil && lp.BytesRead != lp.BytesNeeded {
				err = fmt.Errorf("read %d bytes for %d needed", lp.BytesRead, lp.BytesNeeded)
			}
			return err
		}); err != nil {
			return nil, fmt.Errorf("plan load %d entries: %w", entries, err)
		}
		res.planLoad = append(res.planLoad, d)
		if d, err = profile("coverage", func() error {
			for ti := range md.Tensors {
				if err := planner.CheckCoverage(&md.Tensors[ti]); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return nil, fmt.Errorf("coverage %d entries: %w", entries, err)
		}
		res.coverage = append(res.coverage, d)
	}
	res.bytesPerEntry = float64(len(enc)) / float64(entries)
	cfg.logf("metadata %d entries: %d bytes; plan save %v, encode %v, decode %v, plan load %v, coverage %v",
		entries, len(enc), res.planSave, res.encode, res.decode, res.planLoad, res.coverage)
	return res, nil
}

// benchMeta measures figure 4 for every size of cfg.metaSizes and returns
// its rows.
func benchMeta(cfg *config) ([]Row, error) {
	var results []*metaResult
	for i, n := range cfg.metaSizes {
		pd := ""
		if i == len(cfg.metaSizes)-1 {
			pd = cfg.profDir
		}
		r, err := benchMetaSize(cfg, n, pd)
		if err != nil {
			return nil, err
		}
		results = append(results, r)
	}
	var rows []Row
	steps := []struct {
		name    string
		get     func(*metaResult) []time.Duration
		oneSecG bool   // the "under 0.5 s at 1M entries" goal applies
		cpu     string // the step's name in metaResult.cpu
	}{
		{"plan save + validate (PlanSave)", func(r *metaResult) []time.Duration { return r.planSave }, true, "plansave"},
		{"metadata.Encode", func(r *metaResult) []time.Duration { return r.encode }, true, "encode"},
		{"metadata.Decode", func(r *metaResult) []time.Duration { return r.decode }, true, "decode"},
		{"plan resharded load 4->3 (PlanLoad)", func(r *metaResult) []time.Duration { return r.planLoad }, true, "planload"},
		{"CheckCoverage, all tensors", func(r *metaResult) []time.Duration { return r.coverage }, false, "coverage"},
	}
	for _, s := range steps {
		for i, r := range results {
			cur := newStat(seconds(s.get(r)))
			row := Row{Figure: fmt.Sprintf("%s, %s entries", s.name, countName(r.entries)), Unit: "s", Value: &cur}
			var goals []string
			met := true
			if i > 0 {
				prev := newStat(seconds(s.get(results[i-1])))
				growth := newStat(pairRatios(seconds(s.get(r)), seconds(s.get(results[i-1]))))
				growth.Median = cur.Median / prev.Median
				row.Baseline = &prev
				row.Ratio = &growth
				row.Note = fmt.Sprintf("baseline: %s entries; ratio = growth", countName(results[i-1].entries))
				factor := float64(r.entries) / float64(results[i-1].entries)
				limit := 11 * factor / 10
				goals = append(goals, fmt.Sprintf("growth <= %.3gx", limit))
				met = met && growth.Median <= limit
			}
			if s.oneSecG && r.entries >= 1_000_000 {
				goals = append(goals, "< 0.5 s")
				met = met && cur.Median < 0.5
			}
			if len(goals) > 0 {
				row.Goal = joinGoals(goals)
				row.Met = boolp(met)
			} else {
				row.Goal = "-"
			}
			rows = append(rows, row)
			// Every size has a CPU-time twin (getrusage, same runs), with
			// its own growth: on a shared machine wall time includes
			// waiting for a core, CPU time does not.
			if cpu := r.cpu[s.cpu]; len(cpu) > 0 {
				c := newStat(seconds(cpu))
				cr := Row{Figure: fmt.Sprintf("%s, %s entries, CPU time", s.name, countName(r.entries)), Unit: "CPU s", Value: &c, Goal: "-",
					Note: "getrusage user+system of the process (garbage collection included), same runs; steadier than wall time on a shared machine"}
				var goals []string
				met := true
				if prevCPU := results[max(i-1, 0)].cpu[s.cpu]; i > 0 && len(prevCPU) > 0 {
					prev := newStat(seconds(prevCPU))
					growth := newStat(pairRatios(seconds(cpu), seconds(prevCPU)))
					growth.Median = c.Median / prev.Median
					cr.Baseline, cr.Ratio = &prev, &growth
					limit := 11 * float64(r.entries) / float64(results[i-1].entries) / 10
					goals = append(goals, fmt.Sprintf("growth <= %.3gx", limit))
					met = growth.Median <= limit
				}
				if s.oneSecG && r.entries >= 1_000_000 {
					goals = append(goals, "< 0.5 s")
					met = met && c.Median < 0.5
				}
				if len(goals) > 0 {
					cr.Goal, cr.Met = joinGoals(goals), boolp(met)
				}
				rows = append(rows, withLoad(cr))
			}
		}
	}
	for _, r := range results {
		rows = append(rows, Row{Figure: fmt.Sprintf("metadata bytes per entry, %s entries", countName(r.entries)), Unit: "B/entry",
			Value: statp(newStat([]float64{float64(int(r.bytesPerEntry*10)) / 10})), Goal: "<= 150", Met: boolp(r.bytesPerEntry <= 150)})
	}
	return rows, nil
}

func joinGoals(g []string) string {
	s := g[0]
	for _, x := range g[1:] {
		s += ", " + x
	}
	return s
}

func countName(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	default:
		return fmt.Sprint(n)
	}
}

// withCPUProfile runs f under a CPU profile written to dir/name (no
// profile when dir is empty).
func withCPUProfile(dir, name string, f func() error) error {
	if dir == "" {
		return f()
	}
	pf, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	defer pf.Close()
	if err := pprof.StartCPUProfile(pf); err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	defer pprof.StopCPUProfile()
	return f()
}
