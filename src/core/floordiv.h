/* Python's // and % (NumPy's floor_divide and remainder) for ops.def's C expressions: the
 * quotient rounded toward -inf and the remainder with the divisor's sign. Floats follow NumPy's
 * npy_divmod (the remainder from fmod, the quotient (a - mod) / b rounded to the nearest
 * integer, so 1 // 0.1 is 9 as in Python); a zero divisor gives a / b and fmod's NaN. Integers
 * are exact; a zero divisor gives 0 (NumPy's result, without its warning) and x // -1 wraps for
 * the most negative value, as NumPy's does, instead of overflowing. Generated C gets this same
 * text (src/codegen/emit_c.c embeds this file). */
#ifndef KILN_FLOORDIV_H
#define KILN_FLOORDIV_H
#include <stdint.h>

#define KILN_FLOORDIV_FLOAT_(T, SFX, FMOD, FLOOR, COPYSIGN)                                  \
    static inline T kiln_floordiv_##SFX(T a, T b) {                                          \
        if (b == 0) return a / b;                                                            \
        T mod = FMOD(a, b), div = (a - mod) / b;                                             \
        if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1;                                    \
        if (div == 0) return COPYSIGN((T)0, a / b);                                          \
        T f = FLOOR(div);                                                                    \
        return div - f > (T)0.5 ? f + 1 : f;                                                 \
    }                                                                                        \
    static inline T kiln_mod_##SFX(T a, T b) {                                               \
        T mod = FMOD(a, b);                                                                  \
        if (b == 0) return mod;                                                              \
        if (mod != 0) return (b < 0) != (mod < 0) ? mod + b : mod;                           \
        return COPYSIGN((T)0, b);                                                            \
    }
KILN_FLOORDIV_FLOAT_(float, f32, __builtin_fmodf, __builtin_floorf, __builtin_copysignf)
KILN_FLOORDIV_FLOAT_(double, f64, __builtin_fmod, __builtin_floor, __builtin_copysign)

static inline int64_t kiln_floordiv_i64(int64_t a, int64_t b) {
    if (b == 0) return 0;
    if (b == -1) return (int64_t)(0ull - (uint64_t)a);
    int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

static inline int64_t kiln_mod_i64(int64_t a, int64_t b) {
    if (b == 0 || b == -1) return 0;
    int64_t r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

/* Smaller integer types compute in int64; the result is stored back (wrapping as NumPy's). */
#define KILN_FLOORDIV(a, b) \
    _Generic((a), float: kiln_floordiv_f32, double: kiln_floordiv_f64, default: kiln_floordiv_i64)((a), (b))
#define KILN_MOD(a, b) _Generic((a), float: kiln_mod_f32, double: kiln_mod_f64, default: kiln_mod_i64)((a), (b))

/* C's fmod (the dividend's sign) for ops.def's fmod: integers truncate, a zero divisor gives 0
 * and x fmod -1 gives 0 (never the trap of INT64_MIN % -1) */
static inline float kiln_fmod_f32(float a, float b) { return __builtin_fmodf(a, b); }
static inline double kiln_fmod_f64(double a, double b) { return __builtin_fmod(a, b); }
static inline int64_t kiln_fmod_i64(int64_t a, int64_t b) { return b == 0 || b == -1 ? 0 : a % b; }
#define KILN_FMOD(a, b) _Generic((a), float: kiln_fmod_f32, double: kiln_fmod_f64, default: kiln_fmod_i64)((a), (b))
#endif
