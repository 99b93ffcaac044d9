// Command ckpt trains a small model with sharded checkpoints and inspects,
// verifies and operates on checkpoints in any storage chosen by URL
// (file://, plain paths, mem://, s3://, gs://, or a plugin's scheme).
//
// Exit codes: 0 success, 1 the checkpoint is bad, incomplete or (for
// verify) not resumable, 2 usage or access errors.
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
	_ "github.com/ckptkit/ckptkit/interop/torchdcp"
	"github.com/ckptkit/ckptkit/loader"
	"github.com/ckptkit/ckptkit/metadata"
	"github.com/ckptkit/ckptkit/planner"
	"github.com/ckptkit/ckptkit/plugins/host"
)

// exitError carries the process exit code of a failed command.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// bad marks err as "the checkpoint is bad" (exit 1).
func bad(err error) error { return &exitError{code: 1, err: err} }

func main() {
	// SIGINT/SIGTERM cancel every command's context; the exit code is then
	// 130/143 (see signals.go).
	ctx, in := withInterrupt(context.Background(), os.Stderr)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	os.Exit(in.stop(code))
}

// run executes the ckpt command line args and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	defer host.CloseAll() // plugin processes never outlive the command
	root := newRootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "ckpt:", err)
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	if checkpointProblem(err) {
		return 1
	}
	return 2
}

// checkpointProblem reports whether err says a checkpoint is bad or
// incomplete (exit 1) rather than that the command or access failed.
func checkpointProblem(err error) bool {
	for _, target := range []error{
		loader.ErrIncomplete, loader.ErrNoCheckpoint, loader.ErrChecksum, loader.ErrPartialOptimizerState,
		loader.ErrLayoutMismatch, loader.ErrMissingKeys, loader.ErrMismatch, planner.ErrCoverage,
		metadata.ErrInvalid, metadata.ErrNewerFormat,
	} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}
