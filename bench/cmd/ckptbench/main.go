// Command ckptbench measures ckptkit against plain baselines on the same
// machine and prints a table (also written as JSON):
//
//   - fs save (saver.SaveLocal, 4 ranks) vs a dd-style sequential write
//     with fdatasync;
//   - fs load (same world size and resharded; default one-pass and transactional modes)
//     vs a sequential page-cache read of the same files, with read
//     amplification and request counts;
//   - S3 and GCS save/load vs raw SDK transfers (a load against the SDK's
//     own CRC32C-checked read of the same objects), when CKPTKIT_TEST_S3_URL /
//     CKPTKIT_TEST_GCS_URL are set;
//   - metadata scale (planning, encode, decode, load planning, coverage at
//     10k/100k/1M entries);
//   - peak RSS and heap above the data buffers during save and load;
//   - sync vs async saves (stall per save, save time, peak RSS above the
//     state, 100 consecutive async saves) on fs and the S3 test server.
//
// Every timed figure is the median of --runs runs with min and max, and is
// reported as a ratio against a baseline measured in the same run.
//
// Usage:
//
//	ckptbench [--size 1GiB] [--runs 3] [--dir /tmp] [--json bench/results.json]
//	ckptbench dcp --dir D [--size 1GiB]   # ckptkit timings for bench/dcp_compare.sh
//	ckptbench spec [--size 1GiB]          # the tensor list, as JSON
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/ckptkit/ckptkit/loader"
)

// config is the parsed command line of a benchmark run.
type config struct {
	size            int64
	remoteSize      int64
	runs            int
	work            string // scratch directory (removed at the end)
	jsonPath        string
	metaSizes       []int
	profDir         string
	only            map[string]bool
	memLimitVariant bool
	verbose         bool
}

func (c *config) logf(format string, a ...any) {
	if c.verbose {
		fmt.Fprintf(os.Stderr, "ckptbench: "+format+"\n", a...)
	}
}

func (c *config) want(fig string) bool { return len(c.only) == 0 || c.only[fig] }

func defaultLoadOpts() loader.Options { return loader.Options{} }

func main() {
	var err error
	args := os.Args[1:]
	switch {
	case len(args) > 0 && args[0] == "mem-phase":
		err = runMemPhase(args[1:])
	case len(args) > 0 && args[0] == "async-phase":
		err = runAsyncPhase(args[1:])
	case len(args) > 0 && args[0] == "dcp":
		err = runDCP(args[1:])
	case len(args) > 0 && args[0] == "spec":
		err = runSpec(args[1:])
	default:
		err = runBench(args)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ckptbench:", err)
		os.Exit(1)
	}
}

// Results is the JSON document written to --json.
type Results struct {
	Started  time.Time      `json:"started"`
	Duration string         `json:"duration"`
	Machine  map[string]any `json:"machine"`
	Config   map[string]any `json:"config"`
	Rows     []Row          `json:"rows"`
}

func runBench(args []string) error {
	fs := flag.NewFlagSet("ckptbench", flag.ContinueOnError)
	sizeS := fs.String("size", "1GiB", "checkpoint data size for the fs and memory figures")
	remoteS := fs.String("remote-size", "256MiB", "data size for the S3/GCS figures")
	runs := fs.Int("runs", 3, "runs per figure (median, min, max); at least 3")
	dir := fs.String("dir", os.TempDir(), "parent of the scratch directory (the filesystem under test)")
	jsonPath := fs.String("json", "bench/results.json", "where to write the results as JSON (empty: do not)")
	metaS := fs.String("meta-sizes", "10000,100000,1000000", "metadata entry counts")
	prof := fs.String("profile-dir", "", "write CPU profiles of the largest metadata size here")
	only := fs.String("only", "", "comma-separated figures to run: save,load,remote,meta,mem,async,tiers (default all)")
	memLim := fs.Bool("memlimit-variant", true, "also measure loads with GOMEMLIMIT just above the buffers")
	verbose := fs.Bool("v", true, "log progress to stderr")
	mdPath := fs.String("markdown", "", "also write the table as Markdown to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg := &config{runs: max(*runs, 3), jsonPath: *jsonPath, profDir: *prof, memLimitVariant: *memLim, verbose: *verbose, only: map[string]bool{}}
	var err error
	if cfg.size, err = positiveSize(*sizeS); err != nil {
		return err
	}
	if cfg.remoteSize, err = positiveSize(*remoteS); err != nil {
		return err
	}
	for _, s := range strings.Split(*metaS, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 4 {
			return fmt.Errorf("--meta-sizes: %q is not a count >= 4", s)
		}
		cfg.metaSizes = append(cfg.metaSizes, n)
	}
	for _, s := range strings.Split(*only, ",") {
		if s = strings.TrimSpace(s); s != "" {
			cfg.only[s] = true
		}
	}
	if cfg.profDir != "" {
		if err := os.MkdirAll(cfg.profDir, 0o755); err != nil {
			return fmt.Errorf("profile dir: %w", err)
		}
	}
	if cfg.work, err = os.MkdirTemp(*dir, "ckptbench-"); err != nil {
		return fmt.Errorf("scratch dir: %w", err)
	}
	defer os.RemoveAll(cfg.work)

	// An interrupt cancels the running figure, so the scratch directory is
	// still removed.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	res := &Results{Started: start.UTC(), Machine: machineInfo(cfg.work), Config: map[string]any{
		"size": cfg.size, "remote_size": cfg.remoteSize, "runs": cfg.runs, "dir": cfg.work, "meta_sizes": cfg.metaSizes}}
	cfg.logf("machine: %v", res.Machine)
	snap0, snapErr := takeCPUSnapshot()

	specs := modelSpec(cfg.size)
	var ckptDir string
	if cfg.want("save") || cfg.want("load") || cfg.want("mem") {
		sds := sourceState(specs, 4)
		rows, dir, err := benchFSSave(ctx, cfg, specs, sds)
		if err != nil {
			return err
		}
		ckptDir = dir
		if cfg.want("save") {
			res.Rows = append(res.Rows, rows...)
		}
		sds = nil
		runtime.GC()
	}
	if cfg.want("load") {
		rows, err := benchFSLoad(ctx, cfg, specs, ckptDir)
		if err != nil {
			return err
		}
		res.Rows = append(res.Rows, rows...)
		runtime.GC()
	}
	if cfg.want("remote") {
		res.Rows = append(res.Rows, benchRemote(ctx, cfg, "s3", "CKPTKIT_TEST_S3_URL")...)
		res.Rows = append(res.Rows, benchRemote(ctx, cfg, "gcs", "CKPTKIT_TEST_GCS_URL")...)
		runtime.GC()
	}
	if cfg.want("meta") {
		rows, err := benchMeta(cfg)
		if err != nil {
			return err
		}
		res.Rows = append(res.Rows, rows...)
		runtime.GC()
	}
	if cfg.want("mem") {
		rows, err := benchMemory(ctx, cfg, ckptDir)
		if err != nil {
			return err
		}
		res.Rows = append(res.Rows, rows...)
	}
	if cfg.want("async") {
		rows, err := benchAsync(ctx, cfg)
		if err != nil {
			return err
		}
		res.Rows = append(res.Rows, rows...)
	}
	if cfg.want("tiers") {
		rows, err := benchTiers(ctx, cfg)
		if err != nil {
			return err
		}
		res.Rows = append(res.Rows, rows...)
	}
	os.RemoveAll(cfg.work) // before printing: a closed stdout must not leave it behind
	res.Machine["loadavg_end"] = loadAvg()
	if snap1, err := takeCPUSnapshot(); err == nil && snapErr == nil {
		others, own := othersShare(snap0, snap1)
		res.Machine["cpu_used_by_others"] = fmt.Sprintf("%.0f%%", others*100)
		res.Machine["cpu_used_by_bench"] = fmt.Sprintf("%.0f%%", own*100)
	}
	res.Duration = time.Since(start).Round(time.Second).String()
	printTable(os.Stdout, res)
	if *mdPath != "" {
		if err := os.WriteFile(*mdPath, []byte(markdownTable(res)), 0o644); err != nil {
			return fmt.Errorf("write markdown: %w", err)
		}
	}
	if cfg.jsonPath != "" {
		b, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			return fmt.Errorf("encode results: %w", err)
		}
		if err := os.MkdirAll(filepath.Dir(cfg.jsonPath), 0o755); err != nil {
			return fmt.Errorf("write results: %w", err)
		}
		if err := os.WriteFile(cfg.jsonPath, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("write results: %w", err)
		}
		fmt.Printf("\nwrote %s\n", cfg.jsonPath)
	}
	return nil
}

// printTable writes the human-readable table.
func printTable(w *os.File, res *Results) {
	fmt.Fprintf(w, "ckptbench  %s  nproc=%v  mem=%v  disk=%v\nloadavg start=%v end=%v  CPU used by others %v, by the bench %v (of all cores)  took %s\n\n",
		res.Started.Format(time.RFC3339), res.Machine["nproc"], res.Machine["mem_total"], res.Machine["disk"],
		res.Machine["loadavg_start"], res.Machine["loadavg_end"], res.Machine["cpu_used_by_others"], res.Machine["cpu_used_by_bench"], res.Duration)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tvalue\tbaseline\tratio\tgoal\tmet?\tnote")
	for i := range res.Rows {
		r := &res.Rows[i]
		if r.Skipped != "" {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t%s\tskipped\t%s\n", r.Figure, r.Goal, r.Skipped)
			continue
		}
		ratio := "-"
		if r.Ratio != nil {
			ratio = fmtStat(r.Ratio, "x")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Figure, fmtStat(r.Value, r.Unit), fmtStat(r.Baseline, r.Unit), ratio, r.Goal, r.metString(), r.Note)
	}
	tw.Flush()
}

// markdownTable renders the rows as a Markdown table.
func markdownTable(res *Results) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Run %s, %s; nproc %v, %v; load average %v -> %v; CPU used by others %v, by the bench %v.\n\n",
		res.Started.Format(time.RFC3339), res.Duration, res.Machine["nproc"], res.Machine["mem_total"],
		res.Machine["loadavg_start"], res.Machine["loadavg_end"], res.Machine["cpu_used_by_others"], res.Machine["cpu_used_by_bench"])
	b.WriteString("| figure | value | baseline | ratio | goal | met? |\n| --- | --- | --- | --- | --- | --- |\n")
	for i := range res.Rows {
		r := &res.Rows[i]
		if r.Skipped != "" {
			fmt.Fprintf(&b, "| %s | - | - | - | %s | %s |\n", r.Figure, r.Goal, r.Skipped)
			continue
		}
		ratio := "-"
		if r.Ratio != nil {
			ratio = fmtStat(r.Ratio, "x")
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", strings.TrimSpace(r.Figure), fmtStat(r.Value, r.Unit), fmtStat(r.Baseline, r.Unit), ratio, r.Goal, r.metString())
	}
	return b.String()
}

// machineInfo describes the machine for the results.
func machineInfo(dir string) map[string]any {
	m := map[string]any{"nproc": runtime.NumCPU(), "go": runtime.Version(), "loadavg_start": loadAvg()}
	if v, err := procMeminfo("MemTotal"); err == nil {
		m["mem_total"] = humanBytes(v)
	}
	if out, err := exec.Command("df", "-hT", dir).Output(); err == nil {
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		m["disk"] = strings.Join(strings.Fields(lines[len(lines)-1]), " ")
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				m["cpu"] = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	return m
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func procMeminfo(field string) (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("read meminfo: %w", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			kb, err := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parse %s: %w", field, err)
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("%s not in /proc/meminfo", field)
}

// runSpec prints the synthetic model's tensor list (bench/dcp_compare.sh
// builds the same tensors in PyTorch from it).
func runSpec(args []string) error {
	fs := flag.NewFlagSet("spec", flag.ContinueOnError)
	sizeS := fs.String("size", "1GiB", "data size")
	if err := fs.Parse(args); err != nil {
		return err
	}
	size, err := positiveSize(*sizeS)
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(modelSpec(size))
}

// runDCP times ckptkit saving (into fresh directories under --dir) and
// loading (default mode, then Transactional) the synthetic model with one rank,
// the layout the PyTorch DCP side of bench/dcp_compare.sh uses, and prints
// the timings as JSON.
func runDCP(args []string) error {
	fs := flag.NewFlagSet("dcp", flag.ContinueOnError)
	sizeS := fs.String("size", "1GiB", "data size")
	dir := fs.String("dir", "", "directory on the disk under test")
	runs := fs.Int("runs", 3, "runs")
	world := fs.Int("world", 1, "ranks")
	prof := fs.String("profile-dir", "", "write CPU profiles of the first save and load here")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" {
		return fmt.Errorf("dcp: --dir is required: %w", errUsage)
	}
	if *prof != "" {
		if err := os.MkdirAll(*prof, 0o755); err != nil {
			return fmt.Errorf("profile dir: %w", err)
		}
	}
	size, err := positiveSize(*sizeS)
	if err != nil {
		return err
	}
	ctx := context.Background()
	specs := modelSpec(size)
	sds := sourceState(specs, *world)
	var saves []time.Duration
	var last string
	for i := 0; i < max(*runs, 1); i++ {
		d := filepath.Join(*dir, fmt.Sprintf("ckptkit-%d", i))
		var t time.Duration
		pd := *prof
		if i > 0 {
			pd = ""
		}
		if err := withCPUProfile(pd, "dcp-save.pprof", func() (err error) {
			t, _, err = saveOnce(ctx, d, sds)
			return err
		}); err != nil {
			return err
		}
		saves = append(saves, t)
		if last != "" {
			os.RemoveAll(last)
		}
		last = d
	}
	sds = nil
	runtime.GC()
	tg := targetState(specs, *world)
	out := map[string]any{"tensors": len(specs), "bytes": specBytes(specs), "save": newStat(seconds(saves))}
	// The default load (one pass, as DCP's), then a Transactional one.
	for _, tx := range []bool{false, true} {
		name := "load"
		if tx {
			name = "load_transactional"
		}
		var loads []time.Duration
		for i := 0; i < max(*runs, 1); i++ {
			opts := defaultLoadOpts()
			opts.Transactional = tx
			var lr loadResult
			pd := *prof
			if i > 0 {
				pd = ""
			}
			if err := withCPUProfile(pd, "dcp-"+name+".pprof", func() (err error) {
				lr, err = loadOnce(ctx, last, tg, opts)
				return err
			}); err != nil {
				return err
			}
			loads = append(loads, lr.d)
			out[name+"_mode"] = lr.rep.Mode
		}
		if err := checkTargets(specs, tg); err != nil {
			return err
		}
		out[name] = newStat(seconds(loads))
	}
	os.RemoveAll(last)
	return json.NewEncoder(os.Stdout).Encode(out)
}
