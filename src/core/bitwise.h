/* Bitwise ops on integers for ops.def's C expressions (bitwise_and, bitwise_or, bitwise_xor,
 * bitwise_not, left_shift, right_shift), without C's undefined behaviour. Shifts follow NumPy's
 * npy_lshift / npy_rshift: a count that is negative or at least the bit width gives 0 to a left
 * shift and, to a right shift, 0 for values >= 0 and -1 for negative ones; a right shift of a
 * negative value is arithmetic (Python's >>); a left shift drops the bits shifted out (wrapping).
 * Every integer type computes in int64 and the result is stored back to its own type: the low
 * bits of an int64 shift equal those of the narrow type's shift, so int8 and int32 get NumPy's
 * results too (a count of 8..63 on int8 shifts every bit out as NumPy's does). bool computes as
 * uint8_t (0 or 1): and, or and xor stay 0 or 1, and bitwise_not is logical not. Inference
 * refuses float inputs; the float kernels the generator instantiates from the same expression
 * convert through int64 and are never run. Generated C gets this same text (src/codegen/emit_c.c
 * embeds this file). */
#ifndef KILN_BITWISE_H
#define KILN_BITWISE_H
#include <stdint.h>

static inline int64_t kiln_bitand_i64(int64_t a, int64_t b) { return a & b; }
static inline int64_t kiln_bitor_i64(int64_t a, int64_t b) { return a | b; }
static inline int64_t kiln_bitxor_i64(int64_t a, int64_t b) { return a ^ b; }
static inline int64_t kiln_bitnot_i64(int64_t a) { return ~a; }
static inline uint8_t kiln_bitnot_bool(uint8_t a) { return (uint8_t)!a; }

/* (uint64_t)b < 64 is false for negative counts too; shifting the unsigned value avoids the
 * undefined left shift of negative numbers (the conversion back wraps, as GCC and Clang define) */
static inline int64_t kiln_shl_i64(int64_t a, int64_t b) { return (uint64_t)b < 64 ? (int64_t)((uint64_t)a << b) : 0; }
static inline int64_t kiln_shr_i64(int64_t a, int64_t b) { return (uint64_t)b < 64 ? a >> b : (a < 0 ? -1 : 0); }

#define KILN_BITAND(a, b) kiln_bitand_i64((int64_t)(a), (int64_t)(b))
#define KILN_BITOR(a, b) kiln_bitor_i64((int64_t)(a), (int64_t)(b))
#define KILN_BITXOR(a, b) kiln_bitxor_i64((int64_t)(a), (int64_t)(b))
#define KILN_BITNOT(a) _Generic((a), uint8_t: kiln_bitnot_bool, default: kiln_bitnot_i64)(a)
#define KILN_SHL(a, b) kiln_shl_i64((int64_t)(a), (int64_t)(b))
#define KILN_SHR(a, b) kiln_shr_i64((int64_t)(a), (int64_t)(b))
#endif
