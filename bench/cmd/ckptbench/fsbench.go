package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/ckptkit/ckptkit/backend"
	_ "github.com/ckptkit/ckptkit/backend/fs" // file:// URLs
	"github.com/ckptkit/ckptkit/backend/instrument"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/saver"
	"github.com/ckptkit/ckptkit/statedict"
)

const mib = 1 << 20

// quietLogger discards the loader's summary lines.
func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// openStore opens a store on a URL (a plain directory becomes file://).
func openStore(ctx context.Context, raw string) (*backend.Store, error) {
	if strings.HasPrefix(raw, "/") {
		raw = "file://" + raw
	}
	st, err := backend.Open(ctx, raw)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", raw, err)
	}
	return st, nil
}

// ddWrite writes n bytes to path in 8 MiB blocks, then fdatasyncs and
// closes it: the sequential-write baseline.
func ddWrite(path string, n int64, block []byte) (time.Duration, error) {
	start := time.Now()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return 0, fmt.Errorf("baseline write: %w", err)
	}
	for left := n; left > 0; {
		b := block[:min(int64(len(block)), left)]
		if _, err := f.Write(b); err != nil {
			f.Close()
			return 0, fmt.Errorf("baseline write %s: %w", path, err)
		}
		left -= int64(len(b))
	}
	if err := syscall.Fdatasync(int(f.Fd())); err != nil {
		f.Close()
		return 0, fmt.Errorf("baseline fdatasync %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return 0, fmt.Errorf("baseline close %s: %w", path, err)
	}
	return time.Since(start), nil
}

// saveOnce saves sds into a fresh directory dir and returns the save's wall
// time (opening the store included).
func saveOnce(ctx context.Context, dir string, sds []*statedict.StateDict) (time.Duration, *saver.Result, error) {
	start := time.Now()
	st, err := openStore(ctx, dir)
	if err != nil {
		return 0, nil, err
	}
	defer st.Close()
	res, err := saver.SaveLocal(ctx, st, sds, saver.Options{})
	if err != nil {
		return 0, nil, fmt.Errorf("ckptkit save: %w", err)
	}
	return time.Since(start), res, nil
}

// benchFSSave measures figure 1 and returns its rows (against the fair
// parallel baseline, then the single stream) and the directory of the last
// checkpoint it saved (kept for the load figures).
func benchFSSave(ctx context.Context, cfg *config, specs []TensorSpec, sds []*statedict.StateDict) ([]Row, string, error) {
	total := specBytes(specs)
	block := make([]byte, 8*mib)
	fillRandom(block, 99)
	var base, par, ck, parCPU, ckCPU []time.Duration
	var keep string
	writers := len(sds) // one data object per rank at this size
	for i := 0; i < cfg.runs; i++ {
		syscall.Sync()
		c0 := cpuNow()
		d, err := parallelWrite(cfg.work, splitEven(total, writers), block)
		if err != nil {
			return nil, "", err
		}
		parCPU = append(parCPU, cpuNow()-c0)
		par = append(par, d)

		syscall.Sync()
		ddPath := filepath.Join(cfg.work, fmt.Sprintf("dd-%d.bin", i))
		d, err = ddWrite(ddPath, total, block)
		if err != nil {
			return nil, "", err
		}
		os.Remove(ddPath)
		base = append(base, d)

		syscall.Sync()
		dir := filepath.Join(cfg.work, fmt.Sprintf("save-%d", i))
		c0 = cpuNow()
		d, res, err := saveOnce(ctx, dir, sds)
		if err != nil {
			return nil, "", err
		}
		ckCPU = append(ckCPU, cpuNow()-c0)
		if res.BytesWritten != total {
			return nil, "", fmt.Errorf("ckptkit save wrote %d bytes, want %d", res.BytesWritten, total)
		}
		ck = append(ck, d)
		if keep != "" {
			os.RemoveAll(keep)
		}
		keep = dir
		if n := len(res.Metadata.Objects); n != writers {
			return nil, "", fmt.Errorf("ckptkit save wrote %d objects, the baseline %d files", n, writers)
		}
		cfg.logf("fs save run %d: %d parallel writers %.2fs, dd %.2fs, ckptkit %.2fs", i, writers, par[i].Seconds(), base[i].Seconds(), ck[i].Seconds())
	}
	if cfg.profDir != "" { // one more save, profiled, outside the figures
		if err := withCPUProfile(cfg.profDir, "save.pprof", func() error {
			_, _, err := saveOnce(ctx, filepath.Join(cfg.work, "save-prof"), sds)
			return err
		}); err != nil {
			return nil, "", err
		}
		os.RemoveAll(filepath.Join(cfg.work, "save-prof"))
	}
	name := fmt.Sprintf("fs save %d ranks, %d tensors (%s)", len(sds), len(specs), humanBytes(total))
	fair := throughputRow(name, total, par, ck, 0.9)
	fair.Note = fmt.Sprintf("baseline: %d files written by %d writers in parallel, 8 MiB writes + fdatasync each", writers, writers)
	single := throughputRow(name+", vs one stream", total, base, ck, 0.9)
	single.Goal, single.Met = "- (extra row)", nil
	single.Note = "baseline: one file, 8 MiB writes + fdatasync"
	cr := cpuRow(name, total, parCPU, ckCPU, 0.9)
	cr.Goal, cr.Met = "- (extra row: the save's goal is wall time)", nil
	cr.Note = "the baseline writes one 8 MiB block over and over (no checksum), ckptkit writes the tensors and computes every item's CRC32C; " + cr.Note
	return []Row{withLoad(fair), cr, withLoad(single)}, keep, nil
}

// throughputRow builds a row whose value and baseline are MiB/s of n bytes
// and whose ratio is baseline time / ckptkit time, met when >= goal.
func throughputRow(name string, n int64, base, ck []time.Duration, goal float64) Row {
	tp := func(ds []time.Duration) []float64 {
		out := make([]float64, len(ds))
		for i, d := range ds {
			out[i] = float64(n) / mib / d.Seconds()
		}
		return out
	}
	b, c := seconds(base), seconds(ck)
	ratio := newStat(pairRatios(b, c))
	// The ratio of medians is the headline; the pairwise ratios give its range.
	ratio.Median = newStat(b).Median / newStat(c).Median
	return Row{Figure: name, Unit: "MiB/s", Value: statp(newStat(tp(ck))), Baseline: statp(newStat(tp(base))),
		Ratio: &ratio, Goal: fmt.Sprintf("ratio >= %.2g", goal), Met: boolp(ratio.Median >= goal)}
}

// dataFiles lists the checkpoint's data objects in dir.
func dataFiles(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	var out []string
	for _, e := range ents {
		if e.Type().IsRegular() && e.Name() != metadata.ObjectKey && !strings.HasPrefix(e.Name(), ".") {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	sort.Strings(out)
	return out, nil
}

// seqRead reads every file fully into buf (grown as needed), sequentially:
// the page-cache read baseline.
func seqRead(files []string, buf *[]byte) (time.Duration, int64, error) {
	start := time.Now()
	var total int64
	for _, p := range files {
		f, err := os.Open(p)
		if err != nil {
			return 0, 0, fmt.Errorf("baseline read: %w", err)
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return 0, 0, fmt.Errorf("baseline read: %w", err)
		}
		if int64(cap(*buf)) < fi.Size() {
			*buf = make([]byte, fi.Size())
		}
		b := (*buf)[:fi.Size()]
		if _, err := io.ReadFull(f, b); err != nil {
			f.Close()
			return 0, 0, fmt.Errorf("baseline read %s: %w", p, err)
		}
		f.Close()
		total += fi.Size()
	}
	return time.Since(start), total, nil
}

// loadVariant is one way of loading the saved checkpoint.
type loadVariant struct {
	name  string
	world int
	opts  loader.Options
}

func loadVariants(size int64) []loadVariant {
	return []loadVariant{
		{"4->4 default", 4, loader.Options{}},
		{"4->2 default", 2, loader.Options{}},
		{"4->4 transactional", 4, loader.Options{Transactional: true}},
		{"4->4 transactional staged", 4, loader.Options{Transactional: true, StagingLimit: 2*size + 64*mib}},
	}
}

// loadResult is one instrumented load.
type loadResult struct {
	d             time.Duration
	rep           *loader.Report
	metaReads     int64
	dataReads     int64
	otherRequests int64
}

// loadOnce loads the checkpoint in dir into targets through an
// instrumented driver.
func loadOnce(ctx context.Context, dir string, targets []*statedict.StateDict, opts loader.Options) (loadResult, error) {
	opts.Logger = quietLogger()
	start := time.Now()
	st, err := openStore(ctx, dir)
	if err != nil {
		return loadResult{}, err
	}
	defer st.Close()
	c := instrument.Wrap(st.Driver())
	rep, err := loader.Load(ctx, st.WithDriver(c), targets, opts)
	if err != nil {
		return loadResult{}, fmt.Errorf("ckptkit load: %w", err)
	}
	d := time.Since(start)
	meta := c.CountKeySuffix(instrument.OpRead, metadata.ObjectKey)
	reads := c.Count(instrument.OpRead)
	return loadResult{d: d, rep: rep, metaReads: meta, dataReads: reads - meta, otherRequests: c.Total() - reads}, nil
}

// benchFSLoad measures figures 2 and 5 against the checkpoint in dir.
func benchFSLoad(ctx context.Context, cfg *config, specs []TensorSpec, dir string) ([]Row, error) {
	files, err := dataFiles(dir)
	if err != nil {
		return nil, err
	}
	var buf []byte
	bufs := make([][]byte, len(files))
	if _, _, err := parallelRead(files, bufs); err != nil { // warm the page cache and the buffers
		return nil, err
	}
	if _, _, err := seqRead(files, &buf); err != nil {
		return nil, err
	}
	total := specBytes(specs)
	var rows []Row
	var reqRows []Row
	targets := map[int][]*statedict.StateDict{}
	for _, v := range loadVariants(total) {
		if targets[v.world] == nil {
			targets[v.world] = targetState(specs, v.world)
		}
		tg := targets[v.world]
		// The warm-up load is profiled when --profile-dir is set.
		if err := withCPUProfile(cfg.profDir, "load-"+strings.NewReplacer(" ", "-", ">", "").Replace(v.name)+".pprof", func() error {
			_, err := loadOnce(ctx, dir, tg, v.opts)
			return err
		}); err != nil {
			return nil, err
		}
		var base, par, ck, parCPU, ckCPU []time.Duration
		var last loadResult
		for i := 0; i < cfg.runs; i++ {
			c0 := cpuNow()
			d, n, err := parallelRead(files, bufs)
			parCPU = append(parCPU, cpuNow()-c0)
			if err != nil {
				return nil, err
			}
			if n != total {
				return nil, fmt.Errorf("data files hold %d bytes, want %d", n, total)
			}
			par = append(par, d)
			d, n, err = seqRead(files, &buf)
			if err != nil {
				return nil, err
			}
			if n != total {
				return nil, fmt.Errorf("data files hold %d bytes, want %d", n, total)
			}
			base = append(base, d)
			c0 = cpuNow()
			lr, err := loadOnce(ctx, dir, tg, v.opts)
			if err != nil {
				return nil, err
			}
			ckCPU = append(ckCPU, cpuNow()-c0)
			ck = append(ck, lr.d)
			last = lr
		}
		if err := checkTargets(specs, tg); err != nil {
			return nil, fmt.Errorf("load %s: %w", v.name, err)
		}
		cfg.logf("fs load %s: mode %s, parallel baseline %v, sequential %v, ckptkit %v", v.name, last.rep.Mode, par, base, ck)
		name := fmt.Sprintf("fs load %s (mode %s)", v.name, last.rep.Mode)
		row := throughputRow(name, total, par, ck, 0.8)
		row.Note = fmt.Sprintf("baseline: %d parallel page-cache reads of the data files, one reader each; CRC32C on", len(files))
		if v.opts.Transactional {
			row.Goal, row.Met = "- (transactional: extra row)", nil
		}
		single := throughputRow(name+", vs one stream", total, base, ck, 0.8)
		single.Goal, single.Met = "- (extra row)", nil
		single.Note = "baseline: sequential page-cache read of the data files"
		cr := cpuRow(name, total, parCPU, ckCPU, 0.8)
		if v.opts.Transactional {
			cr.Goal, cr.Met = "- (extra row)", nil
		}
		rows = append(rows, withLoad(row), cr, withLoad(single))

		amp := float64(last.rep.BytesRead) / float64(last.rep.BytesNeeded)
		ar := Row{Figure: fmt.Sprintf("  read amplification %s", v.name), Unit: "x", Value: statp(newStat([]float64{amp})),
			Note: fmt.Sprintf("%d read requests (Report.ReadRequests %d), mode %s", last.dataReads, last.rep.ReadRequests, last.rep.Mode)}
		if last.rep.Mode == loader.ModeVerifyThenCopy {
			ar.Goal = "2.0 by design (verify, then copy)"
		} else {
			ar.Goal = "<= 1.05"
			ar.Met = boolp(amp <= 1.05)
		}
		rows = append(rows, ar)
		if v.name == "4->4 default" || v.name == "4->2 default" {
			reqRows = append(reqRows,
				Row{Figure: "metadata reads per load " + v.name, Unit: "count", Value: statp(newStat([]float64{float64(last.metaReads)})),
					Goal: "exactly 1", Met: boolp(last.metaReads == 1), Note: "instrument.Counter around the fs driver"},
				Row{Figure: "data read requests per load " + v.name, Unit: "count", Value: statp(newStat([]float64{float64(last.dataReads)})),
					Goal: "-", Note: fmt.Sprintf("%d data objects, %d other requests (stat/list)", len(files), last.otherRequests)})
		}
	}
	return append(rows, reqRows...), nil
}

// checkTargets verifies that a load filled every target with the source
// bytes (regenerated from the same seeds) so the benchmark cannot time a
// load that silently did nothing.
func checkTargets(specs []TensorSpec, targets []*statedict.StateDict) error {
	for i, s := range specs {
		if i%16 != 0 { // a sample keeps the check cheap
			continue
		}
		full := statedict.NewTensor(statedict.Float32, s.Shape...)
		fillRandom(full.Data, uint64(i)+1)
		for r, sd := range targets {
			want := statedict.RowShard(full, r, len(targets)).Data
			got := sd.Tensors[s.Key].Data
			if string(want) != string(got) {
				return fmt.Errorf("rank %d key %s: loaded bytes differ from the saved ones", r, s.Key)
			}
		}
	}
	return nil
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20))
	default:
		return fmt.Sprintf("%d B", n)
	}
}
