//go:build amd64 && !purego

#include "textflag.h"

// func fold(acc *[256]byte, p []byte, keys *[8]uint64)
//
// Z0..Z3 hold the state, sixteen 128-bit lanes in message order. Each step
// multiplies every lane's two quadwords by its keys (moving the lane one
// block further) and adds the next block: lane = clmul(lo, k_lo) ^
// clmul(hi, k_hi) ^ data.
TEXT ·fold(SB), NOSPLIT, $0-40
	MOVQ acc+0(FP), AX
	MOVQ p_base+8(FP), SI
	MOVQ p_len+16(FP), CX
	MOVQ keys+32(FP), DX
	VMOVDQU64 (AX), Z0
	VMOVDQU64 64(AX), Z1
	VMOVDQU64 128(AX), Z2
	VMOVDQU64 192(AX), Z3
	VMOVDQU64 (DX), Z4
	TESTQ CX, CX
	JZ done

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

done:
	VMOVDQU64 Z0, (AX)
	VMOVDQU64 Z1, 64(AX)
	VMOVDQU64 Z2, 128(AX)
	VMOVDQU64 Z3, 192(AX)
	VZEROUPPER
	RET
