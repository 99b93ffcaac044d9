package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"cloud.google.com/go/storage"
	"github.com/minio/minio-go/v7"
	"golang.org/x/sync/errgroup"
	"google.golang.org/api/option"

	"github.com/ckptkit/ckptkit/backend"
	_ "github.com/ckptkit/ckptkit/backend/gcs" // gs:// URLs
	"github.com/ckptkit/ckptkit/backend/s3"
	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/statedict"
)

// rawClient is the plain SDK transfer a remote figure is compared with.
type rawClient interface {
	put(ctx context.Context, key string, data []byte) error
	get(ctx context.Context, key string, dst []byte) error
	// getChecked reads the whole object into dst (exactly its size) and
	// on to its end, where the SDK checks the bytes against the CRC32C the
	// service stored; an object the SDK could not check is an error, so
	// the baseline cannot silently skip the check.
	getChecked(ctx context.Context, key string, dst []byte) error
	del(ctx context.Context, key string) error
}

// readToEnd fills dst from r and reads on to r's end (where the SDKs check
// their checksums); an object longer than dst is an error.
func readToEnd(r io.Reader, dst []byte) error {
	if _, err := io.ReadFull(r, dst); err != nil {
		return err
	}
	var one [1]byte
	if n, err := r.Read(one[:]); n != 0 || err != io.EOF {
		return fmt.Errorf("object longer than %d bytes (or no end: %v)", len(dst), err)
	}
	return nil
}

type minioRaw struct {
	c      *minio.Client
	bucket string
}

func (m *minioRaw) put(ctx context.Context, key string, data []byte) error {
	_, err := m.c.PutObject(ctx, m.bucket, key, bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{ContentType: "application/octet-stream"})
	return err
}

func (m *minioRaw) get(ctx context.Context, key string, dst []byte) error {
	o, err := m.c.GetObject(ctx, m.bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return err
	}
	defer o.Close()
	_, err = io.ReadFull(o, dst)
	return err
}

// getChecked uses minio-go's own integrity check
// (GetObjectOptions.Checksum: an un-ranged read is verified at its end
// against the full-object checksum the response carries).
func (m *minioRaw) getChecked(ctx context.Context, key string, dst []byte) error {
	o, err := m.c.GetObject(ctx, m.bucket, key, minio.GetObjectOptions{Checksum: true})
	if err != nil {
		return err
	}
	defer o.Close()
	if err := readToEnd(o, dst); err != nil {
		return fmt.Errorf("checked get %s: %w", key, err)
	}
	// minio-go verifies the body only against a full-object checksum (a
	// composite one, or none, would leave the read unchecked): refuse both.
	if info, err := o.Stat(); err != nil || info.ChecksumCRC32C == "" || info.ChecksumMode != minio.ChecksumFullObjectMode.String() {
		return fmt.Errorf("checked get %s: the response carried no full-object CRC32C, so minio-go checked nothing (stat: %v, checksum type %q)", key, err, info.ChecksumMode)
	}
	return nil
}

func (m *minioRaw) del(ctx context.Context, key string) error {
	return m.c.RemoveObject(ctx, m.bucket, key, minio.RemoveObjectOptions{})
}

type gcsRaw struct {
	b *storage.BucketHandle
}

func (g *gcsRaw) put(ctx context.Context, key string, data []byte) error {
	w := g.b.Object(key).NewWriter(ctx)
	w.ChunkSize = 16 << 20
	if _, err := w.Write(data); err != nil {
		w.Close()
		return err
	}
	return w.Close()
}

func (g *gcsRaw) get(ctx context.Context, key string, dst []byte) error {
	r, err := g.b.Object(key).NewReader(ctx)
	if err != nil {
		return err
	}
	defer r.Close()
	_, err = io.ReadFull(r, dst)
	return err
}

// getChecked is the GCS client's default read: a whole-object read is
// checked against the CRC32C the server sends (x-goog-hash) at its end.
func (g *gcsRaw) getChecked(ctx context.Context, key string, dst []byte) error {
	r, err := g.b.Object(key).NewReader(ctx)
	if err != nil {
		return err
	}
	defer r.Close()
	if r.Attrs.CRC32C == 0 {
		return fmt.Errorf("checked get %s: the server sent no CRC32C", key)
	}
	if err := readToEnd(r, dst); err != nil {
		return fmt.Errorf("checked get %s: %w", key, err)
	}
	return nil
}

func (g *gcsRaw) del(ctx context.Context, key string) error { return g.b.Object(key).Delete(ctx) }

// newRawClient builds the SDK client for a test URL and returns it with the
// key prefix of the URL.
func newRawClient(ctx context.Context, u *url.URL) (rawClient, string, error) {
	prefix := strings.Trim(u.Path, "/")
	switch u.Scheme {
	case "s3":
		o, err := s3.ParseQuery(u.Query())
		if err != nil {
			return nil, "", fmt.Errorf("raw s3 client: %w", err)
		}
		lookup := minio.BucketLookupAuto
		if o.PathStyle {
			lookup = minio.BucketLookupPath
		}
		c, err := minio.New(o.Endpoint, &minio.Options{Creds: s3.DefaultCredentials(), Secure: !o.Insecure, Region: o.Region, BucketLookup: lookup})
		if err != nil {
			return nil, "", fmt.Errorf("raw s3 client: %w", err)
		}
		return &minioRaw{c: c, bucket: u.Host}, prefix, nil
	case "gs":
		var opts []option.ClientOption
		if os.Getenv("STORAGE_EMULATOR_HOST") != "" {
			opts = append(opts, option.WithoutAuthentication())
		}
		c, err := storage.NewClient(ctx, opts...)
		if err != nil {
			return nil, "", fmt.Errorf("raw gcs client: %w", err)
		}
		return &gcsRaw{b: c.Bucket(u.Host)}, prefix, nil
	}
	return nil, "", fmt.Errorf("no raw client for scheme %q", u.Scheme)
}

// subURL returns raw with name appended to its path.
func subURL(u *url.URL, name string) string {
	c := *u
	c.Path = strings.TrimSuffix(c.Path, "/") + "/" + name
	return c.String()
}

// clearPrefix deletes every object of st (best effort).
func clearPrefix(ctx context.Context, st *backend.Store) {
	var keys []string
	_ = st.List(ctx, "", func(o backend.ObjectInfo) error {
		keys = append(keys, o.Key)
		return nil
	})
	for _, k := range keys {
		_ = st.Delete(ctx, k)
	}
}

// benchRemote measures figure 3 for one object store: ckptkit save/load of
// cfg.remoteSize through URL rawURL vs raw SDK PutObject/GetObject of the
// same bytes, as one object per rank, all ranks concurrently.
func benchRemote(ctx context.Context, cfg *config, label, env string) []Row {
	rawURL := os.Getenv(env)
	skip := func(why string) []Row {
		return []Row{{Figure: label + " save/load", Goal: "ratio >= 0.9", Skipped: why}}
	}
	if rawURL == "" {
		return skip(fmt.Sprintf("skipped: %s not set (eval \"$(scripts/test-servers.sh start)\")", env))
	}
	rows, err := benchRemoteURL(ctx, cfg, label, rawURL)
	if err != nil {
		return skip("skipped: " + err.Error())
	}
	return rows
}

func benchRemoteURL(ctx context.Context, cfg *config, label, rawURL string) ([]Row, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("parse %s URL: %w", label, err)
	}
	raw, prefix, err := newRawClient(ctx, u)
	if err != nil {
		return nil, err
	}
	const world = 4
	specs := modelSpec(cfg.remoteSize)
	total := specBytes(specs)
	sds := sourceState(specs, world)
	targets := targetState(specs, world)
	// Raw objects: the same byte count, one object per rank.
	parts := make([][]byte, world)
	for r := range parts {
		lo, hi := statedict.SplitRange(total, r, world)
		parts[r] = make([]byte, hi-lo)
		fillRandom(parts[r], uint64(100+r))
	}
	dst := make([][]byte, world)
	for r := range dst {
		dst[r] = make([]byte, len(parts[r]))
		fillRandom(dst[r], 2) // touched, like the load's targets
	}
	run := fmt.Sprintf("ckptbench-%d-%d", os.Getpid(), time.Now().UnixNano())
	rawKey := func(i, r int) string {
		return strings.TrimPrefix(fmt.Sprintf("%s/%s/raw-%d/part-%d", prefix, run, i, r), "/")
	}
	allRanks := func(f func(r int) error) error {
		var g errgroup.Group
		for r := 0; r < world; r++ {
			g.Go(func() error { return f(r) })
		}
		return g.Wait()
	}
	srvCPU := serverCPUFunc(label)
	var checkedDst [][]byte // the checked SDK reads' buffers, one per data object
	var bSave, cSave, bLoad, bChecked, cLoad, cTx, bCPU, cCPU []time.Duration
	var last loadResult // the last default load's report and request counts
	for i := 0; i < cfg.runs; i++ {
		start := time.Now()
		if err := allRanks(func(r int) error { return raw.put(ctx, rawKey(i, r), parts[r]) }); err != nil {
			return nil, fmt.Errorf("raw put: %w", err)
		}
		bSave = append(bSave, time.Since(start))
		start = time.Now()
		if err := allRanks(func(r int) error { return raw.get(ctx, rawKey(i, r), dst[r]) }); err != nil {
			return nil, fmt.Errorf("raw get: %w", err)
		}
		bLoad = append(bLoad, time.Since(start))
		_ = allRanks(func(r int) error { return raw.del(ctx, rawKey(i, r)) })

		ckName := fmt.Sprintf("%s/ckpt-%d", run, i)
		ckURL := subURL(u, ckName)
		d, _, err := saveOnce(ctx, ckURL, sds)
		if err != nil {
			return nil, err
		}
		cSave = append(cSave, d)
		// The baseline of the load: the SDK reads the data objects ckptkit
		// just wrote (the same bytes, on the same server, just as recently
		// written) whole, 4 at once, with its own CRC32C check; it and the
		// load take turns going first.
		objs, err := dataObjects(ctx, ckURL)
		if err != nil {
			return nil, err
		}
		if checkedDst == nil {
			for _, o := range objs {
				b := make([]byte, o.Size)
				fillRandom(b, 1) // touched, like the load's targets
				checkedDst = append(checkedDst, b)
			}
		}
		if len(objs) != len(checkedDst) {
			return nil, fmt.Errorf("%s: checkpoint %d has %d data objects, the first had %d", label, i, len(objs), len(checkedDst))
		}
		for j, o := range objs {
			if o.Size > int64(len(checkedDst[j])) {
				return nil, fmt.Errorf("%s: data object %s of checkpoint %d has %d bytes, the first run's %d", label, o.Key, i, o.Size, len(checkedDst[j]))
			}
		}
		checkedGet := func() error {
			c0 := cpuNow() + srvCPU()
			start := time.Now()
			var g errgroup.Group
			for j, o := range objs {
				key := strings.TrimPrefix(prefix+"/"+ckName+"/"+o.Key, "/")
				g.Go(func() error { return raw.getChecked(ctx, key, checkedDst[j][:o.Size]) })
			}
			if err := g.Wait(); err != nil {
				return fmt.Errorf("raw checked get: %w", err)
			}
			bChecked = append(bChecked, time.Since(start))
			bCPU = append(bCPU, cpuNow()+srvCPU()-c0)
			return nil
		}
		var lr loadResult
		pd := cfg.profDir
		if i > 0 {
			pd = ""
		}
		ckLoad := func() error {
			c0 := cpuNow() + srvCPU()
			if err := withCPUProfile(pd, label+"-load.pprof", func() (err error) {
				lr, err = loadOnce(ctx, ckURL, targets, defaultLoadOpts())
				return err
			}); err != nil {
				return err
			}
			cCPU = append(cCPU, cpuNow()+srvCPU()-c0)
			cLoad = append(cLoad, lr.d)
			last = lr
			return nil
		}
		// Which of the two reads goes first alternates run by run.
		first, second := checkedGet, ckLoad
		if i%2 == 1 {
			first, second = ckLoad, checkedGet
		}
		if err := first(); err != nil {
			return nil, err
		}
		if err := second(); err != nil {
			return nil, err
		}
		tx := defaultLoadOpts()
		tx.Transactional = true
		tr, err := loadOnce(ctx, ckURL, targets, tx)
		if err != nil {
			return nil, err
		}
		cTx = append(cTx, tr.d)
		if st, err := openStore(ctx, ckURL); err == nil {
			clearPrefix(ctx, st)
			st.Close()
		}
		cfg.logf("%s run %d: raw put %v get %v checked get %v, ckptkit save %v load %v (%s, %d data reads)", label, i, bSave[i], bLoad[i], bChecked[i], cSave[i], cLoad[i], lr.rep.Mode, lr.dataReads)
	}
	if err := checkTargets(specs, targets); err != nil {
		return nil, fmt.Errorf("%s load: %w", label, err)
	}
	name := fmt.Sprintf("%s load 4->4 default (%s)", label, humanBytes(total))
	save := throughputRow(fmt.Sprintf("%s save 4 ranks (%s)", label, humanBytes(total)), total, bSave, cSave, 0.9)
	save.Note = "baseline: SDK put of 4 objects, concurrently"
	load := throughputRow(name, total, bChecked, cLoad, 0.9)
	load.Note = "baseline: SDK get of the checkpoint's 4 data objects, concurrently, checked by the SDK against their stored CRC32C (" + checkedHow[label] + ")"
	plain := throughputRow(name+", vs the SDK's default get", total, bLoad, cLoad, 0.9)
	plain.Goal, plain.Met = "- (extra row)", nil
	plain.Note = "baseline (the goal's before 2026-12-01): SDK get of 4 objects of the same size that the SDK wrote, concurrently, " + defaultHow[label]
	txRow := throughputRow(fmt.Sprintf("%s load 4->4 transactional (%s)", label, humanBytes(total)), total, bChecked, cTx, 0.9)
	txRow.Goal, txRow.Met = "- (extra row)", nil
	txRow.Note = "baseline: the checked SDK get; Transactional (staged in memory, then copied)"
	rows := []Row{withLoad(save), withLoad(load), withLoad(plain), withLoad(txRow)}
	if srvCPU() > 0 {
		cpu := throughputRow(name+", CPU time (client + server)", total, bCPU, cCPU, 0.9)
		cpu.Unit, cpu.Goal, cpu.Met = "MiB/CPU-s", "- (extra row)", nil
		cpu.Note = "getrusage of the bench process plus the server's CPU (/proc/PID/task/*/schedstat), checked SDK get vs default load, same runs"
		rows = append(rows, withLoad(cpu))
	}
	amp := float64(last.rep.BytesRead) / float64(last.rep.BytesNeeded)
	rows = append(rows,
		Row{Figure: "  read amplification " + label + " 4->4 default", Unit: "x", Value: statp(newStat([]float64{amp})),
			Goal: "<= 1.05", Met: boolp(amp <= 1.05), Note: fmt.Sprintf("mode %s", last.rep.Mode)},
		Row{Figure: "  metadata reads per load " + label + " 4->4 default", Unit: "count", Value: statp(newStat([]float64{float64(last.metaReads)})),
			Goal: "exactly 1", Met: boolp(last.metaReads == 1),
			Note: fmt.Sprintf("instrument.Counter around the driver: %d data read requests for %d data objects, %d other requests (stat/list)", last.dataReads, len(checkedDst), last.otherRequests)})
	return rows, nil
}

// checkedHow says how each SDK checks the bytes it reads, and defaultHow
// what its default read checks.
var (
	checkedHow = map[string]string{
		"s3":  "minio-go GetObjectOptions.Checksum",
		"gcs": "the GCS client's default",
	}
	defaultHow = map[string]string{
		"s3":  "no checksum (minio-go GetObject's default)",
		"gcs": "checked against their CRC32C (the GCS client's default)",
	}
)

// dataObjects lists the data objects of the checkpoint at rawURL, sorted by
// key.
func dataObjects(ctx context.Context, rawURL string) ([]backend.ObjectInfo, error) {
	st, err := openStore(ctx, rawURL)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	var out []backend.ObjectInfo
	if err := st.List(ctx, "", func(o backend.ObjectInfo) error {
		if o.Key != metadata.ObjectKey {
			out = append(out, o)
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("list %s: %w", rawURL, err)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Key < out[b].Key })
	return out, nil
}

// serverCPUFunc returns a function reporting the CPU time the object store
// server of label has used so far, from CKPTBENCH_<LABEL>_SERVER_PID (set by
// scripts/bench.sh for the test servers), summed over the server's threads;
// it reports 0 without a readable PID. The test servers share the
// machine's cores with the client, so their CPU is part of the cost.
func serverCPUFunc(label string) func() time.Duration {
	pid := os.Getenv("CKPTBENCH_" + strings.ToUpper(label) + "_SERVER_PID")
	return func() time.Duration {
		if pid == "" {
			return 0
		}
		tasks, _ := filepath.Glob("/proc/" + pid + "/task/*/schedstat")
		var sum time.Duration
		for _, t := range tasks {
			b, err := os.ReadFile(t)
			if err != nil {
				continue
			}
			if f := strings.Fields(string(b)); len(f) > 0 {
				ns, _ := strconv.ParseInt(f[0], 10, 64)
				sum += time.Duration(ns)
			}
		}
		return sum
	}
}

var errUsage = errors.New("usage")
