package fs

import (
	"errors"
	"hash/fnv"
	"os"
	"strconv"
	"syscall"
)

// hostOwner identifies the pid space of this process: the kernel's boot id
// (one per machine and boot) and the inode of its pid namespace (one per
// container), hashed to 8 hex digits. Two temporary files with the same
// owner tag have pids from the same pid space, so whether the writer is
// alive can be asked with kill(pid, 0). "" when either is unknown: such
// files are never judged by pid.
func hostOwner() string {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return ""
	}
	h := fnv.New32a()
	h.Write(boot)
	h.Write([]byte(ns))
	return strconv.FormatUint(uint64(h.Sum32())|1<<32, 16)[1:]
}

// processGone reports whether no process with pid exists in this pid
// namespace. A process that exists but belongs to someone else (EPERM) is
// alive.
func processGone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}
