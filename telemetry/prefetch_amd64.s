#include "textflag.h"

// func prefetchRec(p unsafe.Pointer)
// Loads the 6 cache lines of the record at p into the cache without
// waiting for them.
TEXT ·prefetchRec(SB), NOSPLIT, $0-8
	MOVQ p+0(FP), AX
	PREFETCHT0 0(AX)
	PREFETCHT0 64(AX)
	PREFETCHT0 128(AX)
	PREFETCHT0 192(AX)
	PREFETCHT0 256(AX)
	PREFETCHT0 320(AX)
	RET

// func prefetchLines(p unsafe.Pointer, n int)
// Loads n cache lines from p on into the cache without waiting for them.
TEXT ·prefetchLines(SB), NOSPLIT, $0-16
	MOVQ p+0(FP), AX
	MOVQ n+8(FP), CX
	TESTQ CX, CX
	JLE done
loop:
	PREFETCHT0 0(AX)
	ADDQ $64, AX
	DECQ CX
	JNZ loop
done:
	RET
