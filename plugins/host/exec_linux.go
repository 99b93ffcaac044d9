//go:build linux

package host

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal asks the kernel to SIGKILL the plugin when the host
// dies. Linux ties the signal to the OS thread that started the child, so
// in the rare case of that thread ending early the plugin is killed early
// too and the next call restarts it; the SDK's parent watch covers systems
// without this signal.
func setParentDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
