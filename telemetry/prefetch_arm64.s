#include "textflag.h"

// func prefetchRec(p unsafe.Pointer)
TEXT ·prefetchRec(SB), NOSPLIT, $0-8
	MOVD p+0(FP), R0
	PRFM (R0), PLDL1KEEP
	PRFM 64(R0), PLDL1KEEP
	PRFM 128(R0), PLDL1KEEP
	PRFM 192(R0), PLDL1KEEP
	PRFM 256(R0), PLDL1KEEP
	PRFM 320(R0), PLDL1KEEP
	RET

// func prefetchLines(p unsafe.Pointer, n int)
TEXT ·prefetchLines(SB), NOSPLIT, $0-16
	MOVD p+0(FP), R0
	MOVD n+8(FP), R1
	CMP $0, R1
	BLE done
loop:
	PRFM (R0), PSTL1KEEP
	ADD $64, R0
	SUBS $1, R1
	BNE loop
done:
	RET
