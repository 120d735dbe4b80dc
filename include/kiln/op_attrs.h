/* kiln — named attribute layouts, generated from the KILN_ATTRS lines of src/ops/ops.def.
 *
 * A line KILN_ATTRS(G, fields...) gives one attribute layout G (an op, or a group of ops that share
 * a layout, as the reductions do). Its fields, in order:
 *   INT(NAME)       one int:               KILN_A_G_NAME is its index in kiln_attrs.i
 *   INTS(NAME, n)   n ints from KILN_A_G_NAME on (the padding of a convolution: INTS(PAD, 4))
 *   INT_REST(NAME)  the ints from KILN_A_G_NAME to ni (a target shape); last among the ints
 *   FLOAT(NAME)     one double:            KILN_A_G_NAME is its index in kiln_attrs.f
 * KILN_A_G_NI and KILN_A_G_NF are the fixed ints and doubles the layout has (INT_REST fields not
 * counted). So `a->i[KILN_A_REDUCE_KEEPDIMS]` reads a reduction's keepdims; code outside an op's own
 * kernel file names attributes this way, never by a bare number (tools/check_attr_access.py).
 */
#ifndef KILN_OP_ATTRS_H
#define KILN_OP_ATTRS_H

/* ---- the field list, one field at a time: KILN_A_EACH_(m, G, f1, f2, ...) = m(G, f1) m(G, f2) ... */
#define KILN_A_EACH_1_(m, G, x) m(G, x)
#define KILN_A_EACH_2_(m, G, x, ...) m(G, x) KILN_A_EACH_1_(m, G, __VA_ARGS__)
#define KILN_A_EACH_3_(m, G, x, ...) m(G, x) KILN_A_EACH_2_(m, G, __VA_ARGS__)
#define KILN_A_EACH_4_(m, G, x, ...) m(G, x) KILN_A_EACH_3_(m, G, __VA_ARGS__)
#define KILN_A_EACH_5_(m, G, x, ...) m(G, x) KILN_A_EACH_4_(m, G, __VA_ARGS__)
#define KILN_A_EACH_6_(m, G, x, ...) m(G, x) KILN_A_EACH_5_(m, G, __VA_ARGS__)
#define KILN_A_EACH_7_(m, G, x, ...) m(G, x) KILN_A_EACH_6_(m, G, __VA_ARGS__)
#define KILN_A_EACH_8_(m, G, x, ...) m(G, x) KILN_A_EACH_7_(m, G, __VA_ARGS__)
#define KILN_A_EACH_9_(m, G, x, ...) m(G, x) KILN_A_EACH_8_(m, G, __VA_ARGS__)
#define KILN_A_EACH_10_(m, G, x, ...) m(G, x) KILN_A_EACH_9_(m, G, __VA_ARGS__)
#define KILN_A_EACH_11_(m, G, x, ...) m(G, x) KILN_A_EACH_10_(m, G, __VA_ARGS__)
#define KILN_A_EACH_12_(m, G, x, ...) m(G, x) KILN_A_EACH_11_(m, G, __VA_ARGS__)
#define KILN_A_EACH_13_(m, G, x, ...) m(G, x) KILN_A_EACH_12_(m, G, __VA_ARGS__)
#define KILN_A_EACH_14_(m, G, x, ...) m(G, x) KILN_A_EACH_13_(m, G, __VA_ARGS__)
#define KILN_A_EACH_15_(m, G, x, ...) m(G, x) KILN_A_EACH_14_(m, G, __VA_ARGS__)
#define KILN_A_EACH_16_(m, G, x, ...) m(G, x) KILN_A_EACH_15_(m, G, __VA_ARGS__)
#define KILN_A_COUNT_(...) KILN_A_COUNT_N_(__VA_ARGS__, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define KILN_A_COUNT_N_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, n, ...) n
#define KILN_A_CAT_(a, b) KILN_A_CAT2_(a, b)
#define KILN_A_CAT2_(a, b) a##b
#define KILN_A_EACH_(m, G, ...) KILN_A_CAT_(KILN_A_EACH_, KILN_A_CAT_(KILN_A_COUNT_(__VA_ARGS__), _))(m, G, __VA_ARGS__)

/* ---- one field: INTS(NAME, n) becomes the arguments (kiln_i_, NAME, n, 0) of KILN_A_INT_FIELD_ and
 * KILN_A_FLOAT_FIELD_. The kinds are lowercase tokens no header defines (<complex.h> defines I): the
 * arguments are expanded on the way. */
#define KILN_A_ARGS_INT(name) kiln_i_, name, 1, 0
#define KILN_A_ARGS_INTS(name, n) kiln_i_, name, n, 0
#define KILN_A_ARGS_INT_REST(name) kiln_r_, name, 0, 0
#define KILN_A_ARGS_FLOAT(name) kiln_f_, name, 1, 0
#define KILN_A_CALL_(m, args) m args
#define KILN_A_INT_(G, x) KILN_A_CALL_(KILN_A_INT_FIELD_, (G, KILN_A_ARGS_##x))
#define KILN_A_FLOAT_(G, x) KILN_A_CALL_(KILN_A_FLOAT_FIELD_, (G, KILN_A_ARGS_##x))
#define KILN_A_INT_FIELD_(G, kind, name, n, ...) KILN_A_INT_##kind(G, name, n)
#define KILN_A_FLOAT_FIELD_(G, kind, name, n, ...) KILN_A_FLOAT_##kind(G, name, n)
/* n ints: the enumerator after them is n past the first (an INT_REST field takes none) */
#define KILN_A_INT_kiln_i_(G, name, n) KILN_A_##G##_##name, KILN_A_##G##_##name##_LAST_ = KILN_A_##G##_##name + (n) - 1,
#define KILN_A_INT_kiln_r_(G, name, n) KILN_A_##G##_##name, KILN_A_##G##_##name##_LAST_ = KILN_A_##G##_##name - 1,
#define KILN_A_INT_kiln_f_(G, name, n)
#define KILN_A_FLOAT_kiln_i_(G, name, n)
#define KILN_A_FLOAT_kiln_r_(G, name, n)
#define KILN_A_FLOAT_kiln_f_(G, name, n) KILN_A_##G##_##name,

#define KILN_ATTRS(G, ...)                                                                                    \
    enum { KILN_A_EACH_(KILN_A_INT_, G, __VA_ARGS__) KILN_A_##G##_NI };                                       \
    enum { KILN_A_EACH_(KILN_A_FLOAT_, G, __VA_ARGS__) KILN_A_##G##_NF };                                     \
    _Static_assert((int)KILN_A_##G##_NI <= KILN_MAX_ATTR_INTS && (int)KILN_A_##G##_NF <= KILN_MAX_ATTR_FLOATS, \
                   "attribute layout " #G " does not fit kiln_attrs");
#define KILN_OP(...)
#include "ops.def" /* src/ops/ops.def, on the include path */
#undef KILN_OP
#undef KILN_ATTRS

/* The attrs' int k, or `absent` when a holds fewer ints (k < 0 too). */
static inline int64_t kiln_attr_int(const kiln_attrs *a, int k, int64_t absent) {
    return a && k >= 0 && k < a->ni ? a->i[k] : absent;
}
/* The attrs' double k, or `absent` when a holds fewer doubles. */
static inline double kiln_attr_float(const kiln_attrs *a, int k, double absent) {
    return a && k >= 0 && k < a->nf ? a->f[k] : absent;
}

/* Facts other code builds on: the output dtype of KILN_OPF_DTYPE_ATTR ops is int 0, and control-flow
 * ops keep their output count in one place (kiln_op_nout). */
_Static_assert(KILN_A_CAST_DTYPE == 0 && KILN_A_FULL_DTYPE == 0 && KILN_A_RAND_DTYPE == 0 &&
                   KILN_A_RANDN_DTYPE == 0 && KILN_A_ARANGE_DTYPE == 0 && KILN_A_LINSPACE_DTYPE == 0 &&
                   KILN_A_EYE_DTYPE == 0,
               "KILN_OPF_DTYPE_ATTR: the dtype is int 0");
_Static_assert((int)KILN_A_IF_NOUT == (int)KILN_A_WHILE_NOUT, "if and while keep their output count in the same int");
#define KILN_A_CONTROL_NOUT KILN_A_IF_NOUT
/* The output dtype of a KILN_OPF_DTYPE_ATTR op. */
#define KILN_A_OUTPUT_DTYPE KILN_A_CAST_DTYPE

#endif
