// Package pluginpb holds the wire protocol between the ckptkit host and a
// storage plugin process: storage.proto and the Go code generated from it by
// gen.sh. Plugin authors do not use it directly; they call sdk.Serve.
package pluginpb
