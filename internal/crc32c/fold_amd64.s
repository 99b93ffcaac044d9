//go:build amd64 && !purego

#include "textflag.h"

// func foldBlocks(raw uint32, p []byte, keys *[16]uint64) uint32
//
// p is a whole number of 256-byte blocks, at least one. Z0..Z3 hold the
// state, sixteen 128-bit lanes in message order, starting as the first
// block with raw (the CRC register before p) added to its first 4 bytes.
// Each step multiplies every lane's two quadwords by its keys (moving the
// lane one block further) and adds the next block: lane = clmul(lo, k_lo)
// ^ clmul(hi, k_hi) ^ data. At the end Z0 is moved 64 bytes onto Z1, Z1
// onto Z2 and Z2 onto Z3 the same way, and the CRC32 instruction reduces
// the 64 bytes left, from a register of 0, to the register after p.
TEXT ·foldBlocks(SB), NOSPLIT, $64-44
	MOVL raw+0(FP), AX
	MOVQ p_base+8(FP), SI
	MOVQ p_len+16(FP), CX
	MOVQ keys+32(FP), DX
	VMOVDQU64 (SI), Z0
	VMOVDQU64 64(SI), Z1
	VMOVDQU64 128(SI), Z2
	VMOVDQU64 192(SI), Z3
	VMOVQ AX, X5
	VPXORQ Z5, Z0, Z0
	VMOVDQU64 (DX), Z4
	ADDQ $256, SI
	SUBQ $256, CX
	JZ reduce

loop:
	VPCLMULQDQ $0x00, Z4, Z0, Z5
	VPCLMULQDQ $0x11, Z4, Z0, Z0
	VPCLMULQDQ $0x00, Z4, Z1, Z6
	VPCLMULQDQ $0x11, Z4, Z1, Z1
	VPCLMULQDQ $0x00, Z4, Z2, Z7
	VPCLMULQDQ $0x11, Z4, Z2, Z2
	VPCLMULQDQ $0x00, Z4, Z3, Z8
	VPCLMULQDQ $0x11, Z4, Z3, Z3
	VPTERNLOGD $0x96, (SI), Z5, Z0
	VPTERNLOGD $0x96, 64(SI), Z6, Z1
	VPTERNLOGD $0x96, 128(SI), Z7, Z2
	VPTERNLOGD $0x96, 192(SI), Z8, Z3
	ADDQ $256, SI
	SUBQ $256, CX
	JNZ loop

reduce:
	VMOVDQU64 64(DX), Z4
	VPCLMULQDQ $0x00, Z4, Z0, Z5
	VPCLMULQDQ $0x11, Z4, Z0, Z0
	VPTERNLOGD $0x96, Z5, Z0, Z1
	VPCLMULQDQ $0x00, Z4, Z1, Z5
	VPCLMULQDQ $0x11, Z4, Z1, Z1
	VPTERNLOGD $0x96, Z5, Z1, Z2
	VPCLMULQDQ $0x00, Z4, Z2, Z5
	VPCLMULQDQ $0x11, Z4, Z2, Z2
	VPTERNLOGD $0x96, Z5, Z2, Z3
	VMOVDQU64 Z3, (SP)
	VZEROUPPER
	XORL AX, AX
	CRC32Q 0(SP), AX
	CRC32Q 8(SP), AX
	CRC32Q 16(SP), AX
	CRC32Q 24(SP), AX
	CRC32Q 32(SP), AX
	CRC32Q 40(SP), AX
	CRC32Q 48(SP), AX
	CRC32Q 56(SP), AX
	MOVL AX, ret+40(FP)
	RET
