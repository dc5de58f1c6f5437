#include "textflag.h"

// func prefetchRec(p unsafe.Pointer)
// Loads the first 9 cache lines at p into the cache without waiting for them.
TEXT ·prefetchRec(SB), NOSPLIT, $0-8
	MOVQ p+0(FP), AX
	PREFETCHT0 0(AX)
	PREFETCHT0 64(AX)
	PREFETCHT0 128(AX)
	PREFETCHT0 192(AX)
	PREFETCHT0 256(AX)
	PREFETCHT0 320(AX)
	PREFETCHT0 384(AX)
	PREFETCHT0 448(AX)
	PREFETCHT0 512(AX)
	RET
