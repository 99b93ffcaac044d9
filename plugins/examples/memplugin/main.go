// Command memplugin is an example ckptkit storage plugin: an in-memory store
// served for URLs memplug://BUCKET/PREFIX. Each bucket is a memstore.Store
// that lives as long as the plugin process. It uses only the plugin SDK.
//
// Build it into a plugin directory and point ckpt at it:
//
//	go build -o ~/.ckptkit/plugins/memplugin ./plugins/examples/memplugin
//	ckpt --plugin-dir ~/.ckptkit/plugins ls memplug://bucket/run7
package main

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync"

	"github.com/ckptkit/ckptkit/backend"
	"github.com/ckptkit/ckptkit/plugins/examples/memplugin/memstore"
	"github.com/ckptkit/ckptkit/plugins/sdk"
)

// version is the plugin's version, reported to the host.
const version = "0.1.0"

var (
	mu      sync.Mutex
	buckets = map[string]*memstore.Store{}
)

// open serves memplug://BUCKET/PREFIX: the driver is the bucket's store and
// the URL path is the key prefix.
func open(_ context.Context, u *url.URL) (backend.Driver, string, error) {
	if u.Host == "" {
		return nil, "", fmt.Errorf("memplug URL %q names no bucket", u.Redacted())
	}
	mu.Lock()
	defer mu.Unlock()
	st, ok := buckets[u.Host]
	if !ok {
		st = memstore.New()
		buckets[u.Host] = st
	}
	return st, strings.Trim(u.Path, "/"), nil
}

func main() {
	sdk.Serve(sdk.Config{
		Name:    "memplugin",
		Version: version,
		Schemes: []string{"memplug"},
		Open:    open,
	})
}
