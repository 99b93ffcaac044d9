package gcs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/storage"

	"github.com/ckptkit/ckptkit/backend"
)

// MarkerDir is the reserved key segment under which the driver records the
// resumable upload sessions it has open. GCS cannot list resumable
// sessions (they expire after a week, parts billed meanwhile), so before
// the first chunk of a resumable upload of <dir>/<name> is sent, the
// driver writes the marker object
//
//	<dir>/.ckptkit-uploads/<name>/<id>
//
// holding the session URI, and deletes it once the upload is finalized or
// cancelled. A process killed in between leaves the marker behind;
// ListUploads reports it and AbortUpload cancels the session and removes
// the marker (what `ckpt gc` does after the grace period). Listings skip
// every key with this segment, and Put refuses such keys.
const MarkerDir = ".ckptkit-uploads"

// cleanupTimeout bounds the clean-up of an upload (cancelling its
// session, deleting its marker) after the caller's context has ended.
const cleanupTimeout = 10 * time.Second

// errReservedKey refuses writes under MarkerDir.
var errReservedKey = errors.New("the key segment " + MarkerDir + " is reserved for the driver's upload markers")

// marker is the body of a marker object.
type marker struct {
	// Version is 1.
	Version int `json:"version"`
	// Key is the object the upload would create.
	Key string `json:"key"`
	// Session is the resumable session URI (it authorises uploads to that
	// object until it expires, so it is never printed).
	Session string `json:"session"`
}

// isReserved reports whether key has a MarkerDir segment.
func isReserved(key string) bool {
	return key == MarkerDir || strings.HasPrefix(key, MarkerDir+"/") || strings.Contains(key, "/"+MarkerDir+"/") ||
		strings.HasSuffix(key, "/"+MarkerDir)
}

// markerKey is the marker of upload id of key.
func markerKey(key, id string) string {
	dir, name := path.Split(key)
	return dir + MarkerDir + "/" + name + "/" + id
}

// parseMarkerKey returns the object key and upload id a marker key names.
func parseMarkerKey(mk string) (key, id string, ok bool) {
	i := strings.LastIndex(mk, MarkerDir+"/")
	if i < 0 || (i > 0 && mk[i-1] != '/') {
		return "", "", false
	}
	name, id, ok := strings.Cut(mk[i+len(MarkerDir)+1:], "/")
	if !ok || name == "" || id == "" || strings.Contains(id, "/") {
		return "", "", false
	}
	return mk[:i] + name, id, true
}

// trackerKey carries a *tracker in the context of a resumable Put.
type trackerKey struct{}

// tracker records the resumable session of one Put.
type tracker struct {
	d   *Driver
	key string
	id  string

	mu      sync.Mutex
	session string // "" until the session was started and recorded
}

// started is called by the transport once the session of the upload is
// open, before its first chunk: it writes the marker. The write is not
// cut by the caller's cancellation (it is one small request, bounded by
// cleanupTimeout): a write cut after the server stored the marker would
// leave a marker nobody deletes. If the marker cannot be written, the
// session is cancelled, the marker deleted should it have landed, and
// the upload fails.
func (tr *tracker) started(ctx context.Context, session string) error {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	mk := markerKey(tr.key, tr.id)
	body, err := json.Marshal(marker{Version: 1, Key: tr.key, Session: session})
	if err == nil {
		err = tr.d.putSmall(wctx, mk, body)
	}
	if err == nil {
		err = ctx.Err() // cancelled meanwhile: the upload stops here
	}
	if err != nil {
		if tr.d.cancelSession(wctx, session) == nil {
			_ = tr.d.deleteObject(wctx, mk)
		}
		return fmt.Errorf("gcs: record the upload session of %s: %w", tr.key, err)
	}
	tr.mu.Lock()
	tr.session = session
	tr.mu.Unlock()
	return nil
}

// done ends the tracking of the upload: when it failed, its session is
// cancelled first (a cancelled writer only stops sending; the session would
// stay for a week). Then the marker is deleted. It runs on a context that
// outlives the caller's, bounded by cleanupTimeout.
func (tr *tracker) done(ctx context.Context, failed bool) error {
	tr.mu.Lock()
	session := tr.session
	tr.mu.Unlock()
	if session == "" {
		return nil
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if failed {
		if err := tr.d.cancelSession(cctx, session); err != nil {
			return err
		}
	}
	return tr.d.deleteObject(cctx, markerKey(tr.key, tr.id))
}

// sessionTransport watches the responses that open resumable sessions and
// hands their URI to the tracker of the Put they belong to.
type sessionTransport struct {
	base http.RoundTripper
}

// RoundTrip implements http.RoundTripper.
func (t *sessionTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	tr, _ := req.Context().Value(trackerKey{}).(*tracker)
	if tr == nil || req.Method != http.MethodPost || req.URL.Query().Get("uploadType") != "resumable" ||
		req.URL.Query().Has("upload_id") || resp.StatusCode != http.StatusOK {
		return resp, nil
	}
	session := resp.Header.Get("Location")
	if session == "" {
		return resp, nil
	}
	if err := tr.started(req.Context(), session); err != nil {
		_ = resp.Body.Close()
		return nil, err
	}
	return resp, nil
}

// putSmall writes body to key in a single request, untracked.
func (d *Driver) putSmall(ctx context.Context, key string, body []byte) error {
	w := d.bucket.Object(key).NewWriter(context.WithValue(ctx, trackerKey{}, (*tracker)(nil)))
	w.ChunkSize = 0
	w.ContentType = "application/json"
	if _, err := w.Write(body); err != nil {
		_ = w.Close()
		return err
	}
	return w.Close()
}

// deleteObject deletes key; a missing key is not an error.
func (d *Driver) deleteObject(ctx context.Context, key string) error {
	err := d.bucket.Object(key).Delete(ctx)
	if err != nil && !errors.Is(err, storage.ErrObjectNotExist) {
		return fmt.Errorf("gcs: delete %s: %w", key, err)
	}
	return nil
}

// cancelSession cancels a resumable session (DELETE on its URI). GCS
// answers 499 when it cancelled the session; 404 and 410 mean it is gone
// already (expired, finalized or cancelled before). Any other client error
// but 401, 403, 408 and 429 means the URI names no session the server will
// act on (a finalized one, say): nothing is left to cancel either, so a
// marker of it does not make every later gc fail.
func (d *Driver) cancelSession(ctx context.Context, session string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, session, nil)
	if err != nil {
		return fmt.Errorf("gcs: cancel upload session: %w", err)
	}
	req.Header.Set("Content-Length", "0")
	resp, err := d.hc.Do(req)
	if err != nil {
		// The URI is a bearer credential: keep it out of the error.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("gcs: cancel upload session: %w", err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	_ = resp.Body.Close()
	switch c := resp.StatusCode; {
	case c < 300:
		return nil
	case c == http.StatusUnauthorized || c == http.StatusForbidden || c == http.StatusRequestTimeout || c == http.StatusTooManyRequests:
	case c >= 400 && c < 500: // 499 (cancelled), 404, 410, ...
		return nil
	}
	return fmt.Errorf("gcs: cancel upload session: %w", &httpStatusError{code: resp.StatusCode})
}

// httpStatusError is an unexpected status of a raw request.
type httpStatusError struct{ code int }

func (e *httpStatusError) Error() string {
	return fmt.Sprintf("HTTP %d %s", e.code, http.StatusText(e.code))
}

// ListUploads implements backend.UploadLister: the markers of resumable
// uploads under prefix that were never finalized or cancelled (the
// writer was killed). Initiated is the marker's creation time; the size
// of what was sent is not known (0).
func (d *Driver) ListUploads(ctx context.Context, prefix string, fn func(backend.Upload) error) error {
	return d.objects(ctx, "list uploads", &storage.Query{Prefix: prefix}, []string{"Name", "Created"}, func(a *storage.ObjectAttrs) error {
		key, id, ok := parseMarkerKey(a.Name)
		if !ok {
			return nil
		}
		return fn(backend.Upload{Key: key, ID: id, Initiated: a.Created})
	})
}

// AbortUpload implements backend.UploadLister: it cancels the session the
// marker of upload id of key records, then deletes the marker. A marker
// that is gone is not an error.
func (d *Driver) AbortUpload(ctx context.Context, key, id string) error {
	if strings.Contains(id, "/") || id == "" {
		return fmt.Errorf("gcs: abort upload of %s: invalid upload id %q", key, id)
	}
	mk := markerKey(key, id)
	r, err := d.bucket.Object(mk).NewReader(ctx)
	if errors.Is(err, storage.ErrObjectNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("gcs: abort upload of %s: read marker %s: %w", key, mk, err)
	}
	body, err := io.ReadAll(io.LimitReader(r, 1<<16))
	_ = r.Close()
	if err != nil {
		return fmt.Errorf("gcs: abort upload of %s: read marker %s: %w", key, mk, err)
	}
	var m marker
	if err := json.Unmarshal(body, &m); err != nil || m.Session == "" {
		// Not a marker this driver wrote: nothing to cancel, and no
		// reason to keep it.
		return d.deleteObject(ctx, mk)
	}
	if err := d.cancelSession(ctx, m.Session); err != nil {
		return fmt.Errorf("gcs: abort upload of %s (marker %s): %w", key, mk, err)
	}
	return d.deleteObject(ctx, mk)
}

// newUploadID returns a fresh random upload id (hex).
func newUploadID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
