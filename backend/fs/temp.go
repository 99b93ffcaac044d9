package fs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"

	"github.com/ckptkit/ckptkit/backend"
)

// Temporary files. A Put writes its object to a temporary file named
//
//	.ckptkit-tmp-<owner>.<pid>.<random>
//
// in the destination directory, where owner tags the pid space of the
// writer (hostOwner: the machine's boot and the pid namespace) and pid is
// the writing process. A writer killed mid-Put (SIGKILL, a crashed plugin
// process, a power cut) leaves that file behind. Two things remove it:
//
//   - the driver itself, the first time it writes into that directory (the
//     next save of the same step, a retried Put of the same key): it removes
//     the temporary files there whose writer is provably gone, that is of
//     its own pid space and a pid that no longer exists. A file of a live
//     pid (another writer at work, or a reused pid: kept, safely), of
//     another machine or container sharing the file system, or of an older
//     name without owner is left alone: the driver cannot tell that its
//     writer is gone;
//   - `ckpt gc`, which sees every temporary file as an incomplete upload
//     (ListUploads) and removes those not written to for longer than its
//     --grace, whoever wrote them.
var (
	ownerOnce sync.Once
	owner     string
)

func processOwner() string {
	ownerOnce.Do(func() { owner = hostOwner() })
	return owner
}

// tempName returns a fresh temporary file name for this process.
func tempName() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	o := processOwner()
	if o == "" {
		o = "none"
	}
	return fmt.Sprintf("%s%s.%d.%s", TempPrefix, o, os.Getpid(), hex.EncodeToString(b[:]))
}

// parseTempName returns the owner tag and pid of a temporary file name of
// this version, ok false for other names (an older version's).
func parseTempName(name string) (string, int, bool) {
	rest, ok := strings.CutPrefix(name, TempPrefix)
	if !ok {
		return "", 0, false
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 3 {
		return "", 0, false
	}
	pid, err := strconv.Atoi(parts[1])
	if err != nil || pid <= 0 {
		return "", 0, false
	}
	return parts[0], pid, true
}

// sweepDir removes, the first time this driver writes into dir, the
// temporary files in dir whose writer is provably gone (see above).
// Best effort: a failure leaves them to `ckpt gc`.
func (d *Driver) sweepDir(dir string) {
	me := processOwner()
	if me == "" {
		return
	}
	if _, done := d.swept.LoadOrStore(dir, true); done {
		return
	}
	df, err := d.root.Open(native(dir))
	if err != nil {
		return
	}
	des, err := df.ReadDir(-1)
	df.Close()
	if err != nil {
		return
	}
	for _, de := range des {
		o, pid, ok := parseTempName(de.Name())
		if !ok || o != me || pid == os.Getpid() || !de.Type().IsRegular() || !processGone(pid) {
			continue
		}
		_ = d.root.Remove(native(path.Join(dir, de.Name())))
	}
}

// ListUploads implements backend.UploadLister: every temporary file under
// prefix is an incomplete upload, Key its own key, ID its name, Initiated
// the time it was last written to and Size its bytes so far. Directories
// this process may not read are passed over.
func (d *Driver) ListUploads(ctx context.Context, prefix string, fn func(backend.Upload) error) error {
	if err := d.ensure(false); errors.Is(err, iofs.ErrNotExist) {
		return ctx.Err()
	} else if err != nil {
		return d.explain(err)
	}
	start := ""
	if i := strings.LastIndexByte(prefix, '/'); i >= 0 {
		start = prefix[:i+1]
	}
	return d.walkTemps(ctx, start, prefix, fn)
}

func (d *Driver) walkTemps(ctx context.Context, dir, prefix string, fn func(backend.Upload) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	name := "."
	if dir != "" {
		name = native(strings.TrimSuffix(dir, "/"))
	}
	df, err := d.root.Open(name)
	if err != nil {
		return nil // gone, not a directory, or unreadable: nothing listed here
	}
	des, err := df.ReadDir(-1)
	df.Close()
	if err != nil {
		return nil
	}
	for _, de := range des {
		key := dir + de.Name()
		switch {
		case de.IsDir():
			if strings.HasPrefix(key+"/", prefix) || strings.HasPrefix(prefix, key+"/") {
				if err := d.walkTemps(ctx, key+"/", prefix, fn); err != nil {
					return err
				}
			}
		case strings.HasPrefix(de.Name(), TempPrefix) && strings.HasPrefix(key, prefix) && de.Type().IsRegular():
			fi, err := de.Info()
			if err != nil {
				continue // removed meanwhile
			}
			if err := fn(backend.Upload{Key: key, ID: de.Name(), Initiated: fi.ModTime(), Size: fi.Size()}); err != nil {
				return err
			}
		}
	}
	return nil
}

// AbortUpload implements backend.UploadLister: it removes the temporary
// file key (id is its name, as ListUploads reported it) and, as Delete
// does, the directories above it left empty. A key that is not a temporary
// file is refused; one already gone is no error.
func (d *Driver) AbortUpload(ctx context.Context, key, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if path.Base(key) != id || !strings.HasPrefix(id, TempPrefix) {
		return fmt.Errorf("key %q is not a temporary file of id %q: %w", key, id, backend.ErrInvalidKey)
	}
	if err := d.ensure(false); errors.Is(err, iofs.ErrNotExist) {
		return nil
	} else if err != nil {
		return d.explain(err)
	}
	fi, err := d.root.Lstat(native(key))
	if errors.Is(err, iofs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return d.explain(err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%q is a %s, not a temporary file: %w", key, fileKind(fi.Mode()), backend.ErrInvalidKey)
	}
	if err := d.root.Remove(native(key)); err != nil && !errors.Is(err, iofs.ErrNotExist) {
		return d.explain(err)
	}
	d.pruneParents(key) // a killed first save leaves its step directory holding only this
	return nil
}

var _ backend.UploadLister = (*Driver)(nil)
