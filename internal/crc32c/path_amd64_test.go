//go:build amd64 && !purego

package crc32c

import (
	"testing"

	"golang.org/x/sys/cpu"
)

// The comparisons with hash/crc32 test the folding only where it runs:
// say which path this CPU takes, and fail if a CPU that has the
// instructions does not take it.
func TestFoldingRunsWhereTheCPUHasIt(t *testing.T) {
	has := cpu.X86.HasAVX512F && cpu.X86.HasAVX512VPCLMULQDQ
	t.Logf("AVX512F %v, VPCLMULQDQ %v: folding path %v", cpu.X86.HasAVX512F, cpu.X86.HasAVX512VPCLMULQDQ, haveFold)
	if has != haveFold {
		t.Fatalf("the CPU has AVX512F+VPCLMULQDQ = %v but the folding path is %v", has, haveFold)
	}
	if !haveFold {
		t.Skip("no AVX-512 VPCLMULQDQ: every input goes through hash/crc32, the folding assembly is not tested here")
	}
}
