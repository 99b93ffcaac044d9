// Package sdk serves a backend.Driver as a ckptkit storage plugin.
//
// A third party implements backend.Driver and calls Serve from main:
//
//	func main() {
//		sdk.Serve(sdk.Config{
//			Name:    "myfs",
//			Version: "1.0.0",
//			Schemes: []string{"myfs"},
//			Open:    openMyFS, // func(ctx, *url.URL) (backend.Driver, string, error)
//		})
//	}
//
// The SDK speaks the wire protocol, carries every error's backend.Code to
// the host (so errors.Is(err, backend.ErrNotFound) works there), passes each
// call's context (deadline and cancellation) into the driver, and enforces
// the write protocol: the driver's Put reads a body that fails unless the
// host's commit frame arrived with a byte count and CRC32C matching the data,
// so an interrupted or corrupted write is never published by a driver that
// honours the Driver contract.
package sdk

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/plugins/internal/shm"
	"github.com/ckptkit/ckptkit/plugins/internal/wire"
	hclog "github.com/hashicorp/go-hclog"
	plugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
)

// Config describes the plugin to Serve.
type Config struct {
	// Name identifies the plugin in the host's listings and errors.
	Name string
	// Version is the plugin's own version string.
	Version string
	// Schemes are the URL schemes the plugin serves (lower case).
	Schemes []string
	// Open builds a driver for a URL of one of Schemes and returns the key
	// prefix inside it that the URL designates, as a backend.Opener does.
	// The host calls it once per opened store, and again after a restart.
	Open func(ctx context.Context, u *url.URL) (backend.Driver, string, error)
	// Logger receives the SDK's log lines (aborted writes are logged at
	// Warn); nil logs warnings to stderr as JSON, which the host forwards to
	// its own log.
	Logger hclog.Logger
}

func (c Config) validate() error {
	if c.Name == "" {
		return errors.New("sdk: Config.Name is empty")
	}
	if len(c.Schemes) == 0 {
		return errors.New("sdk: Config.Schemes is empty")
	}
	for _, s := range c.Schemes {
		if !validScheme(s) {
			return fmt.Errorf("sdk: scheme %q is not a lower-case URL scheme", s)
		}
	}
	if c.Open == nil {
		return errors.New("sdk: Config.Open is nil")
	}
	return nil
}

func validScheme(s string) bool {
	if s == "" || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '+' || r == '-' || r == '.') {
			return false
		}
	}
	return true
}

// Serve serves cfg's driver over the ckptkit plugin protocol until the host
// closes the plugin, then returns (main should simply return after it). An
// invalid Config, or a binary run by hand rather than by a ckptkit host,
// exits with status 1 and a message on stderr.
//
// The process also exits when its parent (the host) dies, so a plugin never
// outlives the program that started it.
func Serve(cfg Config) {
	if err := cfg.validate(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = hclog.New(&hclog.LoggerOptions{Name: cfg.Name, Level: hclog.Warn, Output: os.Stderr, JSONFormat: true})
	}
	go watchParent(logger)
	srv := newServer(cfg, logger)
	if desc := os.Getenv(wire.EnvSharedMemory); desc != "" {
		if err := srv.mapSegment(desc); err != nil {
			logger.Warn("shared-memory bulk path unavailable; streaming instead", "error", err.Error())
		}
	}
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: wire.Handshake,
		VersionedPlugins: map[int]plugin.PluginSet{
			wire.ProtocolMajor: {wire.PluginKey: &wire.GRPCPlugin{Impl: srv}},
		},
		GRPCServer: func(opts []grpc.ServerOption) *grpc.Server {
			return grpc.NewServer(append(opts, wire.ServerOptions()...)...)
		},
		Logger: logger,
	})
}

// watchParent exits the process once the host that started it is gone: the
// host passes its pid, and an orphaned process is re-parented (to init or a
// subreaper), which changes os.Getppid. The host additionally asks Linux to
// SIGKILL the plugin when it dies; this covers other systems and races.
func watchParent(logger hclog.Logger) {
	want, err := strconv.Atoi(strings.TrimSpace(os.Getenv(wire.EnvParentPID)))
	if err != nil || want <= 1 {
		return
	}
	for {
		if os.Getppid() != want {
			logger.Warn("host process is gone; exiting", "host_pid", want)
			os.Exit(2)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// mapSegment maps the shared segment the host passed (see
// wire.EnvSharedMemory), enabling ReadShm's and PutShm's slots.
func (s *server) mapSegment(desc string) error {
	l, fd, err := shm.ParseEnv(desc)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), "ckptkit-plugin-shm")
	if f == nil {
		return fmt.Errorf("sdk: shared segment descriptor %d is not open", fd)
	}
	seg, err := shm.Map(f, l)
	if err != nil {
		return err
	}
	s.seg, s.readPool = seg, shm.NewPool(l.ReadSlots)
	return nil
}
