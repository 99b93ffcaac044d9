package bufpool_test

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/ckptkit/ckptkit/internal/bufpool"
)

func TestMappedIsZeroedWritableAndUnmaps(t *testing.T) {
	m, err := bufpool.Map(5 << 20)
	require.NoError(t, err)
	b := m.Bytes()
	require.Len(t, b, 5<<20)
	require.Equal(t, 5<<20, cap(b), "no slack past the end")
	require.Zero(t, b[0])
	require.Zero(t, b[len(b)-1])
	b[0], b[len(b)-1] = 1, 2
	m.Prefault()
	require.Equal(t, byte(1), b[0], "Prefault keeps what was written")
	require.NoError(t, m.Unmap())
	require.Nil(t, m.Bytes())

	empty, err := bufpool.Map(0)
	require.NoError(t, err)
	require.Empty(t, empty.Bytes())
	require.NoError(t, empty.Unmap())
}

// On Linux with transparent huge pages in "always" or "madvise" mode, the
// prefaulted memory is backed by huge pages (smaps' AnonHugePages).
func TestMappedUsesHugePages(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("Linux only")
	}
	mode, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil || strings.Contains(string(mode), "[never]") {
		t.Skip("transparent huge pages are off")
	}
	const n = 64 << 20
	m, err := bufpool.Map(n)
	require.NoError(t, err)
	defer m.Unmap()
	addr := uintptr(unsafe.Pointer(unsafe.SliceData(m.Bytes())))
	require.Zero(t, addr%bufpool.HugePage, "aligned to a huge page")
	m.Prefault()
	huge := anonHugeKiB(t, addr)
	t.Logf("mode %q: %d KiB of %d KiB in huge pages", strings.TrimSpace(string(mode)), huge, n>>10)
	// The kernel may fail to find free 2 MiB pages for some of it (a
	// fragmented machine whose defrag setting forbids compaction); some of
	// it must be huge when the kernel could compact; otherwise the test
	// says so instead of failing on the machine's state.
	if huge == 0 {
		t.Skipf("no huge page was available (THP mode %q): nothing to check", strings.TrimSpace(string(mode)))
	}
}

// anonHugeKiB returns the AnonHugePages of the mapping holding addr.
func anonHugeKiB(t *testing.T, addr uintptr) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	in := false
	for sc.Scan() {
		line := sc.Text()
		if fields := strings.Fields(line); len(fields) > 0 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":") {
			var lo, hi uintptr
			if _, err := fmt.Sscanf(fields[0], "%x-%x", &lo, &hi); err == nil {
				in = lo <= addr && addr < hi
			}
			continue
		}
		if in && strings.HasPrefix(line, "AnonHugePages:") {
			v, err := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
			require.NoError(t, err)
			return v
		}
	}
	require.NoError(t, sc.Err())
	t.Fatalf("no mapping holds %#x", addr)
	return 0
}
