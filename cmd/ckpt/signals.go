package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// interrupt turns SIGINT and SIGTERM into the cancellation of the root
// context every command runs under: in-flight uploads are aborted (the
// drivers clean up on a fresh context), plugin processes are shut down by
// run's host.CloseAll, and the command's error says what was left
// unfinished. The process then exits 128 + the signal number (130 for
// SIGINT, 143 for SIGTERM), whatever the command returned. A second signal
// exits at once, with the same code.
type interrupt struct {
	mu      sync.Mutex
	sig     os.Signal // the first signal, nil until one arrives
	claimed func(os.Signal)
	ch      chan os.Signal
	stderr  io.Writer
	exit    func(int)
}

type interruptKey struct{}

// interruptOf returns the interrupt watching ctx's process, or nil (a
// command run in-process, by a test).
func interruptOf(ctx context.Context) *interrupt {
	in, _ := ctx.Value(interruptKey{}).(*interrupt)
	return in
}

// claimFirst makes a first signal call f instead of cancelling the root
// context, until release is called: a command that stops gracefully on
// its own (ckpt train saves the current step) takes the first signal,
// while a second one still exits at once.
func (in *interrupt) claimFirst(f func(os.Signal)) (release func()) {
	in.mu.Lock()
	in.claimed = f
	in.mu.Unlock()
	return func() {
		in.mu.Lock()
		in.claimed = nil
		in.mu.Unlock()
	}
}

// interruptSignals are the signals that interrupt a command.
var interruptSignals = []os.Signal{os.Interrupt, syscall.SIGTERM}

// withInterrupt returns a context cancelled by the first SIGINT or SIGTERM
// and the interrupt that watches for them; call stop when the command ends.
func withInterrupt(parent context.Context, stderr io.Writer) (context.Context, *interrupt) {
	ctx, cancel := context.WithCancelCause(parent)
	in := &interrupt{ch: make(chan os.Signal, 2), stderr: stderr, exit: os.Exit}
	ctx = context.WithValue(ctx, interruptKey{}, in)
	signal.Notify(in.ch, interruptSignals...)
	go func() {
		for s := range in.ch {
			in.mu.Lock()
			first := in.sig == nil
			if first {
				in.sig = s
			}
			claimed := in.claimed
			in.mu.Unlock()
			if first && claimed != nil {
				fmt.Fprintf(stderr, "ckpt: %s: finishing gracefully (a second signal exits at once)\n", signalName(s))
				claimed(s)
				continue
			}
			if first {
				fmt.Fprintf(stderr, "ckpt: %s: stopping (a second signal exits at once)\n", signalName(s))
				cancel(fmt.Errorf("interrupted by %s: %w", signalName(s), context.Canceled))
				continue
			}
			fmt.Fprintf(stderr, "ckpt: second %s: exiting at once; uploads in flight may be left for the store's own clean-up\n", signalName(s))
			in.exit(exitCodeFor(s))
		}
	}()
	return ctx, in
}

// stop stops watching for signals and returns the process exit code: code
// (run's result) when no signal came, 128 + the signal number when one did.
func (in *interrupt) stop(code int) int {
	signal.Stop(in.ch)
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.sig == nil {
		return code
	}
	fmt.Fprintf(in.stderr, "ckpt: interrupted by %s (exit %d)\n", signalName(in.sig), exitCodeFor(in.sig))
	return exitCodeFor(in.sig)
}

// exitCodeFor is the shell convention for death by signal: 128 + number.
func exitCodeFor(s os.Signal) int {
	if n, ok := s.(syscall.Signal); ok {
		return 128 + int(n)
	}
	return 130
}

func signalName(s os.Signal) string {
	switch s {
	case os.Interrupt:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	}
	return s.String()
}
