// Package bytesize is ckptkit's one parser of byte counts, used by every URL
// option (s3 part_size and multipart_threshold, gs chunk_size) and every
// size flag of the CLI (--shard-size, --max-memory) and the benchmarks.
//
// The unit rule, everywhere: a plain number is bytes; KiB, MiB, GiB, TiB,
// PiB (and Ki, Mi, ...) are powers of 1024; kB/KB, MB, GB, TB, PB (and k,
// M, G, ...) are powers of 1000. Units are case-insensitive and may be
// separated from the number by spaces; "B" alone means bytes. A fractional
// count ("1.5GiB") is rounded down to whole bytes. So "16MiB" is 16777216
// and "16MB" is 16000000, in a URL and on the command line alike.
//
// Parsing is github.com/dustin/go-humanize's ParseBytes, which follows this
// rule; this package adds the int64 range check and the error wording.
package bytesize

import (
	"fmt"
	"math"
	"strings"

	"github.com/ckptkit/ckptkit/ckpterr"
	"github.com/dustin/go-humanize"
)

// ErrNotASize is returned (wrapped, naming the input) for a string that is
// not a byte count under the package's unit rule.
var ErrNotASize = ckpterr.New(ckpterr.Usage, "not a byte count (a number of bytes, or with a unit: KiB/MiB/GiB are powers of 1024, KB/MB/GB powers of 1000)")

// Rule is the unit rule in one line, for flag and URL help texts.
const Rule = "bytes, or with a unit: KiB/MiB/GiB/TiB = powers of 1024, KB/MB/GB/TB = powers of 1000"

// Parse returns the byte count s denotes. Negative and non-finite values,
// values beyond int64 and unknown units are an error matching ErrNotASize.
func Parse(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if t == "" || strings.HasPrefix(t, "-") || strings.HasPrefix(t, "+") {
		return 0, fmt.Errorf("size %q: %w", s, ErrNotASize)
	}
	v, err := humanize.ParseBytes(t)
	if err != nil {
		return 0, fmt.Errorf("size %q: %w: %v", s, ErrNotASize, err)
	}
	if v > math.MaxInt64 {
		return 0, fmt.Errorf("size %q: %w (too large)", s, ErrNotASize)
	}
	return int64(v), nil
}
