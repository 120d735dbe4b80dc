/* Rounding and classification of values for ops.def's C expressions. Floats round with the
 * compiler's builtins (inlined, vectorized): round is rint in the default rounding mode (to
 * nearest, ties to even, as NumPy's and PyTorch's round). Integers are whole already and pass
 * unchanged, never through double (which would change int64 values beyond 2^53). isnan, isinf and
 * isfinite are 0 / 1, integers never NaN or infinite. Generated C gets this same text
 * (src/codegen/emit_c.c embeds this file). */
#ifndef KILN_ROUNDING_H
#define KILN_ROUNDING_H

#define KILN_ROUNDED_(x, F32, F64) _Generic((x), float: F32((float)(x)), double: F64((double)(x)), default: (x))
#define KILN_FLOOR(x) KILN_ROUNDED_(x, __builtin_floorf, __builtin_floor)
#define KILN_CEIL(x) KILN_ROUNDED_(x, __builtin_ceilf, __builtin_ceil)
#define KILN_ROUND(x) KILN_ROUNDED_(x, __builtin_rintf, __builtin_rint)
#define KILN_TRUNC(x) KILN_ROUNDED_(x, __builtin_truncf, __builtin_trunc)

#define KILN_CLASSIFIED_(x, TEST, INT) \
    _Generic((x), float: TEST((float)(x)), double: TEST((double)(x)), default: (INT))
#define KILN_ISNAN(x) KILN_CLASSIFIED_(x, __builtin_isnan, 0)
#define KILN_ISINF(x) KILN_CLASSIFIED_(x, __builtin_isinf, 0)
#define KILN_ISFINITE(x) KILN_CLASSIFIED_(x, __builtin_isfinite, 1)
#endif
