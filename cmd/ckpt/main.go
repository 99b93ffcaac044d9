// Command ckpt trains a small model with sharded checkpoints and inspects,
// verifies and operates on checkpoints in any storage chosen by URL
// (file://, plain paths, mem://, s3://, gs://, or a plugin's scheme).
//
// Exit codes follow the error's ckpterr class: 0 success, 1 bad checkpoint,
// 2 usage, 3 not found, 4 access, 5 transient, 6 conflict, 7 unsupported,
// 10 internal, 130 interrupted (143 for SIGTERM; see signals.go and
// README.md, "Exit codes").
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	_ "github.com/ckptkit/ckptkit/backend/fs"
	_ "github.com/ckptkit/ckptkit/backend/gcs"
	_ "github.com/ckptkit/ckptkit/backend/mem"
	_ "github.com/ckptkit/ckptkit/backend/s3"
	"github.com/ckptkit/ckptkit/ckpterr"
	_ "github.com/ckptkit/ckptkit/interop/torchdcp"
	"github.com/ckptkit/ckptkit/plugins/host"
	"github.com/spf13/cobra"
)

// bad marks err as "the checkpoint is bad" (exit 1) unless err already
// carries a class of its own (a missing path stays not-found, a dropped
// connection stays transient).
func bad(err error) error {
	if ckpterr.ClassOf(err) != ckpterr.Internal {
		return err
	}
	return ckpterr.WithClass(err, ckpterr.BadCheckpoint)
}

// usage marks err as a usage error (exit 2) when it carries no class.
func usage(err error) error {
	if err == nil || ckpterr.ClassOf(err) != ckpterr.Internal {
		return err
	}
	return ckpterr.WithClass(err, ckpterr.Usage)
}

// Exit codes by error class: the table in README.md ("Exit codes") and
// TestExitCodeTableMatchesREADME keep them in step.
var exitCodes = map[ckpterr.Class]int{
	ckpterr.BadCheckpoint: 1,
	ckpterr.Usage:         2,
	ckpterr.NotFound:      3,
	ckpterr.Access:        4,
	ckpterr.Transient:     5,
	ckpterr.Conflict:      6,
	ckpterr.Unsupported:   7,
	ckpterr.Internal:      10,
	ckpterr.Canceled:      130,
}

// exitCode returns the process exit code of a command's error: the one it
// names itself (a preempted train: 128 + the signal), else its class's.
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var own interface{ ExitCode() int }
	if errors.As(err, &own) {
		return own.ExitCode()
	}
	return exitCodes[ckpterr.ClassOf(err)]
}

func main() {
	// SIGINT/SIGTERM cancel every command's context; the exit code is then
	// 130/143 (see signals.go).
	os.Exit(runMain(os.Args[1:]))
}

// runMain is main without the exit: run under the process's interrupt.
func runMain(args []string) int {
	boundHeapGrowth()
	ctx, in := withInterrupt(context.Background(), os.Stderr)
	return in.stop(run(ctx, args, os.Stdout, os.Stderr))
}

// run executes the ckpt command line args and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	defer host.CloseAll() // plugin processes never outlive the command
	in := &invocation{stderr: stderr}
	root := newRootCmd(in)
	started := markStarted(root)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	c, err := root.ExecuteContextC(context.WithValue(ctx, invocationKey{}, in))
	if err != nil && !*started {
		// cobra refused the command line (unknown command or flag, wrong
		// argument count) before any command ran.
		err = usage(err)
	}
	hint := storageHint(err, firstArg(c, args))
	if wantsJSON(c) && (err != nil || in.doc != nil) {
		jerr := err
		if hint != "" {
			jerr = fmt.Errorf("%w; %s", err, hint)
		}
		if werr := writeDocument(stdout, commandName(c), in.doc, jerr, cmdArgs(c, args)); werr != nil && err == nil {
			err = werr
		}
	}
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "ckpt:", safe(err.Error()))
	if hint != "" {
		fmt.Fprintln(stderr, "ckpt:", hint)
	}
	return exitCode(err)
}

// cmdArgs are the positional arguments of c in args (all args when c is
// unknown).
func cmdArgs(c *cobra.Command, args []string) []string {
	if c != nil && c.Flags().Parsed() {
		return c.Flags().Args()
	}
	return args
}

// firstArg is the first positional argument of c, "" when none.
func firstArg(c *cobra.Command, args []string) string {
	for _, a := range cmdArgs(c, args) {
		if a != "" && a[0] != '-' {
			return a
		}
	}
	return ""
}

// markStarted wraps the RunE of every command under root so that the
// returned flag turns true once a command's own code runs: an error before
// that is cobra's, about the command line.
func markStarted(root *cobra.Command) *bool {
	started := new(bool)
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.RunE != nil {
			runE := c.RunE
			c.RunE = func(cmd *cobra.Command, args []string) error {
				*started = true
				return runE(cmd, args)
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	return started
}
