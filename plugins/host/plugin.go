package host

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/plugins/internal/shm"
	"github.com/ckptkit/ckptkit/plugins/internal/wire"
	pb "github.com/ckptkit/ckptkit/plugins/proto"
	plugin "github.com/hashicorp/go-plugin"
)

// Plugin is one discovered plugin binary and its (re)started process.
type Plugin struct {
	// Name and Version are what the plugin reports about itself.
	Name    string
	Version string
	// Path is the plugin's path in the plugin directory.
	Path string
	// Schemes are the URL schemes it serves, registered with the backend
	// registry.
	Schemes []string
	// SHA256 is the hex SHA-256 of the binary that was verified and run.
	SHA256 string
	// Pinned tells whether the lock file pins the binary.
	Pinned bool
	// ProtocolMinor is the protocol minor version the plugin implements.
	ProtocolMinor uint32

	cfg  Config
	real string
	sum  []byte

	// restart serialises starts; holding it is waiting for a start.
	restart chan struct{}

	mu         sync.Mutex
	cur        *instance
	gen        uint64
	restarts   int
	closed     bool
	registered []string
}

// instance is one running plugin process.
type instance struct {
	gen    uint64
	pid    int
	client *plugin.Client
	rpc    pb.StorageClient
	// ctx ends when the process exited or the host gave up on it.
	ctx     context.Context
	abandon context.CancelFunc
	watched chan struct{} // closed once the process is gone
	// seg is the shared segment the process accepted, nil when bodies
	// stream over gRPC; putPool hands out its put slots. seg is unmapped
	// once the process is gone and no call copies from it any more.
	seg     *shm.Segment
	putPool *shm.Pool

	// bg tracks background work on the instance (abandoned writes waiting
	// to return their put slots); stop waits for it, and none starts after.
	bgMu      sync.Mutex
	bgStopped bool
	bg        sync.WaitGroup
}

// segmentLayout is the shared segment given to each plugin process: the
// memfd is sparse, so only slots in use cost memory.
var segmentLayout = shm.Layout{SlotSize: 4 << 20, PutSlots: 8, ReadSlots: 8}

// segmentFD is the descriptor number the segment gets in the plugin: the
// first of exec.Cmd.ExtraFiles.
const segmentFD = 3

var (
	liveMu sync.Mutex
	live   = map[*Plugin]struct{}{} // plugins not yet closed
	owners = map[string]*Plugin{}   // scheme -> plugin that registered it
)

// CloseAll closes every plugin started by Discover and not yet closed. Call
// it before the host exits. (Plugin processes also end by themselves when
// the host dies, and are go-plugin "managed" clients, so a host that uses
// go-plugin for other things may call plugin.CleanupClients instead.)
func CloseAll() {
	liveMu.Lock()
	ps := make([]*Plugin, 0, len(live))
	for p := range live {
		ps = append(ps, p)
	}
	liveMu.Unlock()
	for _, p := range ps {
		p.Close()
	}
}

// Close unregisters the plugin's schemes and kills its process, waiting for
// it to exit. Drivers opened through it fail from then on with
// ErrPluginClosed. Close is idempotent.
func (p *Plugin) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	in := p.cur
	p.cur = nil
	p.mu.Unlock()
	p.unregister()
	// Wait for a start in progress, so its process is not left behind.
	p.restart <- struct{}{}
	<-p.restart
	if in != nil {
		in.stop()
	}
	liveMu.Lock()
	delete(live, p)
	liveMu.Unlock()
}

// PID returns the process id of the running plugin, or 0 when none runs.
func (p *Plugin) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur == nil || p.cur.ctx.Err() != nil {
		return 0
	}
	return p.cur.pid
}

// Restarts returns how many times the plugin was restarted after a crash.
func (p *Plugin) Restarts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.restarts
}

// String describes the plugin for listings.
func (p *Plugin) String() string {
	return fmt.Sprintf("%s %s (%s) schemes=%v sha256=%s", p.Name, p.Version, p.Path, p.Schemes, p.SHA256)
}

// launch starts a checked candidate and asks it who it is.
func launch(ctx context.Context, cfg Config, c candidate) (*Plugin, error) {
	p := &Plugin{
		Path:    c.path,
		SHA256:  hex.EncodeToString(c.sum),
		Pinned:  c.pinned,
		cfg:     cfg,
		real:    c.real,
		sum:     c.sum,
		restart: make(chan struct{}, 1),
		Name:    c.name,
	}
	in, desc, err := p.start(ctx)
	if err != nil {
		return nil, fmt.Errorf("plugin %s: %w", c.path, err)
	}
	p.Name, p.Version, p.ProtocolMinor = desc.GetName(), desc.GetVersion(), desc.GetProtocolMinor()
	if p.Name == "" {
		p.Name = c.name
	}
	for _, s := range desc.GetSchemes() {
		u, err := url.Parse(s + "://x")
		if err != nil || u.Scheme != s {
			in.stop()
			return nil, fmt.Errorf("plugin %s (%s) declares an invalid scheme %q", p.Name, c.path, s)
		}
		p.Schemes = append(p.Schemes, s)
	}
	if len(p.Schemes) == 0 {
		in.stop()
		return nil, fmt.Errorf("plugin %s (%s) serves no scheme", p.Name, c.path)
	}
	p.cur = in
	return p, nil
}

// start runs the binary once (after go-plugin re-verified its SHA-256),
// connects and calls Describe.
func (p *Plugin) start(ctx context.Context) (*instance, *pb.DescribeResponse, error) {
	cmd := exec.Command(p.real)
	cmd.Env = []string{wire.EnvParentPID + "=" + strconv.Itoa(os.Getpid())}
	setParentDeathSignal(cmd)
	var seg *shm.Segment
	if !p.cfg.ForceStreaming && shm.Supported {
		s, f, err := shm.Create(segmentLayout)
		if err != nil {
			p.cfg.Logger.Warn("shared-memory bulk path unavailable; streaming instead", "plugin", p.Name, "error", err)
		} else {
			// The plugin inherits the memfd (created close-on-exec, so no
			// other child does); ours is closed once it started.
			defer f.Close()
			seg = s
			cmd.ExtraFiles = []*os.File{f}
			cmd.Env = append(cmd.Env, wire.EnvSharedMemory+"="+segmentLayout.Env(segmentFD))
		}
	}
	dropSegment := func() {
		if seg != nil {
			seg.Close()
		}
	}
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig: wire.Handshake,
		VersionedPlugins: map[int]plugin.PluginSet{
			wire.ProtocolMajor: {wire.PluginKey: &wire.GRPCPlugin{}},
		},
		Cmd:              cmd,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		AutoMTLS:         true,
		// The binary was hashed at discovery; go-plugin hashes it again
		// right before every start, so a replaced binary is never run.
		SecureConfig:    &plugin.SecureConfig{Checksum: p.sum, Hash: sha256.New()},
		Logger:          p.cfg.Logger.Named(p.Name),
		GRPCDialOptions: wire.DialOptions(),
		StartTimeout:    p.cfg.StartTimeout,
		Managed:         true,
	})
	rpc, err := client.Client()
	if err != nil {
		client.Kill()
		dropSegment()
		if errors.Is(err, plugin.ErrChecksumsDoNotMatch) {
			return nil, nil, fmt.Errorf("start: %w", ErrChecksumMismatch)
		}
		return nil, nil, fmt.Errorf("start: %w", err)
	}
	raw, err := rpc.Dispense(wire.PluginKey)
	if err != nil {
		client.Kill()
		dropSegment()
		return nil, nil, fmt.Errorf("start: %w", err)
	}
	wc, ok := raw.(*wire.Client)
	if !ok {
		client.Kill()
		dropSegment()
		return nil, nil, fmt.Errorf("start: unexpected client type %T", raw)
	}
	ictx, abandon := context.WithCancel(context.Background())
	in := &instance{client: client, rpc: wc.StorageClient, ctx: ictx, abandon: abandon, watched: make(chan struct{}), seg: seg}
	if cmd.Process != nil {
		in.pid = cmd.Process.Pid
	}
	go in.watch(wc.Done)

	tctx, tcancel := context.WithTimeout(ctx, p.cfg.StartTimeout)
	defer tcancel()
	dctx, cancel := in.callCtx(tctx)
	defer cancel()
	dreq := &pb.DescribeRequest{HostProtocolMinor: wire.ProtocolMinor}
	if seg != nil {
		dreq.HostFeatures = []string{wire.FeatureSharedMemory}
	}
	desc, err := in.rpc.Describe(dctx, dreq)
	if err != nil {
		in.stop()
		return nil, nil, fmt.Errorf("describe: %w", p.convert(ctx, nil, "describe", err, crashRetryable))
	}
	if seg != nil && slices.Contains(desc.GetFeatures(), wire.FeatureSharedMemory) {
		in.putPool = shm.NewPool(seg.Layout().PutSlots)
	} else {
		// An older SDK, or a plugin that could not map it: stream. The
		// instance keeps seg only to unmap it with the process.
		in.putPool = nil
	}
	p.mu.Lock()
	p.gen++
	in.gen = p.gen
	p.mu.Unlock()
	return in, desc, nil
}

// watch waits until the process exits or the host abandons it, then makes
// sure the process is gone.
func (in *instance) watch(exited context.Context) {
	defer close(in.watched)
	select {
	case <-exited.Done():
	case <-in.ctx.Done():
	}
	in.abandon()
	in.client.Kill()
	if in.seg != nil {
		in.seg.Close()
	}
}

// sharedMemory returns the instance's segment with a reference taken
// (release it with Release), or nil when the process streams bodies.
func (in *instance) sharedMemory() *shm.Segment {
	if in.putPool == nil || !in.seg.Acquire() {
		return nil
	}
	return in.seg
}

// stop abandons the instance and waits for its process and its
// background work to be gone.
func (in *instance) stop() {
	in.abandon()
	<-in.watched
	in.bgMu.Lock()
	in.bgStopped = true
	in.bgMu.Unlock()
	in.bg.Wait()
}

// background runs f on its own goroutine, tracked by stop; it returns
// false, without running f, once stop has begun waiting. f must end
// promptly once in.ctx ends.
func (in *instance) background(f func()) bool {
	in.bgMu.Lock()
	defer in.bgMu.Unlock()
	if in.bgStopped {
		return false
	}
	in.bg.Add(1)
	go func() {
		defer in.bg.Done()
		f()
	}()
	return true
}

// callCtx derives a call context from ctx that also ends, with cause
// ErrPluginExited, when the process exits: a call never outlives its plugin.
func (in *instance) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	cctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(in.ctx, func() { cancel(ErrPluginExited) })
	return cctx, func() {
		stop()
		cancel(context.Canceled)
	}
}

// live returns the running instance, restarting the plugin when it died:
// up to RestartAttempts starts, spaced by backend.Backoff from
// RestartBackoff (doubling, with jitter).
func (p *Plugin) live(ctx context.Context) (*instance, error) {
	if in, err := p.current(); in != nil || err != nil {
		return in, err
	}
	select {
	case p.restart <- struct{}{}:
	case <-ctx.Done():
		return nil, &CallError{Plugin: p.Name, Op: "restart", Code: backend.CodeCanceled, Err: context.Cause(ctx)}
	}
	defer func() { <-p.restart }()
	if in, err := p.current(); in != nil || err != nil {
		return in, err // another call restarted it meanwhile
	}
	bo := backend.Backoff{Base: p.cfg.RestartBackoff}
	var errs []error
	for attempt := 0; attempt < p.cfg.RestartAttempts; attempt++ {
		if attempt > 0 {
			if bo.Wait(ctx) != nil {
				return nil, &CallError{Plugin: p.Name, Op: "restart", Code: backend.CodeCanceled, Err: context.Cause(ctx)}
			}
		}
		in, desc, err := p.start(ctx)
		if err == nil && (desc.GetName() != p.Name || !slices.Equal(desc.GetSchemes(), p.Schemes)) {
			in.stop()
			err = fmt.Errorf("restarted plugin describes itself as %s serving %v, was %s serving %v", desc.GetName(), desc.GetSchemes(), p.Name, p.Schemes)
			errs = append(errs, err)
			break
		}
		if err != nil {
			errs = append(errs, err)
			if errors.Is(err, ErrChecksumMismatch) {
				break
			}
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			in.stop()
			return nil, &CallError{Plugin: p.Name, Op: "restart", Code: backend.CodeUnknown, Err: ErrPluginClosed}
		}
		p.cur = in
		p.restarts++
		p.mu.Unlock()
		p.cfg.Logger.Warn("plugin restarted", "plugin", p.Name, "path", p.Path, "pid", in.pid)
		return in, nil
	}
	return nil, &CallError{Plugin: p.Name, Op: "restart", Code: backend.CodeUnknown,
		Err: fmt.Errorf("%w and could not be restarted: %w", ErrPluginExited, errors.Join(errs...))}
}

// current returns the running instance, nil when there is none, or an
// error when the plugin was closed.
func (p *Plugin) current() (*instance, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, &CallError{Plugin: p.Name, Op: "call", Code: backend.CodeUnknown, Err: ErrPluginClosed}
	}
	if p.cur != nil && p.cur.ctx.Err() == nil {
		return p.cur, nil
	}
	return nil, nil
}

// opener is the backend.Opener registered for the plugin's schemes.
func (p *Plugin) opener() backend.Opener {
	return func(ctx context.Context, u *url.URL) (backend.Driver, string, error) {
		d := &driver{p: p, url: u.String()}
		prefix, err := d.open(ctx)
		if err != nil {
			return nil, "", err
		}
		return d, prefix, nil
	}
}
