//go:build !linux

package host

import "os/exec"

// setParentDeathSignal is a no-op outside Linux; the SDK's parent watch
// ends an orphaned plugin there.
func setParentDeathSignal(*exec.Cmd) {}
