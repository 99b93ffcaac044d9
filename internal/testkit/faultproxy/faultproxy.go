// Package faultproxy is a test helper: an HTTP reverse proxy in front of a
// real object-store server (versitygw, fake-gcs-server) that counts the
// requests it sees and answers chosen ones with an error status itself, or
// breaks their connection (reset before the response, truncated headers, a
// body cut short), so tests can count at the server how often a client
// retried and see how it classifies transport failures, or stalls them
// (accepts a request and answers nothing, as a stopped server does).
package faultproxy

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
	"time"
)

// Rule decides whether the proxy fails a request instead of forwarding it.
// n is the number of earlier requests the same Rule matched.
type Rule struct {
	// Match selects the requests the rule counts.
	Match func(r *http.Request) bool
	// Fail reports whether the n-th (from 0) matching request is failed.
	// Nil fails every matching request.
	Fail func(n int) bool
	// Status and Body are the failure's response (ContentType, default
	// application/xml).
	Status      int
	Body        string
	ContentType string
	// Delay holds back the response to a matching request that is
	// forwarded (not failed) this long after the server answered it: the
	// server has acted, the client has not heard yet.
	Delay time.Duration
	// Seen, when set, gets a value (without blocking) for every matching
	// request as it arrives.
	Seen chan<- struct{}
	// Break, when set, fails a request by breaking its connection instead
	// of answering with Status.
	Break Break
	// Breaks, when set, replaces Break: the n-th request the rule fails
	// (from 0) breaks the way Breaks[n%len(Breaks)] says.
	Breaks []Break
}

// breakOf returns how the rule fails its n-th failed request.
func (r *Rule) breakOf(n int) Break {
	if len(r.Breaks) > 0 {
		return r.Breaks[n%len(r.Breaks)]
	}
	return r.Break
}

// Break is a way of failing a request at the transport level.
type Break int

// The breaks.
const (
	// NoBreak answers with the rule's Status and Body.
	NoBreak Break = iota
	// Reset closes the connection with a TCP reset before any byte of a
	// response: the client sees a reset or an early EOF. The server never
	// sees the request.
	Reset
	// BrokenHeaders writes a status line and a header block cut in the
	// middle of a line, then closes: the client sees a malformed header
	// or an unexpected EOF. The server never sees the request.
	BrokenHeaders
	// CutBody forwards the request (the server acts on it), sends the
	// response's header and half of its body, then closes the connection:
	// the client sees an unexpected EOF after the server has, say,
	// committed an object.
	CutBody
	// Stall accepts the request and then sends nothing and reads nothing
	// more, as a stopped (SIGSTOPped) server does: the client waits until
	// it gives up. The server never sees the request.
	Stall
	// StallResponse forwards the request (the server acts on it) and then
	// sends nothing: the client waits for an answer that never comes
	// after the server has, say, committed an object.
	StallResponse
)

// Proxy is a running fault-injecting proxy.
type Proxy struct {
	srv    *httptest.Server
	mu     sync.Mutex
	rules  []*Rule
	counts map[*Rule]int
	failed map[*Rule]int
	// stalled are the connections of stalled requests, closed by Close.
	stalled []net.Conn
}

// New starts a proxy forwarding to target ("http://host:port").
func New(target string) (*Proxy, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, err
	}
	p := &Proxy{counts: map[*Rule]int{}, failed: map[*Rule]int{}}
	rp := httputil.NewSingleHostReverseProxy(u)
	// A client that gives up on a request (a killed process, a cancelled
	// context) is not a proxy failure worth a log line; anything else is
	// logged as httputil does.
	rp.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		if r.Context().Err() == nil {
			log.Printf("faultproxy: %s %s: %v", r.Method, r.URL.Path, err)
		}
		w.WriteHeader(http.StatusBadGateway)
	}
	// The Host header stays the proxy's: request signatures (S3 SigV4) were
	// computed for it.
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rule, b, delay := p.match(r)
		if b == Stall || b == StallResponse {
			p.stall(w, r, rp, b)
			return
		}
		if b != NoBreak {
			breakConn(w, r, rp, b)
			return
		}
		if rule != nil {
			ct := rule.ContentType
			if ct == "" {
				ct = "application/xml"
			}
			w.Header().Set("Content-Type", ct)
			w.Header().Set("Connection", "close")
			w.WriteHeader(rule.Status)
			_, _ = w.Write([]byte(rule.Body))
			return
		}
		if delay > 0 {
			w = &delayedWriter{ResponseWriter: w, delay: delay}
		}
		rp.ServeHTTP(w, r)
	}))
	return p, nil
}

// match counts r against the rules and returns the rule that fails it
// and how (NoBreak: with the rule's Status), and the longest Delay of the
// matching rules that do not.
func (p *Proxy) match(r *http.Request) (*Rule, Break, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var fail *Rule
	var b Break
	var delay time.Duration
	for _, rule := range p.rules {
		if !rule.Match(r) {
			continue
		}
		if rule.Seen != nil {
			select {
			case rule.Seen <- struct{}{}:
			default:
			}
		}
		n := p.counts[rule]
		p.counts[rule]++
		if fail == nil && (rule.Fail == nil || rule.Fail(n)) {
			b = rule.breakOf(p.failed[rule])
			p.failed[rule]++
			fail = rule
			continue
		}
		delay = max(delay, rule.Delay)
	}
	return fail, b, delay
}

// breakConn fails r by breaking its connection the way b says.
func breakConn(w http.ResponseWriter, r *http.Request, rp http.Handler, b Break) {
	var partial bytes.Buffer
	switch b {
	case BrokenHeaders:
		partial.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nContent-Len")
	case CutBody:
		// The server acts on the request; the client gets the response's
		// header and half of its body, or nothing when it has no body.
		rec := httptest.NewRecorder()
		rp.ServeHTTP(rec, r)
		if body := rec.Body.Bytes(); len(body) >= 2 {
			fmt.Fprintf(&partial, "HTTP/1.1 %d %s\r\n", rec.Code, http.StatusText(rec.Code))
			h := rec.Header().Clone()
			h.Set("Content-Length", strconv.Itoa(len(body)))
			_ = h.Write(&partial)
			partial.WriteString("\r\n")
			partial.Write(body[:len(body)/2])
		}
	}
	conn, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	if partial.Len() > 0 {
		// Delivered, then an orderly close: the client reads the partial
		// response and then an early EOF.
		_, _ = buf.Write(partial.Bytes())
		_ = buf.Flush()
	} else if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0) // a reset, not an orderly close
	}
	_ = conn.Close()
}

// stall holds r's connection open without answering (after forwarding r
// for StallResponse) until the client closes it or the proxy closes.
func (p *Proxy) stall(w http.ResponseWriter, r *http.Request, rp http.Handler, b Break) {
	if b == StallResponse {
		rp.ServeHTTP(httptest.NewRecorder(), r)
	}
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	p.mu.Lock()
	p.stalled = append(p.stalled, conn)
	p.mu.Unlock()
	if b == StallResponse {
		// The request was read whole: a read now sees the client close.
		go func() {
			_, _ = io.Copy(io.Discard, conn)
			_ = conn.Close()
		}()
	}
	// A Stall reads nothing more (the client's writes back up, as they
	// do to a stopped process); its connection stays until Close.
}

// delayedWriter holds a forwarded response back before its header.
type delayedWriter struct {
	http.ResponseWriter
	delay time.Duration
	once  sync.Once
}

func (d *delayedWriter) WriteHeader(code int) {
	d.once.Do(func() { time.Sleep(d.delay) })
	d.ResponseWriter.WriteHeader(code)
}

func (d *delayedWriter) Write(b []byte) (int, error) {
	d.once.Do(func() { time.Sleep(d.delay) })
	return d.ResponseWriter.Write(b)
}

// Add installs a rule (rules added later are checked after earlier ones).
func (p *Proxy) Add(r *Rule) *Rule {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rules = append(p.rules, r)
	return r
}

// Count returns how many requests r matched (failed or forwarded).
func (p *Proxy) Count(r *Rule) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.counts[r]
}

// Failed returns how many requests r failed.
func (p *Proxy) Failed(r *Rule) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failed[r]
}

// Clear removes every rule, so that clean-up traffic passes.
func (p *Proxy) Clear() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rules = nil
}

// Host returns the proxy's host:port.
func (p *Proxy) Host() string { return p.srv.Listener.Addr().String() }

// Close stops the proxy, closing the connections it stalled.
func (p *Proxy) Close() {
	p.mu.Lock()
	for _, c := range p.stalled {
		_ = c.Close()
	}
	p.stalled = nil
	p.mu.Unlock()
	p.srv.Close()
}
