// Package transfer copies a committed checkpoint between any two stores
// (fs -> s3, s3 -> gs, ...): data objects first, in parallel, streamed and
// CRC-checked on the way, then the metadata object last, so an interrupted
// copy, or one of a corrupt source, never leaves a committed-looking
// checkpoint at the destination. Every item with a recorded CRC32C is
// checked, whatever the format: a native checkpoint's chunks and values,
// and a DCP checkpoint's items through ckptkit's integrity object. A
// checkpoint that recorded none (DCP written by torch itself) is copied
// with only its sizes checked and says so (Result.Unchecked), or is
// refused with Options.RequireChecksums. A
// copy that fails or is cancelled removes the data objects it completed
// (in-flight uploads are aborted by the drivers) and its error says how far
// it got.
package transfer

import (
	"context"
	"fmt"
	"io"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ckptkit/ckptkit/internal/crc32c"
	"github.com/ckptkit/ckptkit/progress"

	"github.com/ckptkit/ckptkit/ckpterr"

	"golang.org/x/sync/errgroup"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/metadata"
)

// ErrDestinationCommitted is returned when the destination already holds a
// committed checkpoint and Options.Force is not set.
var ErrDestinationCommitted = ckpterr.New(ckpterr.Conflict, "destination already holds a committed checkpoint")

// ErrNoChecksums is returned, with Options.RequireChecksums, for a source
// that recorded no CRC32C for its items (metadata.Checkpoint.Unchecked).
var ErrNoChecksums = ckpterr.New(ckpterr.BadCheckpoint, "the checkpoint recorded no checksums")

// Options tune a copy.
type Options struct {
	// Parallel bounds the objects copied at once (default 8).
	Parallel int
	// Force replaces a committed destination (its metadata is deleted
	// first, so it is never half-valid).
	Force bool
	// Progress, when set, is called with the bytes copied so far (Unit
	// progress.Bytes), from several goroutines.
	Progress progress.Func
	// RequireChecksums refuses a source whose items have no recorded
	// CRC32C (ErrNoChecksums) instead of copying it unchecked.
	RequireChecksums bool
}

// Result describes a finished copy.
type Result struct {
	Source      string
	Destination string
	Format      string
	Objects     int
	Bytes       int64
	Duration    time.Duration
	// Unchecked: the source recorded no CRC32C for its items (a DCP
	// checkpoint written by torch itself), so only the objects' sizes
	// were checked.
	Unchecked bool
}

// Copy copies the committed checkpoint at src to dst.
func Copy(ctx context.Context, src, dst *backend.Store, opts Options) (*Result, error) {
	c, err := loader.Open(ctx, src)
	if err != nil {
		return nil, fmt.Errorf("copy %s: %w", src, err)
	}
	return CopyCheckpoint(ctx, c, dst, opts)
}

// CopyCheckpoint copies the open checkpoint c to dst, as Copy does,
// without reading its metadata again (a caller that verified c first).
func CopyCheckpoint(ctx context.Context, c *loader.Checkpoint, dst *backend.Store, opts Options) (*Result, error) {
	start := time.Now()
	if opts.Parallel <= 0 {
		opts.Parallel = 8
	}
	src := c.Store()
	md := c.Metadata()
	if md.Unchecked && opts.RequireChecksums {
		return nil, fmt.Errorf("copy %s: %w: %s", src, ErrNoChecksums, UncheckedNote)
	}
	var total int64
	for _, o := range md.Objects {
		total += o.Size
	}
	if err := prepareDestination(ctx, dst, opts.Force); err != nil {
		return nil, err
	}

	ranges := chunkRanges(md)
	var done atomic.Int64
	var mu sync.Mutex
	var written []string // data objects completed at dst
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(opts.Parallel)
	for _, o := range md.Objects {
		g.Go(func() error {
			rc, err := src.NewRangeReader(gctx, o.Key, 0, o.Size)
			if err != nil {
				return loader.MissingObject(err)
			}
			defer rc.Close()
			r := &checkingReader{r: rc, ranges: ranges[o.Key], object: src.URL(o.Key), progress: func(n int) {
				d := done.Add(int64(n))
				opts.Progress.Report(progress.Update{Done: d, Total: total, Unit: progress.Bytes})
			}}
			if err := dst.Put(gctx, o.Key, o.Size, r, backend.PutOptions{ContentType: "application/octet-stream"}); err != nil {
				return fmt.Errorf("copy %s to %s: %w", src.URL(o.Key), dst.URL(o.Key), err)
			}
			mu.Lock()
			written = append(written, o.Key)
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, fmt.Errorf("copy of %s to %s stopped after %d of %d data objects (%s): %w",
			src, dst, len(written), len(md.Objects), removeWritten(ctx, dst, written), err)
	}
	raw := c.RawMetadata()
	crc := crc32c.Checksum(raw)
	po := backend.PutOptions{CRC32C: &crc, IfNotExists: dst.Capabilities().CreateIfAbsent}
	if err := dst.PutBytes(ctx, c.MetadataKey(), raw, po); err != nil {
		return nil, fmt.Errorf("copy %s to %s: commit metadata: %w", src, dst, err)
	}
	return &Result{Source: src.String(), Destination: dst.String(), Format: c.FormatName(), Objects: len(md.Objects) + 1,
		Bytes: total + int64(len(raw)), Duration: time.Since(start), Unchecked: md.Unchecked}, nil
}

// UncheckedNote says what a copy of an Unchecked source could not check.
const UncheckedNote = "its format recorded no CRC32C for its items (a DCP checkpoint written by torch itself, without ckptkit's integrity object), so no data byte could be checked, only the objects' sizes"

// cleanupTimeout bounds the removal of a failed copy's data objects, which
// runs on a fresh context because the copy's may be cancelled.
const cleanupTimeout = 30 * time.Second

// removeWritten deletes the data objects a failed copy completed at dst
// (nothing references them: the metadata is written last) and says what is
// left there.
func removeWritten(ctx context.Context, dst *backend.Store, keys []string) string {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	var left []string
	for _, k := range keys {
		if err := dst.Delete(cctx, k); err != nil {
			left = append(left, k)
		}
	}
	if len(left) > 0 {
		return fmt.Sprintf("the destination has no committed checkpoint; %d copied data object(s) could not be removed, e.g. %s", len(left), dst.URL(left[0]))
	}
	if len(keys) > 0 {
		return fmt.Sprintf("the destination has no committed checkpoint; the %d copied data object(s) were removed", len(keys))
	}
	return "the destination has no committed checkpoint"
}

// prepareDestination refuses (or, forced, uncommits) a committed
// destination of any known format.
func prepareDestination(ctx context.Context, dst *backend.Store, force bool) error {
	for _, f := range metadata.Formats() {
		ok, err := dst.Exists(ctx, f.ObjectKey)
		if err != nil {
			return fmt.Errorf("copy to %s: %w", dst, err)
		}
		if !ok {
			continue
		}
		if !force {
			return fmt.Errorf("copy to %s: %w (%s); use --force to replace it", dst, ErrDestinationCommitted, dst.URL(f.ObjectKey))
		}
		if err := dst.Delete(ctx, f.ObjectKey); err != nil {
			return fmt.Errorf("copy to %s: uncommit the old checkpoint: %w", dst, err)
		}
	}
	return nil
}

// crcRange is a CRC-protected byte range of an object.
type crcRange struct {
	key            string
	offset, length int64
	crc            uint32
}

// chunkRanges lists, per object, the chunks and bytes entries with their
// CRC32C, sorted by offset: every item, of any encoding, unless the format
// recorded none (md.Unchecked; raw items always have one).
func chunkRanges(md *metadata.Checkpoint) map[string][]crcRange {
	out := map[string][]crcRange{}
	for _, t := range md.Tensors {
		for _, ch := range t.Chunks {
			if ch.Encoding == metadata.EncodingRaw || !md.Unchecked {
				out[ch.Object] = append(out[ch.Object], crcRange{t.Key, ch.Offset, ch.Length, ch.CRC32C})
			}
		}
	}
	for _, b := range md.Bytes {
		if b.Encoding == metadata.EncodingRaw || !md.Unchecked {
			out[b.Object] = append(out[b.Object], crcRange{b.Key, b.Offset, b.Length, b.CRC32C})
		}
	}
	for _, rs := range out {
		sort.Slice(rs, func(i, j int) bool { return rs[i].offset < rs[j].offset })
	}
	return out
}

// checkingReader streams an object and checks the CRC32C of every range as
// its last byte passes; a mismatch fails the read, so the destination Put
// aborts and publishes nothing. Ranges may overlap (entries sharing bytes),
// so each keeps its own running CRC.
type checkingReader struct {
	r        io.Reader
	ranges   []crcRange // sorted by offset
	object   string
	progress func(int)
	pos      int64
	first    int      // ranges before it are all checked
	crcs     []uint32 // running CRC per range
	done     []bool
}

func (c *checkingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		if cerr := c.check(p[:n]); cerr != nil {
			return 0, cerr
		}
		c.progress(n)
	}
	return n, err
}

func (c *checkingReader) check(b []byte) error {
	if c.crcs == nil {
		c.crcs = make([]uint32, len(c.ranges))
		c.done = make([]bool, len(c.ranges))
	}
	start, end := c.pos, c.pos+int64(len(b))
	c.pos = end
	for i := c.first; i < len(c.ranges) && c.ranges[i].offset < end; i++ {
		if c.done[i] {
			continue
		}
		r := &c.ranges[i]
		lo, hi := max(r.offset, start), min(r.offset+r.length, end)
		if hi > lo {
			c.crcs[i] = crc32c.Update(c.crcs[i], b[lo-start:hi-start])
		}
		if r.offset+r.length > end {
			continue // the range goes on in the next read
		}
		if c.crcs[i] != r.crc {
			return fmt.Errorf("%w: key %q in object %s at offset %d (%d bytes): stored CRC32C %08x, computed %08x",
				loader.ErrChecksum, r.key, c.object, r.offset, r.length, r.crc, c.crcs[i])
		}
		c.done[i] = true
	}
	for c.first < len(c.ranges) && c.done[c.first] {
		c.first++
	}
	return nil
}
