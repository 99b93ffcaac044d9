// Command fsplugin is an example ckptkit storage plugin that serves the
// local filesystem driver (backend/fs) out of process, for URLs
// localdir:///abs/dir. It shows that any backend.Driver becomes a plugin
// with one sdk.Serve call, and it is the disk-backed driver the plugin
// throughput benchmark compares with the same driver in process.
//
//	go build -o ~/.ckptkit/plugins/fsplugin ./plugins/examples/fsplugin
//	ckpt --plugin-dir ~/.ckptkit/plugins train --url localdir:///tmp/run7
package main

import (
	"github.com/ckptkit/ckptkit/backend/fs"
	"github.com/ckptkit/ckptkit/plugins/sdk"
)

func main() {
	sdk.Serve(sdk.Config{Name: "fsplugin", Version: "0.1.0", Schemes: []string{"localdir"}, Open: fs.Open})
}
