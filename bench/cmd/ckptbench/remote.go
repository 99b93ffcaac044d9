package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"time"

	"cloud.google.com/go/storage"
	"github.com/minio/minio-go/v7"
	"golang.org/x/sync/errgroup"
	"google.golang.org/api/option"

	"github.com/ckptkit/ckptkit/backend"
	_ "github.com/ckptkit/ckptkit/backend/gcs" // gs:// URLs
	"github.com/ckptkit/ckptkit/backend/s3"
	"github.com/ckptkit/ckptkit/statedict"
)

// rawClient is the plain SDK transfer a remote figure is compared with.
type rawClient interface {
	put(ctx context.Context, key string, data []byte) error
	get(ctx context.Context, key string, dst []byte) error
	del(ctx context.Context, key string) error
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
	var bSave, cSave, bLoad, cLoad, cTx []time.Duration
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

		ckURL := subURL(u, fmt.Sprintf("%s/ckpt-%d", run, i))
		d, _, err := saveOnce(ctx, ckURL, sds)
		if err != nil {
			return nil, err
		}
		cSave = append(cSave, d)
		var lr loadResult
		pd := cfg.profDir
		if i > 0 {
			pd = ""
		}
		if err := withCPUProfile(pd, label+"-load.pprof", func() (err error) {
			lr, err = loadOnce(ctx, ckURL, targets, defaultLoadOpts())
			return err
		}); err != nil {
			return nil, err
		}
		cLoad = append(cLoad, lr.d)
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
		cfg.logf("%s run %d: raw put %v get %v, ckptkit save %v load %v (%s)", label, i, bSave[i], bLoad[i], cSave[i], cLoad[i], lr.rep.Mode)
	}
	if err := checkTargets(specs, targets); err != nil {
		return nil, fmt.Errorf("%s load: %w", label, err)
	}
	save := throughputRow(fmt.Sprintf("%s save 4 ranks (%s)", label, humanBytes(total)), total, bSave, cSave, 0.9)
	save.Note = "baseline: SDK put of 4 objects, concurrently"
	load := throughputRow(fmt.Sprintf("%s load 4->4 default (%s)", label, humanBytes(total)), total, bLoad, cLoad, 0.9)
	load.Note = "baseline: SDK get of 4 objects, concurrently"
	txRow := throughputRow(fmt.Sprintf("%s load 4->4 transactional (%s)", label, humanBytes(total)), total, bLoad, cTx, 0.9)
	txRow.Goal, txRow.Met = "- (extra row)", nil
	txRow.Note = "baseline: SDK get of 4 objects, concurrently; Transactional (staged in memory, then copied)"
	return []Row{withLoad(save), withLoad(load), withLoad(txRow)}, nil
}

var errUsage = errors.New("usage")
