// Package host discovers ckptkit storage plugins in a directory, verifies
// their SHA-256 pins, starts them over hashicorp/go-plugin (gRPC, automatic
// mTLS) and registers their URL schemes with backend.Register, so that
// backend.Open("myfs://...") reaches a plugin process through a forwarding
// backend.Driver. It restarts a plugin that crashed on the next call, and
// kills plugin processes on Close, CloseAll and when the host dies.
package host

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/ckptkit/ckptkit/backend"
	hclog "github.com/hashicorp/go-hclog"
)

// Names under which a plugin directory is given. The CLI exposes both.
const (
	// FlagPluginDir is the command-line flag naming the plugin directory
	// (--plugin-dir).
	FlagPluginDir = "plugin-dir"
	// EnvPluginDir is the environment variable naming the plugin directory.
	EnvPluginDir = "CKPTKIT_PLUGIN_DIR"
	// LockFileName is the pin file looked up in the plugin directory. Each
	// line is "<sha256-hex>  <file name>", as sha256sum prints it; blank
	// lines and lines starting with # are ignored.
	LockFileName = "ckptkit-plugins.lock"
)

// Config says where to find plugins and how to run them.
type Config struct {
	// Dir is the plugin directory. Every executable regular file in it
	// (symlinks resolving inside it included; hidden files and the lock
	// file excluded) is a plugin. Required.
	Dir string
	// LockFile is the pin file; "" means Dir/ckptkit-plugins.lock. A
	// missing lock file pins nothing.
	LockFile string
	// RequirePins refuses plugins that have no pin in the lock file.
	RequirePins bool
	// Logger receives go-plugin's and the plugins' log lines; nil logs
	// errors to stderr.
	Logger hclog.Logger
	// StartTimeout bounds one plugin start (handshake); 0 means 20s.
	StartTimeout time.Duration
	// RestartAttempts bounds the starts tried when a call finds its plugin
	// dead; 0 means 3. They are spaced by backend.Backoff from
	// RestartBackoff (doubling, with jitter); 0 means 100ms.
	RestartAttempts int
	RestartBackoff  time.Duration
	// ForceStreaming keeps read and write bodies on the gRPC streams even
	// where the shared-memory bulk path is available (see
	// docs/PLUGINS.md). The environment variable EnvForceStreaming set to
	// "1" does the same.
	ForceStreaming bool
}

// EnvForceStreaming, set to "1", disables the shared-memory bulk path for
// every plugin, as Config.ForceStreaming does. It is read through
// backend.Getenv from the context of Discover (the caller's environment of
// the moment when the context carries one).
const EnvForceStreaming = "CKPTKIT_PLUGIN_FORCE_STREAMING"

func (c Config) withDefaults(ctx context.Context) Config {
	if c.LockFile == "" {
		c.LockFile = filepath.Join(c.Dir, LockFileName)
	}
	if c.Logger == nil {
		c.Logger = hclog.New(&hclog.LoggerOptions{Name: "ckptkit-plugin", Level: hclog.Error, Output: os.Stderr})
	}
	if c.StartTimeout <= 0 {
		c.StartTimeout = 20 * time.Second
	}
	if c.RestartAttempts <= 0 {
		c.RestartAttempts = 3
	}
	if c.RestartBackoff <= 0 {
		c.RestartBackoff = 100 * time.Millisecond
	}
	if backend.Getenv(ctx, EnvForceStreaming) == "1" {
		c.ForceStreaming = true
	}
	return c
}

// candidate is a plugin file that passed the path and pin checks.
type candidate struct {
	name   string // file name in Dir
	path   string // Dir/name
	real   string // symlinks resolved
	sum    []byte // SHA-256 of real
	pinned bool
}

// Discover finds the plugins in cfg.Dir, checks them, starts each one, asks
// it what it serves and registers its schemes with backend.Register.
//
// It refuses, before running anything: a path that resolves (through
// symlinks) outside the directory, a binary whose SHA-256 differs from its
// pin (wrapping ErrChecksumMismatch), and with RequirePins an unpinned one.
// Two plugins serving one scheme, or a plugin claiming a scheme that is
// already registered, are refused with both names. Discover is all or
// nothing: on any error it stops the plugins it started, registers nothing
// and returns the error (every refusal found, joined).
func Discover(ctx context.Context, cfg Config) ([]*Plugin, error) {
	if cfg.Dir == "" {
		return nil, errors.New("plugin discovery: no plugin directory given")
	}
	abs, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("plugin directory %s: %w", cfg.Dir, err)
	}
	dir, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return nil, fmt.Errorf("plugin directory %s: %w", cfg.Dir, err)
	}
	cfg.Dir = dir
	cfg = cfg.withDefaults(ctx)

	cands, err := scan(cfg)
	if err != nil {
		return nil, err
	}
	var started []*Plugin
	fail := func(err error) ([]*Plugin, error) {
		for _, p := range started {
			p.Close()
		}
		return nil, err
	}
	for _, c := range cands {
		p, err := launch(ctx, cfg, c)
		if err != nil {
			return fail(err)
		}
		started = append(started, p)
	}
	// Scheme conflicts, between plugins and with what is registered already.
	owner := map[string]*Plugin{}
	var errs []error
	for _, p := range started {
		for _, s := range p.Schemes {
			if o, dup := owner[s]; dup {
				errs = append(errs, fmt.Errorf("scheme %q is served by both plugin %s (%s) and plugin %s (%s)", s, o.Name, o.Path, p.Name, p.Path))
				continue
			}
			owner[s] = p
		}
	}
	if len(errs) > 0 {
		return fail(errors.Join(errs...))
	}
	for _, p := range started {
		if err := p.register(); err != nil {
			return fail(err)
		}
	}
	liveMu.Lock()
	for _, p := range started {
		live[p] = struct{}{}
	}
	liveMu.Unlock()
	return started, nil
}

// scan lists and checks the plugin files without running any of them.
func scan(cfg Config) ([]candidate, error) {
	pins, err := readLockFile(cfg.LockFile)
	if err != nil {
		return nil, err
	}
	lockReal, _ := filepath.EvalSymlinks(cfg.LockFile)
	entries, err := os.ReadDir(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("plugin directory: %w", err)
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
	var out []candidate
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || name == LockFileName {
			continue
		}
		path := filepath.Join(cfg.Dir, name)
		real, err := filepath.EvalSymlinks(path)
		if err != nil {
			errs = append(errs, fmt.Errorf("plugin %s: %w", path, err))
			continue
		}
		if rel, err := filepath.Rel(cfg.Dir, real); err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) || filepath.IsAbs(rel) {
			errs = append(errs, fmt.Errorf("plugin %s resolves to %s, outside the plugin directory %s: refused", path, real, cfg.Dir))
			continue
		}
		if real == lockReal {
			continue
		}
		fi, err := os.Stat(real)
		if err != nil {
			errs = append(errs, fmt.Errorf("plugin %s: %w", path, err))
			continue
		}
		if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			continue // directories, data files, READMEs
		}
		sum, err := fileSHA256(real)
		if err != nil {
			errs = append(errs, fmt.Errorf("plugin %s: %w", path, err))
			continue
		}
		pin, pinned := pins[name]
		switch {
		case pinned && !equalHex(pin, sum):
			errs = append(errs, fmt.Errorf("plugin %s: SHA-256 %x, pinned %s in %s: %w; not run", path, sum, pin, cfg.LockFile, ErrChecksumMismatch))
			continue
		case !pinned && cfg.RequirePins:
			errs = append(errs, fmt.Errorf("plugin %s (SHA-256 %x) has no pin in %s and pins are required; not run", path, sum, cfg.LockFile))
			continue
		}
		out = append(out, candidate{name: name, path: path, real: real, sum: sum, pinned: pinned})
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// readLockFile parses "<sha256>  <name>" lines (a "*" before the name, as
// sha256sum -b writes, is accepted). A missing file is an empty pin set.
func readLockFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("plugin lock file: %w", err)
	}
	defer f.Close()
	pins := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			return nil, fmt.Errorf("plugin lock file %s:%d: want \"<sha256>  <file name>\"", path, n)
		}
		sum, name := strings.ToLower(fields[0]), strings.TrimPrefix(fields[1], "*")
		if b, err := hex.DecodeString(sum); err != nil || len(b) != sha256.Size {
			return nil, fmt.Errorf("plugin lock file %s:%d: %q is not a SHA-256 in hex", path, n, fields[0])
		}
		if name != filepath.Base(name) {
			return nil, fmt.Errorf("plugin lock file %s:%d: %q is not a plain file name", path, n, name)
		}
		if prev, dup := pins[name]; dup && prev != sum {
			return nil, fmt.Errorf("plugin lock file %s:%d: %s pinned twice with different sums", path, n, name)
		}
		pins[name] = sum
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("plugin lock file %s: %w", path, err)
	}
	return pins, nil
}

func fileSHA256(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return nil, err
	}
	return h.Sum(nil), nil
}

func equalHex(pin string, sum []byte) bool { return pin == hex.EncodeToString(sum) }

// register registers the plugin's schemes; on failure it undoes its own.
func (p *Plugin) register() error {
	for _, s := range p.Schemes {
		liveMu.Lock()
		o := owners[s]
		liveMu.Unlock()
		if o != nil {
			p.unregister()
			return fmt.Errorf("scheme %q is served by both plugin %s (%s) and plugin %s (%s)", s, o.Name, o.Path, p.Name, p.Path)
		}
		if err := backend.Register(s, p.opener()); err != nil {
			p.unregister()
			return fmt.Errorf("plugin %s (%s) serves scheme %q: %w", p.Name, p.Path, s, err)
		}
		liveMu.Lock()
		owners[s] = p
		liveMu.Unlock()
		p.mu.Lock()
		p.registered = append(p.registered, s)
		p.mu.Unlock()
	}
	return nil
}

func (p *Plugin) unregister() {
	p.mu.Lock()
	regs := p.registered
	p.registered = nil
	p.mu.Unlock()
	for _, s := range regs {
		backend.Unregister(s)
		liveMu.Lock()
		if owners[s] == p {
			delete(owners, s)
		}
		liveMu.Unlock()
	}
}
