package coordinator

import (
	"bytes"
	"context"
	"encoding/gob"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ckptkit/ckptkit/backend"
)

// StoreOptions tune a store coordinator. The zero value uses the defaults.
type StoreOptions struct {
	// PollInterval is the first wait between two polls (default 20 ms); it
	// doubles on every poll up to MaxPollInterval (default 1 s).
	PollInterval, MaxPollInterval time.Duration
	// Timeout bounds every collective call (0: only the caller's context
	// does). A rank that does not arrive in time makes the call fail and
	// aborts the group, like a cancelled context.
	Timeout time.Duration
	// CloseTimeout bounds rank 0's wait for the others in Close (default
	// one minute).
	CloseTimeout time.Duration
	// MaxValueBytes bounds the size of one received value (default 1 GiB).
	MaxValueBytes int64
	// ReadConcurrency bounds concurrent value reads in AllGather (default 16).
	ReadConcurrency int
}

func (o *StoreOptions) defaults() {
	if o.PollInterval <= 0 {
		o.PollInterval = 20 * time.Millisecond
	}
	if o.MaxPollInterval <= 0 {
		o.MaxPollInterval = time.Second
	}
	o.MaxPollInterval = max(o.MaxPollInterval, o.PollInterval)
	if o.CloseTimeout <= 0 {
		o.CloseTimeout = time.Minute
	}
	if o.MaxValueBytes <= 0 {
		o.MaxValueBytes = 1 << 30
	}
	if o.ReadConcurrency <= 0 {
		o.ReadConcurrency = 16
	}
}

// maxWorld keeps rank numbers within their five digits.
const maxWorld = 100000

// abortTimeout bounds the write of the abort object (Abort has no context).
const abortTimeout = 30 * time.Second

// StoreCoordinator is a Coordinator whose ranks share nothing but an object
// store: every value is an object under the group's prefix, and ranks poll
// the store for the others' values. It suits ranks on several machines that
// all reach the same bucket or file system. See NewStore.
type StoreCoordinator struct {
	st          *backend.Store
	group       string
	rank, world int
	opts        StoreOptions

	mu     sync.Mutex
	round  int
	err    error // set once the group is known to be aborted
	closed bool
}

var _ Coordinator = (*StoreCoordinator)(nil)

// NewStore returns rank's handle on the collective session group of world
// ranks, exchanging values through st. Every rank opens its own st on the
// same location and passes the same group, which must be unique per
// attempt (for example "coord/step-00000012-<job id>"): objects left by an
// earlier attempt under the same group make the first collective call fail
// on backends with create-if-absent, and would be read as values on others.
//
// Collective call number n (counting from 0) writes rank r's value to
// "<group>/<n, 6 digits>/<r, 5 digits>" (Broadcast: only rank 0 writes);
// Abort writes "<group>/abort". Values are encoded with encoding/gob inside
// an interface, so their concrete types must be registered with
// gob.Register in every process. Errors inside values should travel as
// *RemoteError (see ToRemote).
func NewStore(st *backend.Store, group string, rank, world int, opts StoreOptions) (*StoreCoordinator, error) {
	if st == nil {
		return nil, errors.New("coordinator: nil store")
	}
	if world < 1 || world > maxWorld {
		return nil, fmt.Errorf("coordinator: world size %d out of [1, %d]", world, maxWorld)
	}
	if rank < 0 || rank >= world {
		return nil, fmt.Errorf("coordinator: rank %d out of [0, %d)", rank, world)
	}
	group = strings.Trim(group, "/")
	if err := backend.ValidateKey(group); err != nil {
		return nil, fmt.Errorf("coordinator: group %q: %w", group, err)
	}
	opts.defaults()
	return &StoreCoordinator{st: st, group: group, rank: rank, world: world, opts: opts}, nil
}

// Rank is this rank's index in [0, WorldSize).
func (c *StoreCoordinator) Rank() int { return c.rank }

// WorldSize is the number of ranks.
func (c *StoreCoordinator) WorldSize() int { return c.world }

// Group returns the group's key prefix in the store.
func (c *StoreCoordinator) Group() string { return c.group }

func (c *StoreCoordinator) roundPrefix(round int) string {
	return fmt.Sprintf("%s/%06d/", c.group, round)
}

func (c *StoreCoordinator) valueKey(round, rank int) string {
	return fmt.Sprintf("%s%05d", c.roundPrefix(round), rank)
}

func (c *StoreCoordinator) abortKey() string { return c.group + "/abort" }

func (c *StoreCoordinator) doneKey(rank int) string {
	return fmt.Sprintf("%s/done/%05d", c.group, rank)
}

// next starts a collective call: it returns the call's round number, or
// the group's error once it is aborted.
func (c *StoreCoordinator) next() (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	if c.closed {
		return 0, fmt.Errorf("coordinator: rank %d of group %s is closed", c.rank, c.group)
	}
	r := c.round
	c.round++
	return r, nil
}

// envelope carries a value of any registered type.
type envelope struct{ V any }

func encodeValue(v any) ([]byte, error) {
	var b bytes.Buffer
	if err := gob.NewEncoder(&b).Encode(envelope{V: v}); err != nil {
		return nil, fmt.Errorf("coordinator: encode %T (is it registered with gob.Register?): %w", v, err)
	}
	return b.Bytes(), nil
}

func decodeValue(data []byte) (any, error) {
	var e envelope
	if err := gob.NewDecoder(bytes.NewReader(data)).Decode(&e); err != nil {
		return nil, fmt.Errorf("coordinator: decode value: %w", err)
	}
	return e.V, nil
}

// abortRecord is the content of the abort object.
type abortRecord struct {
	Rank int
	Err  *RemoteError
}

// Abort fails the group: it writes the abort object (the first abort wins
// where the backend has create-if-absent), so that every pending and later
// collective call on every rank returns an error wrapping ErrAborted and
// err. Writing is bounded by 30 s; a failed write is not reported, but this
// rank's later calls fail anyway.
func (c *StoreCoordinator) Abort(err error) {
	if err == nil {
		err = errors.New("no reason given")
	}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = fmt.Errorf("%w by rank %d: %w", ErrAborted, c.rank, err)
	c.mu.Unlock()

	data, eerr := encodeValue(abortRecord{Rank: c.rank, Err: ToRemote(err)})
	if eerr != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), abortTimeout)
	defer cancel()
	_ = c.st.PutBytes(ctx, c.abortKey(), data, c.putOptions())
}

func (c *StoreCoordinator) putOptions() backend.PutOptions {
	return backend.PutOptions{ContentType: "application/x-gob", IfNotExists: c.st.Capabilities().CreateIfAbsent}
}

// checkAbort returns the group's error if it is aborted, reading the abort
// object.
func (c *StoreCoordinator) checkAbort(ctx context.Context) error {
	c.mu.Lock()
	err := c.err
	c.mu.Unlock()
	if err != nil {
		return err
	}
	data, err := c.st.ReadAll(ctx, c.abortKey(), 1<<20)
	if errors.Is(err, backend.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("coordinator: check abort: %w", err)
	}
	var aerr error
	v, err := decodeValue(data)
	if rec, ok := v.(abortRecord); err == nil && ok {
		aerr = fmt.Errorf("%w by rank %d: %w", ErrAborted, rec.Rank, FromRemote(rec.Err))
	} else {
		aerr = fmt.Errorf("%w (unreadable abort object %s)", ErrAborted, c.st.URL(c.abortKey()))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = aerr
	}
	return c.err
}

// put writes this rank's value for a round.
func (c *StoreCoordinator) put(ctx context.Context, key string, data []byte) error {
	po := c.putOptions()
	if !po.IfNotExists {
		// Best effort only: without create-if-absent a racing duplicate
		// rank is not detected.
		if ok, err := c.st.Exists(ctx, key); err != nil {
			return fmt.Errorf("coordinator: %w", err)
		} else if ok {
			return fmt.Errorf("coordinator: %s already exists (stale group or duplicate rank %d): %w", c.st.URL(key), c.rank, backend.ErrAlreadyExists)
		}
	}
	if err := c.st.PutBytes(ctx, key, data, po); err != nil {
		if errors.Is(err, backend.ErrAlreadyExists) {
			return fmt.Errorf("coordinator: stale group or duplicate rank %d: %w", c.rank, err)
		}
		return fmt.Errorf("coordinator: %w", err)
	}
	return nil
}

// fail turns a failure of this rank's collective call into the group's
// failure: a context error (or Timeout) and a store error abort the group,
// so the other ranks do not wait for this one in vain.
func (c *StoreCoordinator) fail(ctx context.Context, round int, err error) error {
	if errors.Is(err, ErrAborted) {
		return err
	}
	if cerr := ctx.Err(); cerr != nil {
		c.Abort(cerr)
		return fmt.Errorf("rank %d waiting for the other ranks (group %s, call %d): %w", c.rank, c.group, round, cerr)
	}
	c.Abort(err)
	return err
}

// poll calls ready until it reports true, backing off from PollInterval to
// MaxPollInterval. With checkAbort, every poll first checks the abort
// object.
func (c *StoreCoordinator) poll(ctx context.Context, checkAbort bool, ready func(context.Context) (bool, error)) error {
	delay := c.opts.PollInterval
	t := time.NewTimer(delay)
	t.Stop()
	defer t.Stop()
	for {
		if checkAbort {
			if err := c.checkAbort(ctx); err != nil {
				return err
			}
		}
		ok, err := ready(ctx)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		t.Reset(delay)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		delay = min(2*delay, c.opts.MaxPollInterval)
	}
}

func (c *StoreCoordinator) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if c.opts.Timeout > 0 {
		return context.WithTimeout(ctx, c.opts.Timeout)
	}
	return context.WithCancel(ctx)
}

// AllGather writes v, waits until every rank's value of this call is in the
// store and returns them indexed by rank. This rank's entry is v itself;
// the others are decoded copies.
func (c *StoreCoordinator) AllGather(ctx context.Context, v any) ([]any, error) {
	round, err := c.next()
	if err != nil {
		return nil, err
	}
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	vals, err := c.allGather(ctx, round, v)
	if err != nil {
		return nil, c.fail(ctx, round, err)
	}
	return vals, nil
}

func (c *StoreCoordinator) allGather(ctx context.Context, round int, v any) ([]any, error) {
	data, err := encodeValue(v)
	if err != nil {
		return nil, err
	}
	if err := c.checkAbort(ctx); err != nil {
		return nil, err
	}
	if err := c.put(ctx, c.valueKey(round, c.rank), data); err != nil {
		return nil, err
	}
	prefix := c.roundPrefix(round)
	seen := make([]bool, c.world)
	err = c.poll(ctx, true, func(ctx context.Context) (bool, error) {
		n := 0
		clear(seen)
		err := c.st.List(ctx, prefix, func(o backend.ObjectInfo) error {
			r, err := strconv.Atoi(strings.TrimPrefix(o.Key, prefix))
			if err == nil && r >= 0 && r < c.world && !seen[r] {
				seen[r] = true
				n++
			}
			return nil
		})
		if err != nil {
			return false, fmt.Errorf("coordinator: %w", err)
		}
		return n == c.world, nil
	})
	if err != nil {
		return nil, err
	}
	vals := make([]any, c.world)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(c.opts.ReadConcurrency)
	for r := range vals {
		if r == c.rank {
			vals[r] = v
			continue
		}
		g.Go(func() error {
			val, err := c.read(gctx, c.valueKey(round, r))
			vals[r] = val
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return vals, nil
}

func (c *StoreCoordinator) read(ctx context.Context, key string) (any, error) {
	data, err := c.st.ReadAll(ctx, key, c.opts.MaxValueBytes)
	if err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	v, err := decodeValue(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.st.URL(key), err)
	}
	return v, nil
}

// Broadcast returns rank 0's v on every rank: rank 0 writes it and
// returns, the other ranks poll for it. Unlike AllGather it is not a
// barrier.
func (c *StoreCoordinator) Broadcast(ctx context.Context, v any) (any, error) {
	round, err := c.next()
	if err != nil {
		return nil, err
	}
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	out, err := c.broadcast(ctx, round, v)
	if err != nil {
		return nil, c.fail(ctx, round, err)
	}
	return out, nil
}

func (c *StoreCoordinator) broadcast(ctx context.Context, round int, v any) (any, error) {
	key := c.valueKey(round, 0)
	if c.rank == 0 {
		data, err := encodeValue(v)
		if err != nil {
			return nil, err
		}
		// Publish first, check the abort object only if that fails:
		// publishing rank 0's value is harmless after an abort, and once
		// published it is what every rank must see (the saver broadcasts its
		// commit outcome this way).
		if err := c.put(ctx, key, data); err != nil {
			if aerr := c.checkAbort(ctx); aerr != nil {
				return nil, aerr
			}
			return nil, err
		}
		return v, nil
	}
	var data []byte
	// The value is read before the abort object is checked: a value rank 0
	// already published wins over an abort that came later, so ranks do not
	// disagree about, say, a committed checkpoint.
	err := c.poll(ctx, false, func(ctx context.Context) (bool, error) {
		var err error
		data, err = c.st.ReadAll(ctx, key, c.opts.MaxValueBytes)
		if errors.Is(err, backend.ErrNotFound) {
			return false, c.checkAbort(ctx)
		}
		if err != nil {
			return false, fmt.Errorf("coordinator: %w", err)
		}
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	out, err := decodeValue(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.st.URL(key), err)
	}
	return out, nil
}

// Close ends this rank's use of the group. Every rank calls it once, after
// its last collective call (successful or not). Ranks other than 0 write a
// "<group>/done/<rank>" marker and return; rank 0 waits until every marker
// is present (bounded by ctx and StoreOptions.CloseTimeout) and then
// deletes every object of the group. If a rank never closes (it crashed),
// rank 0's Close returns an error and the objects stay: RemoveGroup, run
// when no rank uses the group any more, or a lifecycle rule on the prefix
// removes them.
func (c *StoreCoordinator) Close(ctx context.Context) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	if c.rank != 0 {
		if err := c.st.PutBytes(ctx, c.doneKey(c.rank), nil, backend.PutOptions{}); err != nil {
			return fmt.Errorf("coordinator: close rank %d: %w", c.rank, err)
		}
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, c.opts.CloseTimeout)
	defer cancel()
	prefix := c.group + "/done/"
	err := c.poll(wctx, false, func(ctx context.Context) (bool, error) {
		n := 0
		err := c.st.List(ctx, prefix, func(o backend.ObjectInfo) error {
			if r, err := strconv.Atoi(strings.TrimPrefix(o.Key, prefix)); err == nil && r > 0 && r < c.world {
				n++
			}
			return nil
		})
		return n == c.world-1, err
	})
	if err != nil {
		return fmt.Errorf("coordinator: close group %s: waiting for the other ranks, leaving the group's objects: %w", c.group, err)
	}
	return RemoveGroup(ctx, c.st, c.group)
}

// RemoveGroup deletes every object of group in st. Run it only when no rank
// uses the group any more (for example from the job launcher, after a
// failed save whose rank 0 could not clean up).
func RemoveGroup(ctx context.Context, st *backend.Store, group string) error {
	group = strings.Trim(group, "/")
	if err := backend.ValidateKey(group); err != nil {
		return fmt.Errorf("coordinator: group %q: %w", group, err)
	}
	var keys []string
	if err := st.List(ctx, group+"/", func(o backend.ObjectInfo) error {
		keys = append(keys, o.Key)
		return nil
	}); err != nil {
		return fmt.Errorf("coordinator: remove group %s: %w", group, err)
	}
	for _, k := range keys {
		if err := st.Delete(ctx, k); err != nil {
			return fmt.Errorf("coordinator: remove group %s: %w", group, err)
		}
	}
	return nil
}

func init() {
	gob.Register(abortRecord{})
}
