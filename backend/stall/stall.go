// Package stall fails HTTP requests to storage that make no progress: an
// http.RoundTripper that the S3 and GCS drivers put under their SDKs.
//
// A request makes progress when it gets its connection, when a byte of it
// goes out (the transport takes the next piece of its body, or has
// written it all) or a byte of its answer comes in (the response header,
// a piece of its body). One that goes without progress
// for the stall timeout of the Store call it belongs to
// (backend.StallTimeout of its context) is cancelled and fails with a
// *backend.StallError naming the request, what it waited for and how
// long: a transient error the Store retries, never a cancellation. The
// time the caller itself takes is not counted: producing the next piece
// of the request body, and the time between two reads of the response
// body (a consumer that is busy is not a stalled server).
package stall

import (
	"context"
	"io"
	"net/http"
	"net/http/httptrace"
	"sync"
	"time"

	"github.com/ckptkit/ckptkit/backend"
)

// Wrap returns base watched for stalls.
func Wrap(base http.RoundTripper) http.RoundTripper { return &transport{base: base} }

type transport struct{ base http.RoundTripper }

// RoundTrip implements http.RoundTripper.
func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	d := backend.StallTimeout(req.Context())
	if d <= 0 {
		return t.base.RoundTrip(req)
	}
	ctx, cancel := context.WithCancel(req.Context())
	u := *req.URL
	u.RawQuery, u.Fragment, u.User = "", "", nil
	w := &watch{d: d, cancel: cancel, request: req.Method + " " + u.String(), waiting: "connecting"}
	w.timer = time.AfterFunc(d, w.fire) // connecting and sending the header count
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn:              func(httptrace.GotConnInfo) { w.progress("sending the request") },
		WroteRequest:         func(httptrace.WroteRequestInfo) { w.progress("waiting for the response") },
		GotFirstResponseByte: func() { w.progress("receiving the response header") },
	})
	r := req.WithContext(ctx)
	if req.Body != nil && req.Body != http.NoBody {
		r.Body = &requestBody{rc: req.Body, w: w}
		if req.GetBody != nil {
			r.GetBody = func() (io.ReadCloser, error) {
				b, err := req.GetBody()
				if err != nil || b == nil || b == http.NoBody {
					return b, err
				}
				return &requestBody{rc: b, w: w}, nil
			}
		}
	}
	resp, err := t.base.RoundTrip(r)
	if err != nil {
		w.pause("")
		cancel()
		if serr := w.stalled(); serr != nil {
			return nil, serr
		}
		return nil, err
	}
	// The header arrived. The body is watched only while a read waits on
	// it.
	w.pause("receiving the response body")
	resp.Body = &responseBody{rc: resp.Body, w: w}
	return resp, nil
}

// watch is the no-progress timer of one request.
type watch struct {
	d       time.Duration
	cancel  context.CancelFunc
	request string

	mu      sync.Mutex
	timer   *time.Timer
	waiting string // what the request waits for while the timer runs
	fired   bool
}

// fire cancels the request: it made no progress for d.
func (w *watch) fire() {
	w.mu.Lock()
	w.fired = true
	w.mu.Unlock()
	w.cancel()
}

// progress restarts the timer: the request is now waiting for what says.
func (w *watch) progress(what string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.fired {
		w.waiting = what
		w.timer.Reset(w.d)
	}
}

// pause stops the timer while the time is the caller's, not the server's;
// what, when not empty, is what the request waits for when it restarts.
func (w *watch) pause(what string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.timer.Stop()
	if what != "" {
		w.waiting = what
	}
}

// stalled returns the request's StallError when the timer fired, else nil.
func (w *watch) stalled() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.fired {
		return nil
	}
	return &backend.StallError{Request: w.request, Waiting: w.waiting, Waited: w.d}
}

// requestBody is a request body whose reads are progress: the transport
// asks for the next piece once it sent the previous one. The time a read
// takes is the caller's (its source producing bytes) and is not counted.
type requestBody struct {
	rc io.ReadCloser
	w  *watch
}

func (b *requestBody) Read(p []byte) (int, error) {
	b.w.pause("")
	n, err := b.rc.Read(p)
	b.w.progress("sending the request body")
	return n, err
}

func (b *requestBody) Close() error { return b.rc.Close() }

// responseBody is a response body watched while a read waits on it.
type responseBody struct {
	rc io.ReadCloser
	w  *watch
}

func (b *responseBody) Read(p []byte) (int, error) {
	b.w.progress("receiving the response body")
	n, err := b.rc.Read(p)
	b.w.pause("")
	if err != nil && err != io.EOF {
		if serr := b.w.stalled(); serr != nil {
			return n, serr
		}
	}
	if err == io.EOF {
		b.w.cancel() // the request is over; frees its context
	}
	return n, err
}

func (b *responseBody) Close() error {
	err := b.rc.Close()
	b.w.pause("")
	b.w.cancel()
	return err
}
