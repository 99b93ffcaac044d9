package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync"
)

// preemption is `ckpt train`'s handling of SIGTERM and SIGINT: the first
// signal asks the loop to stop after its step, let the in-flight save
// commit and save the current step; the second cancels the context the
// training and its saves run under, which aborts them at once (nothing
// half-written is committed: the metadata goes last).
type preemption struct {
	requested chan struct{} // closed on the first signal
	once      sync.Once
	mu        sync.Mutex
	sig       os.Signal
	stop      func()
}

// watchPreemption returns ctx's child that a second signal cancels and
// the watcher; stop ends the watch. Under main's interrupt (signals.go),
// train claims the first signal and the interrupt exits at the second;
// without one (run called in-process) it watches the signals itself.
func watchPreemption(ctx context.Context) (context.Context, *preemption) {
	ctx, cancel := context.WithCancel(ctx)
	p := &preemption{requested: make(chan struct{})}
	if in := interruptOf(ctx); in != nil {
		release := in.claimFirst(func(s os.Signal) { p.first(s) })
		p.stop = func() {
			release()
			cancel()
		}
		return ctx, p
	}
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, interruptSignals...)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-ch:
				if p.first(s) {
					continue
				}
				cancel() // the second signal
			case <-done:
				return
			}
		}
	}()
	p.stop = func() {
		signal.Stop(ch)
		close(done)
		cancel()
	}
	return ctx, p
}

// first records s and reports whether it is the first signal.
func (p *preemption) first(s os.Signal) bool {
	isFirst := false
	p.once.Do(func() {
		p.mu.Lock()
		p.sig = s
		p.mu.Unlock()
		close(p.requested)
		isFirst = true
	})
	return isFirst
}

// signal returns the first signal received, or nil.
func (p *preemption) signal() os.Signal {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sig
}

// pending reports whether a signal asked the loop to stop.
func (p *preemption) pending() bool {
	select {
	case <-p.requested:
		return true
	default:
		return false
	}
}

// preemptedError ends a preempted `ckpt train`: class canceled, exit code
// 143 for SIGTERM and 130 for SIGINT (128 + the signal number).
type preemptedError struct {
	sig     os.Signal
	step    int64
	saved   string // the checkpoint of the current step, "" if none
	aborted error  // why the preemption save did not happen (second signal, failure)
}

func (e *preemptedError) Error() string {
	name := signalName(e.sig)
	if e.aborted != nil {
		return fmt.Sprintf("%s at step %d: aborted without saving the current step: %v", name, e.step, e.aborted)
	}
	return fmt.Sprintf("%s at step %d: saved %s", name, e.step, e.saved)
}

// Unwrap makes the error a cancellation (ckpterr class canceled).
func (e *preemptedError) Unwrap() []error {
	if e.aborted != nil {
		return []error{context.Canceled, e.aborted}
	}
	return []error{context.Canceled}
}

// ExitCode is 128 + the signal number (143 SIGTERM, 130 SIGINT).
func (e *preemptedError) ExitCode() int { return exitCodeFor(e.sig) }
