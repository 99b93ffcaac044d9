package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// invocation is the state of one run of the command line: the global
// flags, and the JSON document the command emitted (written by run, with
// the error object attached when the command failed).
type invocation struct {
	quiet    bool
	verbose  int
	logLevel string
	progress bool
	stderr   io.Writer
	logger   *slog.Logger

	doc document
	// bar is the progress bar on stderr, if one is drawn: a note clears
	// it first, so that the note does not land inside the bar's line.
	bar *progress
}

type invocationKey struct{}

// inv returns the invocation of cmd (a fresh default one outside run).
func inv(cmd *cobra.Command) *invocation {
	if ctx := cmd.Context(); ctx != nil {
		if in, ok := ctx.Value(invocationKey{}).(*invocation); ok {
			return in
		}
	}
	return &invocation{stderr: cmd.ErrOrStderr(), logger: slog.New(slog.DiscardHandler)}
}

// addGlobalFlags adds -q, -v, --log-level, --progress and --version to root.
func addGlobalFlags(root *cobra.Command, in *invocation) {
	pf := root.PersistentFlags()
	pf.BoolVarP(&in.quiet, "quiet", "q", false, "print only results and errors: no progress, no notes on stderr")
	pf.CountVarP(&in.verbose, "verbose", "v", "log more on stderr: -v info (and a plain progress line when stderr is not a terminal), -vv debug (storage requests and retries)")
	pf.StringVar(&in.logLevel, "log-level", "", "log level on stderr: error, warn, info or debug (default warn; -v is info, -vv debug)")
	pf.BoolVar(&in.progress, "progress", false, "show progress even when stderr is not a terminal or --json is set")
	root.Version = versionString()
	root.SetVersionTemplate("ckpt {{.Version}}\n")
}

// setup checks the global flags and installs the logger; it runs before
// every command.
func (in *invocation) setup() error {
	level := slog.LevelWarn
	switch {
	case in.logLevel != "":
		if err := level.UnmarshalText([]byte(in.logLevel)); err != nil {
			return usage(fmt.Errorf("--log-level: %q is not one of error, warn, info, debug", in.logLevel))
		}
	case in.verbose >= 2:
		level = slog.LevelDebug
	case in.verbose == 1:
		level = slog.LevelInfo
	case in.quiet:
		level = slog.LevelError
	}
	in.logger = slog.New(slog.NewTextHandler(in.stderr, &slog.HandlerOptions{Level: level}))
	return nil
}

// logs reports whether in logs at level.
func (in *invocation) logs(level slog.Level) bool {
	return in.logger.Enabled(context.Background(), level)
}

// notef prints a human note on stderr unless -q; a progress bar being
// drawn is cleared first and redrawn by its next update.
func (in *invocation) notef(format string, a ...any) {
	if in.quiet {
		return
	}
	in.bar.clear()
	fmt.Fprintf(in.stderr, format+"\n", a...)
}

// version and commit are set by the linker (-ldflags "-X main.version=...
// -X main.commit=..."); by default they come from the build information Go
// records (a module version for `go install ...@v1.2.3`, the VCS revision
// for a build in a clone).
var version, commit string

// versionString is what --version prints after "ckpt ".
func versionString() string {
	v, c, dirty := version, commit, false
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if c == "" {
					c = s.Value
				}
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if v == "" {
		v = "(devel)"
	}
	if c == "" {
		c = "unknown"
	} else if len(c) > 12 {
		c = c[:12]
	}
	if dirty {
		c += "-dirty"
	}
	return fmt.Sprintf("%s (module github.com/ckptkit/ckptkit, commit %s)", v, c)
}

// commandName is the command's path below the root ("plugins list").
func commandName(c *cobra.Command) string {
	return strings.TrimPrefix(strings.TrimPrefix(c.CommandPath(), c.Root().Name()), " ")
}
