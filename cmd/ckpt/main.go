// Command ckpt trains a small model with sharded checkpoints and inspects,
// verifies and operates on checkpoints in any storage chosen by URL
// (file://, plain paths, mem://, s3://, gs://, or a plugin's scheme).
//
// Exit codes: 0 success, 1 the checkpoint is bad, incomplete or (for
// verify) not resumable, 2 usage or access errors.
package main

import (
	"errors"
	"fmt"
	"os"

	_ "github.com/ckptkit/ckptkit/backend/fs"
	_ "github.com/ckptkit/ckptkit/backend/mem"
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
	root := newRootCmd()
	err := root.Execute()
	if err == nil {
		return
	}
	fmt.Fprintln(os.Stderr, "ckpt:", err)
	var ee *exitError
	if errors.As(err, &ee) {
		os.Exit(ee.code)
	}
	os.Exit(2)
}
