package backend

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ckptkit/ckptkit/ckpterr"
)

// Opener builds a driver for a parsed URL. It returns the driver and the key
// prefix inside it that the URL designates (for example the path after the
// bucket of an s3:// URL; "" when the driver itself is rooted there).
type Opener func(ctx context.Context, u *url.URL) (drv Driver, prefix string, err error)

var (
	regMu   sync.RWMutex
	openers = map[string]Opener{}
)

// Register makes a driver available for URLs of scheme. Drivers call it from
// init; plugins call it at discovery. Registering a scheme twice is an error.
func Register(scheme string, o Opener) error {
	scheme = strings.ToLower(scheme)
	if scheme == "" || o == nil {
		return fmt.Errorf("register: empty scheme or nil opener")
	}
	regMu.Lock()
	defer regMu.Unlock()
	if _, dup := openers[scheme]; dup {
		return fmt.Errorf("register: scheme %q is already registered", scheme)
	}
	openers[scheme] = o
	return nil
}

// MustRegister is Register for init functions: it panics on error.
func MustRegister(scheme string, o Opener) {
	if err := Register(scheme, o); err != nil {
		panic(err)
	}
}

// Unregister removes a scheme (for plugin reloads and tests).
func Unregister(scheme string) {
	regMu.Lock()
	defer regMu.Unlock()
	delete(openers, strings.ToLower(scheme))
}

// Schemes lists the registered schemes, sorted.
func Schemes() []string {
	regMu.RLock()
	defer regMu.RUnlock()
	out := make([]string, 0, len(openers))
	for s := range openers {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

// ParseURL parses a storage URL. A string without a scheme is a local path
// and becomes a file:// URL with an absolute path.
func ParseURL(raw string) (*url.URL, error) {
	if raw == "" {
		return nil, fmt.Errorf("empty storage URL")
	}
	if !strings.Contains(raw, "://") {
		abs, err := filepath.Abs(raw)
		if err != nil {
			return nil, fmt.Errorf("local path %q: %w", raw, err)
		}
		return &url.URL{Scheme: "file", Path: filepath.ToSlash(abs)}, nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		// url.Parse echoes the input, which may hold credentials.
		return nil, fmt.Errorf("storage URL %q does not parse", RedactURL(raw))
	}
	u.Scheme = strings.ToLower(u.Scheme)
	return u, nil
}

// Open parses rawURL, picks the driver registered for its scheme and returns
// a Store rooted at the URL. An unknown scheme fails with ErrUnknownScheme and
// lists the registered ones. Credentials in the URL never appear in errors.
func Open(ctx context.Context, rawURL string) (*Store, error) {
	u, err := ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	regMu.RLock()
	o, ok := openers[u.Scheme]
	regMu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("open %s: %w %q (registered schemes: %s)", RedactURL(rawURL), ErrUnknownScheme, u.Scheme, strings.Join(Schemes(), ", "))
	}
	rawQuery := u.RawQuery // with the store's own options, for the URLs it prints
	stall, err := takeStallTimeout(ctx, u)
	if err != nil {
		return nil, ckpterr.WithClass(fmt.Errorf("open %s: %w", RedactURL(rawURL), err), ckpterr.Usage)
	}
	drv, prefix, err := o(ctx, u)
	if err != nil {
		err = fmt.Errorf("open %s: %w", RedactURL(u.String()), err)
		// An opener that refuses a URL without saying why (an unknown
		// query parameter, a malformed endpoint, credentials in the URL, a
		// bucket name the service forbids) refuses the caller's input.
		if ckpterr.ClassOf(err) == ckpterr.Internal {
			err = ckpterr.WithClass(err, ckpterr.Usage)
		}
		return nil, err
	}
	// The driver root is the URL's path less the prefix the opener kept.
	root := *u
	root.RawPath = ""
	root.RawQuery = ""
	root.Fragment = ""
	root.Path = strings.TrimSuffix(strings.TrimSuffix(u.Path, "/"), "/"+strings.Trim(prefix, "/"))
	base := root.String()
	if !strings.Contains(base, "://") { // "mem:" for mem:// with no bucket
		base = root.Scheme + "://" + strings.TrimPrefix(base, root.Scheme+":")
	}
	st, err := NewStore(drv, base, prefix)
	if err != nil {
		drv.Close()
		return nil, fmt.Errorf("open %s: %w", RedactURL(u.String()), err)
	}
	st.query = NonSecretQuery(rawQuery)
	st.stall = stall
	return st, nil
}

// takeStallTimeout returns the stall timeout of a store opened at u: its
// stall_timeout option, else StallTimeoutEnv, else DefaultStallTimeout.
// The option is the Store's, not a driver's: it is taken out of u's query
// before the opener, which refuses options it does not know, sees it.
func takeStallTimeout(ctx context.Context, u *url.URL) (time.Duration, error) {
	q := u.Query()
	if !q.Has(StallTimeoutOption) {
		return stallTimeoutFromEnv(ctx)
	}
	d, err := ParseStallTimeout(q.Get(StallTimeoutOption))
	if err != nil {
		return 0, fmt.Errorf("URL option %s: %w", StallTimeoutOption, err)
	}
	q.Del(StallTimeoutOption)
	u.RawQuery = q.Encode()
	return d, nil
}

// NonSecretQuery returns rawQuery without the options whose names suggest
// credentials (those RedactURL hides), re-encoded in sorted order: what a
// printed URL keeps so that it names the same storage (endpoint, region,
// path_style, insecure). A query that does not parse is dropped whole.
func NonSecretQuery(rawQuery string) string {
	if rawQuery == "" {
		return ""
	}
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return ""
	}
	for k := range q {
		if isSecretParam(k) {
			delete(q, k)
		}
	}
	return q.Encode()
}

func isSecretParam(name string) bool {
	lk := strings.ToLower(name)
	for _, s := range secretParams {
		if strings.Contains(lk, s) {
			return true
		}
	}
	return false
}

var secretParams = []string{"secret", "token", "password", "key", "signature", "credential"}

// RedactURL hides a URL's password and the values of query parameters whose
// names suggest secrets, so the result is safe to print.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		// Unparseable: keep only the scheme, never the rest.
		if j := strings.Index(raw, "://"); j >= 0 {
			return raw[:j+3] + "REDACTED"
		}
		return "REDACTED"
	}
	changed := false
	if u.User != nil {
		u.User = url.User("REDACTED")
		changed = true
	}
	if u.RawQuery != "" {
		q, qerr := url.ParseQuery(u.RawQuery)
		if qerr != nil {
			// A query we cannot read may still hold a secret: drop it whole.
			u.RawQuery = "REDACTED"
			changed = true
		} else {
			for k := range q {
				if isSecretParam(k) {
					q.Set(k, "REDACTED")
					changed = true
				}
			}
			if changed {
				u.RawQuery = q.Encode()
			}
		}
	}
	if !changed {
		return raw // re-serialising would turn "mem://" into "mem:"
	}
	return u.String()
}
