package fs

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/ckptkit/ckptkit/backend"
)

// Refusals of the file system: the storage does not allow the operation,
// and retrying will not change that until someone acts on the machine.
// They are all backend.CodePermission (class access, exit 4 in the CLI):
// a full disk or an exhausted quota (ENOSPC, EDQUOT), a read-only mount
// (EROFS) and a permission or ownership refusal (EACCES, EPERM). The
// driver's error says which, names the directory and carries a hint
// (hinted), and the message crosses the plugin protocol as is.

// refusal returns the hint for err when err is one of the refusals, "" when
// it is not.
func (d *Driver) refusal(err error) string {
	switch {
	case errors.Is(err, syscall.ENOSPC):
		return fmt.Sprintf("no space left on the file system holding %s: free space there (`ckpt gc` deletes old checkpoints and leftover temporary files) or save elsewhere", d.dir)
	case errors.Is(err, syscall.EDQUOT):
		return fmt.Sprintf("the disk quota on the file system holding %s is exhausted: free space there or raise the quota", d.dir)
	case errors.Is(err, syscall.EROFS):
		return fmt.Sprintf("the file system holding %s is mounted read-only: remount it read-write (mount -o remount,rw) or save elsewhere", d.dir)
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		return fmt.Sprintf("permission denied to uid %d: check the owner and mode of %s and of the directories below it", os.Geteuid(), d.dir)
	}
	return ""
}

// hinted is a driver error with what to do about it.
type hinted struct {
	err  error
	hint string
}

func (h *hinted) Error() string { return h.err.Error() + " (" + h.hint + ")" }
func (h *hinted) Unwrap() error { return h.err }

// explain adds the hint to a refusal (see refusal); other errors, and nil,
// are returned unchanged.
func (d *Driver) explain(err error) error {
	var h *hinted
	if err == nil || errors.As(err, &h) {
		return err
	}
	if hint := d.refusal(err); hint != "" {
		return &hinted{err: err, hint: hint}
	}
	return err
}

// refusalCode is CodePermission for a refusal, CodeUnknown otherwise.
func (d *Driver) refusalCode(err error) backend.Code {
	if d.refusal(err) != "" {
		return backend.CodePermission
	}
	return backend.CodeUnknown
}
