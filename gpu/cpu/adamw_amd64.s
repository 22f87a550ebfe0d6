#include "textflag.h"

// ADAMW_CONSTS broadcasts the step's constants (adamwConsts at DI) into
// Y8-Y15: decay, gradScale, w1, b2, w2, stepSize, bc2Sqrt, eps.
#define ADAMW_CONSTS \
	VBROADCASTSS 0(DI), Y8 \
	VBROADCASTSS 4(DI), Y9 \
	VBROADCASTSS 8(DI), Y10 \
	VBROADCASTSS 12(DI), Y11 \
	VBROADCASTSS 16(DI), Y12 \
	VBROADCASTSS 20(DI), Y13 \
	VBROADCASTSS 24(DI), Y14 \
	VBROADCASTSS 28(DI), Y15

// ADAMW_STEP8 takes the step of the eight elements at AX (p), BX (grad),
// CX (m) and DX (v), the operations of adamwConsts.scalar in its order
// (Go assembly puts the destination last: VSUBPS A, B, C is C = B - A),
// stores p1, m1 and v1 and leaves p1 in Y0:
//   x = p*decay; gi = g*gradScale; m1 = m + w1*(gi - m)
//   v1 = v*b2 + (w2*gi)*gi; den = sqrt(v1)/bc2Sqrt + eps
//   p1 = x + (stepSize*m1)/den
#define ADAMW_STEP8 \
	VMOVUPS (AX), Y0 \
	VMOVUPS (BX), Y1 \
	VMOVUPS (CX), Y2 \
	VMOVUPS (DX), Y3 \
	VMULPS  Y8, Y0, Y0 \
	VMULPS  Y9, Y1, Y1 \
	VSUBPS  Y2, Y1, Y4 \
	VMULPS  Y10, Y4, Y4 \
	VADDPS  Y4, Y2, Y2 \
	VMULPS  Y11, Y3, Y3 \
	VMULPS  Y12, Y1, Y5 \
	VMULPS  Y1, Y5, Y5 \
	VADDPS  Y5, Y3, Y3 \
	VSQRTPS Y3, Y6 \
	VDIVPS  Y14, Y6, Y6 \
	VADDPS  Y15, Y6, Y6 \
	VMULPS  Y13, Y2, Y7 \
	VDIVPS  Y6, Y7, Y7 \
	VADDPS  Y7, Y0, Y0 \
	VMOVUPS Y0, (AX) \
	VMOVUPS Y2, (CX) \
	VMOVUPS Y3, (DX)

// func adamwAVX2(p, grad, m, v *float32, n int, c *adamwConsts)
//
// ADAMW_STEP8, eight elements at a time.
TEXT ·adamwAVX2(SB), NOSPLIT, $0-48
	MOVQ p+0(FP), AX
	MOVQ grad+8(FP), BX
	MOVQ m+16(FP), CX
	MOVQ v+24(FP), DX
	MOVQ n+32(FP), SI
	MOVQ c+40(FP), DI
	ADAMW_CONSTS

loop:
	CMPQ SI, $8
	JLT  done
	ADAMW_STEP8
	ADDQ    $32, AX
	ADDQ    $32, BX
	ADDQ    $32, CX
	ADDQ    $32, DX
	SUBQ    $8, SI
	JMP     loop

done:
	VZEROUPPER
	RET

// The integer constants of the bfloat16 rounding, eight lanes each, for
// adamwBF16AVX2, which has no vector register left to hold them.
DATA bf16c<>+0(SB)/8, $0x0000000100000001
DATA bf16c<>+8(SB)/8, $0x0000000100000001
DATA bf16c<>+16(SB)/8, $0x0000000100000001
DATA bf16c<>+24(SB)/8, $0x0000000100000001
DATA bf16c<>+32(SB)/8, $0x00007fff00007fff
DATA bf16c<>+40(SB)/8, $0x00007fff00007fff
DATA bf16c<>+48(SB)/8, $0x00007fff00007fff
DATA bf16c<>+56(SB)/8, $0x00007fff00007fff
DATA bf16c<>+64(SB)/8, $0x7fffffff7fffffff
DATA bf16c<>+72(SB)/8, $0x7fffffff7fffffff
DATA bf16c<>+80(SB)/8, $0x7fffffff7fffffff
DATA bf16c<>+88(SB)/8, $0x7fffffff7fffffff
DATA bf16c<>+96(SB)/8, $0x7f8000007f800000
DATA bf16c<>+104(SB)/8, $0x7f8000007f800000
DATA bf16c<>+112(SB)/8, $0x7f8000007f800000
DATA bf16c<>+120(SB)/8, $0x7f8000007f800000
DATA bf16c<>+128(SB)/8, $0x0000004000000040
DATA bf16c<>+136(SB)/8, $0x0000004000000040
DATA bf16c<>+144(SB)/8, $0x0000004000000040
DATA bf16c<>+152(SB)/8, $0x0000004000000040
GLOBL bf16c<>(SB), RODATA|NOPTR, $160

// func adamwBF16AVX2(p, grad, m, v *float32, out *uint16, n int, c *adamwConsts)
//
// adamwAVX2's step, and each updated p1 rounded to bfloat16 as
// bf16FromF32AVX2 rounds it, from the register, into out: the rounding's
// integer operations run beside the step's divisions and square root.
TEXT ·adamwBF16AVX2(SB), NOSPLIT, $0-56
	MOVQ p+0(FP), AX
	MOVQ grad+8(FP), BX
	MOVQ m+16(FP), CX
	MOVQ v+24(FP), DX
	MOVQ out+32(FP), R8
	MOVQ n+40(FP), SI
	MOVQ c+48(FP), DI
	ADAMW_CONSTS

bfloop:
	CMPQ SI, $8
	JLT  bfdone
	ADAMW_STEP8
	VPSRLD      $16, Y0, Y1           // b >> 16
	VPAND       bf16c<>+0(SB), Y1, Y2 // (b >> 16) & 1
	VPADDD      bf16c<>+32(SB), Y0, Y3 // b + 0x7fff
	VPADDD      Y2, Y3, Y3            // + lsb
	VPSRLD      $16, Y3, Y3           // rounded
	VPOR        bf16c<>+128(SB), Y1, Y4 // NaN: high half, quiet
	VPAND       bf16c<>+64(SB), Y0, Y5  // |b|
	VPCMPGTD    bf16c<>+96(SB), Y5, Y5  // |b| > 0x7f800000: NaN
	VPANDN      Y3, Y5, Y6            // rounded where not NaN
	VPAND       Y5, Y4, Y4            // NaN's where NaN
	VPOR        Y4, Y6, Y6
	VEXTRACTI128 $1, Y6, X7
	VPACKUSDW   X7, X6, X6            // eight 16-bit values, in order
	VMOVDQU     X6, (R8)
	ADDQ    $32, AX
	ADDQ    $32, BX
	ADDQ    $32, CX
	ADDQ    $32, DX
	ADDQ    $16, R8
	SUBQ    $8, SI
	JMP     bfloop

bfdone:
	VZEROUPPER
	RET

// func sumSquaresAVX2(x *float32, n int, out *[16]float64)
//
// Sixteen float64 partial sums of x[i]*x[i] over the first n elements (n a
// multiple of 16): element i goes to partial i mod 16. A float32 squared is
// exact in float64.
TEXT ·sumSquaresAVX2(SB), NOSPLIT, $0-24
	MOVQ x+0(FP), AX
	MOVQ n+8(FP), SI
	MOVQ out+16(FP), DI
	VXORPD Y0, Y0, Y0
	VXORPD Y1, Y1, Y1
	VXORPD Y2, Y2, Y2
	VXORPD Y3, Y3, Y3

sqloop:
	CMPQ SI, $16
	JLT  sqdone
	VCVTPS2PD 0(AX), Y4
	VCVTPS2PD 16(AX), Y5
	VCVTPS2PD 32(AX), Y6
	VCVTPS2PD 48(AX), Y7
	VMULPD    Y4, Y4, Y4
	VMULPD    Y5, Y5, Y5
	VMULPD    Y6, Y6, Y6
	VMULPD    Y7, Y7, Y7
	VADDPD    Y4, Y0, Y0
	VADDPD    Y5, Y1, Y1
	VADDPD    Y6, Y2, Y2
	VADDPD    Y7, Y3, Y3
	ADDQ      $64, AX
	SUBQ      $16, SI
	JMP       sqloop

sqdone:
	VMOVUPD Y0, 0(DI)
	VMOVUPD Y1, 32(DI)
	VMOVUPD Y2, 64(DI)
	VMOVUPD Y3, 96(DI)
	VZEROUPPER
	RET

// func bf16FromF32AVX2(dst *uint16, src *float32, n int)
//
// gpu.BF16FromF32 over the first n elements (n a multiple of 8): round to
// nearest even, b + 0x7fff + ((b >> 16) & 1), then the high half; a NaN
// keeps its high half with the quiet bit set.
TEXT ·bf16FromF32AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVL $1, AX
	MOVQ AX, X8
	VPBROADCASTD X8, Y8   // 1
	MOVL $0x7fff, AX
	MOVQ AX, X9
	VPBROADCASTD X9, Y9   // 0x7fff
	MOVL $0x7fffffff, AX
	MOVQ AX, X10
	VPBROADCASTD X10, Y10 // 0x7fffffff
	MOVL $0x7f800000, AX
	MOVQ AX, X11
	VPBROADCASTD X11, Y11 // 0x7f800000
	MOVL $0x40, AX
	MOVQ AX, X12
	VPBROADCASTD X12, Y12 // 0x40

cvloop:
	CMPQ CX, $8
	JLT  cvdone
	VMOVDQU     (SI), Y0
	VPSRLD      $16, Y0, Y1  // b >> 16
	VPAND       Y8, Y1, Y2   // (b >> 16) & 1
	VPADDD      Y9, Y0, Y3   // b + 0x7fff
	VPADDD      Y2, Y3, Y3   // + lsb
	VPSRLD      $16, Y3, Y3  // rounded
	VPOR        Y12, Y1, Y4  // NaN: high half, quiet
	VPAND       Y10, Y0, Y5  // |b|
	VPCMPGTD    Y11, Y5, Y5  // |b| > 0x7f800000: NaN
	VPANDN      Y3, Y5, Y6   // rounded where not NaN
	VPAND       Y5, Y4, Y4   // NaN's where NaN
	VPOR        Y4, Y6, Y6
	VEXTRACTI128 $1, Y6, X7
	VPACKUSDW   X7, X6, X6   // eight 16-bit values, in order
	VMOVDQU     X6, (DI)
	ADDQ        $32, SI
	ADDQ        $16, DI
	SUBQ        $8, CX
	JMP         cvloop

cvdone:
	VZEROUPPER
	RET

// func addScaledAVX2(dst, x *float32, n int, s float32)
// dst[i] += s*x[i] over the first n elements (n a multiple of 8), rounding
// the product, then the sum, as Go's float32 arithmetic does: VMULPS then
// VADDPS, not a fused multiply-add.
TEXT ·addScaledAVX2(SB), NOSPLIT, $0-28
	MOVQ dst+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS s+24(FP), Y15

asloop:
	CMPQ CX, $16
	JLT  astail
	VMOVUPS (SI), Y0
	VMOVUPS 32(SI), Y1
	VMULPS  Y0, Y15, Y0   // s*x
	VMULPS  Y1, Y15, Y1
	VMOVUPS (DI), Y2
	VMOVUPS 32(DI), Y3
	VADDPS  Y0, Y2, Y2    // dst + s*x
	VADDPS  Y1, Y3, Y3
	VMOVUPS Y2, (DI)
	VMOVUPS Y3, 32(DI)
	ADDQ    $64, SI
	ADDQ    $64, DI
	SUBQ    $16, CX
	JMP     asloop

astail:
	CMPQ CX, $8
	JLT  asdone
	VMOVUPS (SI), Y0
	VMULPS  Y0, Y15, Y0
	VMOVUPS (DI), Y2
	VADDPS  Y0, Y2, Y2
	VMOVUPS Y2, (DI)

asdone:
	VZEROUPPER
	RET
