package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/ckpterr"
)

// storeLogger is the logger openStore gives the stores it opens; run sets
// it from -v/--log-level.
var storeLogger = slog.New(slog.DiscardHandler)

// openStore opens rawURL; at debug level every storage request is logged
// (operation, key, bytes, duration, error) through a logDriver.
func openStore(ctx context.Context, rawURL string) (*backend.Store, error) {
	st, err := backend.Open(ctx, rawURL)
	if err != nil {
		return nil, err
	}
	if storeLogger.Enabled(ctx, slog.LevelDebug) {
		st = st.WithDriver(&logDriver{Driver: st.Driver(), log: storeLogger.With("store", st.String())})
	}
	return st, nil
}

// logDriver logs each call of the driver it wraps at debug level.
type logDriver struct {
	backend.Driver
	log *slog.Logger
}

func (d *logDriver) done(ctx context.Context, op, key string, start time.Time, err error, attrs ...any) {
	attrs = append(attrs, "op", op, "key", key, "seconds", time.Since(start).Seconds())
	if err != nil {
		attrs = append(attrs, "error", err)
	}
	d.log.DebugContext(ctx, "storage request", attrs...)
}

func (d *logDriver) NewRangeReader(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	start := time.Now()
	r, err := d.Driver.NewRangeReader(ctx, key, offset, length)
	d.done(ctx, "read", key, start, err, "offset", offset, "length", length)
	return r, err
}

func (d *logDriver) Put(ctx context.Context, key string, size int64, r io.Reader, opts backend.PutOptions) error {
	start := time.Now()
	err := d.Driver.Put(ctx, key, size, r, opts)
	d.done(ctx, "put", key, start, err, "bytes", size, "if_not_exists", opts.IfNotExists)
	return err
}

func (d *logDriver) Stat(ctx context.Context, key string) (backend.Attributes, error) {
	start := time.Now()
	a, err := d.Driver.Stat(ctx, key)
	d.done(ctx, "stat", key, start, err)
	return a, err
}

func (d *logDriver) List(ctx context.Context, prefix string, fn func(backend.ObjectInfo) error) error {
	start := time.Now()
	err := d.Driver.List(ctx, prefix, fn)
	d.done(ctx, "list", prefix, start, err)
	return err
}

func (d *logDriver) ListDelimited(ctx context.Context, prefix string, fn func(backend.ObjectInfo) error) error {
	start := time.Now()
	err := d.Driver.ListDelimited(ctx, prefix, fn)
	d.done(ctx, "list-delimited", prefix, start, err)
	return err
}

func (d *logDriver) Delete(ctx context.Context, key string) error {
	start := time.Now()
	err := d.Driver.Delete(ctx, key)
	d.done(ctx, "delete", key, start, err)
	return err
}

// storageHint says what to check after a storage error on a cloud URL: for
// an access error, which credentials were found (never their values), the
// endpoint and the region; for a network error, the endpoint. It returns ""
// for other errors and schemes.
func storageHint(err error, rawURL string) string {
	if err == nil {
		return ""
	}
	u, perr := backend.ParseURL(rawURL)
	if perr != nil {
		return ""
	}
	q := u.Query()
	var ne net.Error
	if ckpterr.ClassOf(err) == ckpterr.Usage {
		return "" // the error itself says what to change
	}
	if ckpterr.ClassOf(err) != ckpterr.Access {
		if !errors.As(err, &ne) {
			return ""
		}
		// The endpoint cannot be reached (DNS, refused, timeout).
		switch u.Scheme {
		case "s3":
			return "check: the endpoint " + firstOf(q.Get("endpoint"), os.Getenv("AWS_ENDPOINT_URL_S3"), os.Getenv("AWS_ENDPOINT_URL"), "of AWS S3") +
				" is reachable (endpoint= in the URL, $AWS_ENDPOINT_URL_S3 or $AWS_ENDPOINT_URL; see `ckpt help urls`)"
		case "gs":
			return "check: the endpoint " + firstOf(os.Getenv("STORAGE_EMULATOR_HOST"), "of Google Cloud Storage") + " is reachable ($STORAGE_EMULATOR_HOST for an emulator; see `ckpt help env`)"
		}
		return ""
	}
	switch u.Scheme {
	case "s3":
		var found []string
		for _, v := range []string{"AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN", "AWS_PROFILE"} {
			if os.Getenv(v) != "" {
				found = append(found, "$"+v)
			}
		}
		if f := os.Getenv("AWS_SHARED_CREDENTIALS_FILE"); f != "" {
			if _, serr := os.Stat(f); serr == nil {
				found = append(found, "$AWS_SHARED_CREDENTIALS_FILE")
			}
		} else if home, herr := os.UserHomeDir(); herr == nil {
			if _, serr := os.Stat(home + "/.aws/credentials"); serr == nil {
				found = append(found, "~/.aws/credentials")
			}
		}
		creds := "no credentials found in $AWS_ACCESS_KEY_ID, $AWS_PROFILE or the shared credentials file (an instance role may still apply)"
		if len(found) > 0 {
			creds = "credentials from " + strings.Join(found, ", ")
		}
		endpoint := firstOf(q.Get("endpoint"), os.Getenv("AWS_ENDPOINT_URL_S3"), os.Getenv("AWS_ENDPOINT_URL"), "AWS (default)")
		region := firstOf(q.Get("region"), os.Getenv("AWS_REGION"), os.Getenv("AWS_DEFAULT_REGION"), "not set")
		return "check: " + creds + "; endpoint " + endpoint + "; region " + region + " (see `ckpt help env`)"
	case "gs":
		creds := "Application Default Credentials (no $GOOGLE_APPLICATION_CREDENTIALS: gcloud or the metadata server)"
		if v := os.Getenv("GOOGLE_APPLICATION_CREDENTIALS"); v != "" {
			creds = "credentials from $GOOGLE_APPLICATION_CREDENTIALS"
		}
		if h := os.Getenv("STORAGE_EMULATOR_HOST"); h != "" {
			creds = "the emulator at $STORAGE_EMULATOR_HOST=" + h + " (no authentication)"
		}
		return "check: " + creds + "; bucket permissions for " + u.Host + " (see `ckpt help env`)"
	}
	return ""
}

func firstOf(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}
