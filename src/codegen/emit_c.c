/* C source for a fused elementwise group: each output element computed by the ops' C
 * expressions (ops.def) in one vectorizable loop, spread over OpenMP threads when large.
 *
 * The code depends on the group's ops, dtypes and attributes and on which operands step along
 * the inner axis (broadcast operands stay put), not on the sizes: one object serves every shape
 * with the same pattern. float32 exp, erf, tanh and log are the branch-free approximations of
 * src/core/approx_f32.h, which the interpreted kernels use too, so the loops vectorize and give
 * eager's bits; the rest is libm. Arithmetic is not contracted into fused multiply-adds
 * (-ffp-contract=off), as in the interpreted kernels. */
#include <math.h>

#include "emit_internal.h"

#define PARALLEL_MIN KILN_PARALLEL_MIN


/* ---- what the emitter handles ---------------------------------------------------------- */

const char *kiln_cg_c_type(kiln_dtype d) {
    switch (d) {
    case KILN_DTYPE_BOOL: return "uint8_t";
    case KILN_DTYPE_INT8: return "int8_t";
    case KILN_DTYPE_INT32: return "int32_t";
    case KILN_DTYPE_INT64: return "int64_t";
    case KILN_DTYPE_FLOAT32: return "float";
    case KILN_DTYPE_FLOAT64: return "double";
    default: return NULL; /* 16-bit floats: not generated */
    }
}

bool kiln_cg_is_float(kiln_dtype d) { return d == KILN_DTYPE_FLOAT32 || d == KILN_DTYPE_FLOAT64; }

bool kiln_codegen_has_rows(const kiln_graph *sub) {
    for (int32_t i = 0; i < sub->nnodes; i++)
        if (kiln_op_table[sub->nodes[i].op].fusion == KILN_FUSE_REDUCTION) return true;
    return false;
}

void kiln_codegen_space(const kiln_graph *sub, int *ndim, int64_t *shape) {
    const kiln_meta *m = &sub->values[sub->outputs[0]].meta;
    for (int32_t i = 0; i < sub->nnodes; i++)
        if (kiln_op_table[sub->nodes[i].op].fusion == KILN_FUSE_REDUCTION) {
            m = &sub->values[sub->nodes[i].in[0]].meta;
            break;
        }
    *ndim = m->ndim;
    for (int d = 0; d < m->ndim; d++) shape[d] = m->shape[d];
}

/* Whether m broadcasts to (nd, shape) without growing it. */
static bool fits_space(const kiln_meta *m, int nd, const int64_t *shape) {
    if (m->ndim > nd) return false;
    for (int d = 0; d < m->ndim; d++) {
        int64_t e = m->shape[m->ndim - 1 - d], s = shape[nd - 1 - d];
        if (e != s && e != 1) return false;
    }
    return true;
}

/* Row groups: row ops read exactly the space; the rest broadcasts to it; a reduction that drops
 * the axis only as the output; the output is the space or one value per row of it. */
static bool rows_fit(const kiln_graph *sub) {
    int nd;
    int64_t shape[KILN_MAX_DIMS];
    kiln_codegen_space(sub, &nd, shape);
    for (int32_t i = 0; i < sub->ninputs; i++)
        if (!fits_space(&sub->values[sub->inputs[i]].meta, nd, shape)) return false;
    for (int32_t i = 0; i < sub->nnodes; i++) {
        const kiln_node *n = &sub->nodes[i];
        const kiln_meta *o = &sub->values[n->out[0]].meta;
        if (kiln_op_table[n->op].fusion == KILN_FUSE_REDUCTION) {
            const kiln_meta *x = &sub->values[n->in[0]].meta;
            if (x->ndim != nd) return false;
            for (int d = 0; d < nd; d++)
                if (x->shape[d] != shape[d]) return false;
            if (kiln_node_drops_row_axis(n)) {
                if (n->out[0] != sub->outputs[0]) return false;
                continue;
            }
        }
        if (!fits_space(o, nd, shape)) return false;
    }
    /* the output: the space, or one value per row of it */
    const kiln_meta *o = &sub->values[sub->outputs[0]].meta;
    if (o->ndim == nd - 1 && kiln_op_table[sub->nodes[sub->values[sub->outputs[0]].node].op].fusion == KILN_FUSE_REDUCTION)
        return true;
    if (o->ndim != nd) return false;
    for (int d = 0; d < nd; d++)
        if (o->shape[d] != shape[d] && !(d == nd - 1 && o->shape[d] == 1)) return false;
    return true;
}

/* bfloat16 and float16 operands of elementwise kernels: loaded as float (exact), the result stored
 * rounded to nearest even (kiln_bf16_ld / kiln_bf16_st and kiln_f16_ld / kiln_f16_st of the
 * prelude: internal.h's conversions, the same bits as eager's kernels and casts). The row kernels
 * (emit_rows.c) take none. */
static bool is_half(kiln_dtype d) { return d == KILN_DTYPE_BFLOAT16 || d == KILN_DTYPE_FLOAT16; }
static const char *half_load(kiln_dtype d) { return d == KILN_DTYPE_FLOAT16 ? "kiln_f16_ld" : "kiln_bf16_ld"; }
static const char *half_store(kiln_dtype d) { return d == KILN_DTYPE_FLOAT16 ? "kiln_f16_st" : "kiln_bf16_st"; }

/* float16 <-> float as src/core/internal.h converts (kiln_f16_to_f32, kiln_f32_to_f16): a _Float16
 * conversion where the compiler has the type (with -march=native on a CPU with F16C: vcvtph2ps /
 * vcvtps2ph, which eager's rows use too), else the same rounding in integer arithmetic. */
static const char f16_text[] =
    "#ifdef __FLT16_MAX__\n"
    "static inline float kiln_f16_ld(uint16_t h) { _Float16 v; __builtin_memcpy(&v, &h, 2); return (float)v; }\n"
    "static inline uint16_t kiln_f16_st(float f) { _Float16 v = (_Float16)f; uint16_t h; __builtin_memcpy(&h, &v, 2); return h; }\n"
    "#else\n"
    "static inline float kiln_f16_ld(uint16_t h) {\n"
    "    kf_bits o; o.u = ((uint32_t)h & 0x7fffu) << 13; uint32_t exp = o.u & (0x7c00u << 13);\n"
    "    o.u += (uint32_t)(127 - 15) << 23;\n"
    "    if (exp == (0x7c00u << 13)) o.u += (uint32_t)(128 - 16) << 23;\n"
    "    else if (exp == 0) { kf_bits m; m.u = 113u << 23; o.u += 1u << 23; o.f -= m.f; }\n"
    "    o.u |= ((uint32_t)h & 0x8000u) << 16; return o.f; }\n"
    "static inline uint16_t kiln_f16_st(float f) {\n"
    "    kf_bits b; b.f = f; uint32_t u = b.u, sign = u & 0x80000000u; u ^= sign; uint16_t o;\n"
    "    if (u >= (127u + 16) << 23) o = u > 255u << 23 ? 0x7e00 : 0x7c00;\n"
    "    else if (u < (113u << 23)) { kf_bits v, m; v.u = u; m.u = ((127u - 15) + (23 - 10) + 1) << 23; v.f += m.f;\n"
    "        o = (uint16_t)(v.u - m.u); }\n"
    "    else { uint32_t odd = (u >> 13) & 1; u += ((uint32_t)(15 - 127) << 23) + 0xfff + odd; o = (uint16_t)(u >> 13); }\n"
    "    return (uint16_t)(o | (sign >> 16)); }\n"
    "#endif\n";

bool kiln_codegen_supports(const kiln_graph *sub) {
    if (sub->noutputs != 1 || sub->ncaptures != 0 || sub->nsubgraphs != 0 || sub->nnodes == 0) return false;
    if (sub->values[sub->outputs[0]].kind != KILN_VALUE_NODE) return false;
    bool rows = kiln_codegen_has_rows(sub);
    kiln_dtype od = sub->values[sub->outputs[0]].meta.dtype;
    if (!kiln_cg_c_type(od) && !(is_half(od) && !rows)) return false;
    for (int32_t i = 0; i < sub->ninputs; i++) {
        kiln_dtype d = sub->values[sub->inputs[i]].meta.dtype;
        if (!kiln_cg_c_type(d) && !(is_half(d) && !rows)) return false;
    }
    for (int32_t i = 0; i < sub->nnodes; i++)
        if (!kiln_node_fusable(sub, i)) return false;
    return !kiln_codegen_has_rows(sub) || rows_fit(sub);
}

/* ---- the prelude ------------------------------------------------------------------------ */

#include "floordiv_text.h" /* kiln_floordiv_text: src/core/floordiv.h, for KILN_FLOORDIV and KILN_MOD */
#include "rounding_text.h" /* kiln_rounding_text: src/core/rounding.h, for KILN_FLOOR, KILN_ISNAN, ... */
#include "bitwise_text.h" /* kiln_bitwise_text: src/core/bitwise.h, for KILN_BITAND, KILN_SHL, ... */
#include "approx_f32_text.h" /* kiln_approx_f32_text: src/core/approx_f32.h, float32 exp, erf, tanh, log */

#define KILN_NEG_TEXT "#define KILN_NEG(x) _Generic((x), int64_t: (int64_t)(0ull - (uint64_t)(x)), int32_t: (int32_t)(0u - (uint32_t)(x)), int8_t: (int8_t)(0u - (uint32_t)(x)), default: -(x))" /* as src/core/internal.h */

unsigned kiln_cg_uses(const kiln_graph *sub) {
    unsigned u = 0;
    for (int32_t i = 0; i < sub->nnodes; i++)
        if (kiln_op_table[sub->nodes[i].op].flags & KILN_OPF_LIBM) u |= KILN_USE_LIBM;
    return u;
}

/* Every block is guarded: sources of several groups concatenate into one translation unit.
 * float32 exp, erf, tanh and log are the eager kernels' (src/core/approx_f32.h, which defines
 * kf_bits): the same bits as eager. */
void kiln_cg_prelude(kiln_strbuf *t, unsigned uses) {
    kiln_strbuf_printf(t, "#ifndef KILN_PRELUDE\n#define KILN_PRELUDE\n#include <math.h>\n#include <omp.h>\n#include <stdint.h>\n"
           "#define KILN_APPROX_F32_NAMES\n%s"
           "static inline float kiln_bf16_ld(uint16_t h) { kf_bits b; b.u = (uint32_t)h << 16; return b.f; }\n"
           "static inline uint16_t kiln_bf16_st(float f) { kf_bits b; b.f = f; uint32_t u = b.u;\n"
           "    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16); }\n"
           "%s%s\n%s\n%s\n%s\n#endif\n",
        kiln_approx_f32_text, f16_text, KILN_NEG_TEXT, kiln_floordiv_text, kiln_rounding_text, kiln_bitwise_text);
    /* as <tgmath.h> for the interpreted kernels */
    if (uses & KILN_USE_LIBM)
        kiln_strbuf_printf(t, "#ifndef KILN_PRELUDE_LIBM\n#define KILN_PRELUDE_LIBM\n"
             "#define sqrt(x) _Generic((x), float: sqrtf, default: sqrt)(x)\n"
             "#define sin(x) _Generic((x), float: sinf, default: sin)(x)\n"
             "#define cos(x) _Generic((x), float: cosf, default: cos)(x)\n"
             "#define pow(x, y) _Generic((x) + (y), float: powf, default: pow)(x, y)\n"
             "#define log1p(x) _Generic((x), float: log1pf, default: log1p)(x)\n"
             "#define expm1(x) _Generic((x), float: expm1f, default: expm1)(x)\n"
             "#define tan(x) _Generic((x), float: tanf, default: tan)(x)\n"
             "#define asin(x) _Generic((x), float: asinf, default: asin)(x)\n"
             "#define acos(x) _Generic((x), float: acosf, default: acos)(x)\n"
             "#define atan(x) _Generic((x), float: atanf, default: atan)(x)\n"
             "#define sinh(x) _Generic((x), float: sinhf, default: sinh)(x)\n"
             "#define cosh(x) _Generic((x), float: coshf, default: cosh)(x)\n"
             "#define asinh(x) _Generic((x), float: asinhf, default: asinh)(x)\n"
             "#define acosh(x) _Generic((x), float: acoshf, default: acosh)(x)\n"
             "#define atanh(x) _Generic((x), float: atanhf, default: atanh)(x)\n"
             "#define log2(x) _Generic((x), float: log2f, default: log2)(x)\n"
             "#define log10(x) _Generic((x), float: log10f, default: log10)(x)\n"
             "#define exp2(x) _Generic((x), float: exp2f, default: exp2)(x)\n"
             "#define atan2(x, y) _Generic((x) + (y), float: atan2f, default: atan2)(x, y)\n"
             "#define hypot(x, y) _Generic((x) + (y), float: hypotf, default: hypot)(x, y)\n"
             "#endif\n");
}

/* ---- the kernel --------------------------------------------------------------------------- */

void kiln_cg_put_item_sizes(kiln_strbuf *t, const kiln_graph *g) {
    kiln_strbuf_printf(t, "static const int64_t KILN_SYM_isz[%d] = {%zu", 1 + g->ninputs,
                       kiln_dtype_size(g->values[g->outputs[0]].meta.dtype));
    for (int32_t k = 0; k < g->ninputs; k++) kiln_strbuf_printf(t, ", %zu", kiln_dtype_size(g->values[g->inputs[k]].meta.dtype));
    kiln_strbuf_printf(t, "};\n\n");
}

void kiln_cg_put_double(kiln_strbuf *t, double v) {
    if (v != v) kiln_strbuf_printf(t, "__builtin_nan(\"\")");
    else if (v == INFINITY) kiln_strbuf_printf(t, "__builtin_inf()");
    else if (v == -INFINITY) kiln_strbuf_printf(t, "(-__builtin_inf())");
    else kiln_strbuf_printf(t, "%a", v); /* exact */
}

void kiln_cg_put_converted(kiln_strbuf *t, const char *name, kiln_dtype d, kiln_dtype ct) {
    if (d == ct) kiln_strbuf_printf(t, "%s", name);
    else if (d == KILN_DTYPE_BOOL) kiln_strbuf_printf(t, "(T)(%s != 0)", name);
    else if (!kiln_cg_is_float(d)) kiln_strbuf_printf(t, "(T)(double)%s", name);
    else kiln_strbuf_printf(t, "(T)%s", name);
}

void kiln_cg_put_expr(kiln_strbuf *t, const kiln_graph *g, int32_t i, const char *const *operands, const char *out) {
    const kiln_node *n = &g->nodes[i];
    kiln_dtype od = g->values[n->out[0]].meta.dtype;
    bool half = is_half(od); /* the group's root cast: computed in float, rounded by the store */
    const char *ot = half ? "float" : kiln_cg_c_type(od);
    if (n->op == KILN_OP_FULL) {
        kiln_strbuf_printf(t, "        const %s %s = (%s)", ot, out, ot);
        kiln_cg_put_double(t, n->attrs.f[KILN_A_FULL_VALUE]);
        kiln_strbuf_printf(t, ";\n");
        return;
    }
    kiln_dtype ct = half ? KILN_DTYPE_FLOAT32 : kiln_node_compute_dtype(g, n);
    kiln_strbuf_printf(t, "        %s %s;\n        {\n            typedef %s T;\n", ot, out, kiln_cg_c_type(ct));
    static const char names[3] = {'a', 'b', 'c'};
    for (int k = 0; k < n->nin && k < 3; k++) {
        kiln_strbuf_printf(t, "            const T %c = ", names[k]);
        kiln_cg_put_converted(t, operands[k], g->values[n->in[k]].meta.dtype, ct);
        kiln_strbuf_printf(t, ";\n");
    }
    const char *expr = kiln_op_table[n->op].c_expr;
    for (int k = 0; k < 2; k++) {
        char name[3] = {'f', (char)('0' + k), '\0'};
        if (!strstr(expr, name)) continue;
        kiln_strbuf_printf(t, "            const double %s = ", name);
        kiln_cg_put_double(t, n->attrs.nf > k ? n->attrs.f[k] : 0.0);
        kiln_strbuf_printf(t, ";\n");
    }
    if (od == KILN_DTYPE_BOOL) kiln_strbuf_printf(t, "            %s = (uint8_t)((%s) != 0);\n        }\n", out, expr);
    else kiln_strbuf_printf(t, "            %s = (%s)(%s);\n        }\n", out, ot, expr);
}

/* Variable names of values in the elementwise kernel: inputs v<k>, nodes t<i>. */
static void value_name(const kiln_graph *g, int32_t v, char name[24]) {
    if (g->values[v].kind == KILN_VALUE_INPUT) snprintf(name, 24, "v%d", g->values[v].index);
    else snprintf(name, 24, "t%d", g->values[v].node);
}

static void emit_node(kiln_strbuf *t, const kiln_graph *g, int32_t i) {
    const kiln_node *n = &g->nodes[i];
    char names[3][24], out[24];
    const char *ops[3] = {names[0], names[1], names[2]};
    for (int k = 0; k < n->nin && k < 3; k++) value_name(g, n->in[k], names[k]);
    snprintf(out, sizeof out, "t%d", i);
    kiln_cg_put_expr(t, g, i, ops, out);
}

/* One row: n elements along the inner axis from the operand pointers q (is: element strides
 * of STRIDED operands). */
static void emit_row(kiln_strbuf *t, const kiln_graph *g, const int8_t *kind) {
    int nops = 1 + g->ninputs;
    const kiln_value *ov = &g->values[g->outputs[0]];
    kiln_strbuf_printf(t, "static inline __attribute__((always_inline)) void KILN_SYM_row(char *const *q, const int64_t *is, int64_t n) {\n");
    /* storage types (bfloat16, float16: uint16_t, loaded with kiln_bf16_ld, kiln_f16_ld) and value types */
    bool ohalf = is_half(ov->meta.dtype);
    const char *ost = ohalf ? "uint16_t" : kiln_cg_c_type(ov->meta.dtype);
    kiln_strbuf_printf(t, "    (void)is;\n    %s *restrict o = (%s *)q[0];\n", ost, ost);
    for (int k = 1; k < nops; k++) {
        kiln_dtype d = g->values[g->inputs[k - 1]].meta.dtype;
        bool half = is_half(d);
        const char *st = half ? "uint16_t" : kiln_cg_c_type(d);
        const char *vt = half ? "float" : st, *ld = half ? half_load(d) : "";
        if (kind[k] == KILN_INNER_FIXED) kiln_strbuf_printf(t, "    const %s v%d = %s(*(const %s *)q[%d]);\n", vt, k - 1, ld, st, k);
        else kiln_strbuf_printf(t, "    const %s *restrict x%d = (const %s *)q[%d];\n", st, k - 1, st, k);
        if (kind[k] == KILN_INNER_STRIDED) kiln_strbuf_printf(t, "    const int64_t s%d = is[%d];\n", k - 1, k);
    }
    kiln_strbuf_printf(t, "#pragma omp simd\n    for (int64_t i = 0; i < n; i++) {\n");
    for (int k = 1; k < nops; k++) {
        kiln_dtype d = g->values[g->inputs[k - 1]].meta.dtype;
        bool half = is_half(d);
        const char *vt = half ? "float" : kiln_cg_c_type(d);
        const char *ld = half ? half_load(d) : "";
        if (kind[k] == KILN_INNER_UNIT) kiln_strbuf_printf(t, "        const %s v%d = %s(x%d[i]);\n", vt, k - 1, ld, k - 1);
        else if (kind[k] == KILN_INNER_STRIDED)
            kiln_strbuf_printf(t, "        const %s v%d = %s(x%d[i * s%d]);\n", vt, k - 1, ld, k - 1, k - 1);
    }
    for (int32_t i = 0; i < g->nnodes; i++) emit_node(t, g, i);
    const char *at = kind[0] == KILN_INNER_UNIT ? "i" : (kind[0] == KILN_INNER_STRIDED ? "i * is[0]" : "0");
    kiln_strbuf_printf(t, "        o[%s] = %s(t%d);\n    }\n}\n\n", at, ohalf ? half_store(ov->meta.dtype) : "", ov->node);
}

/* The rows of [begin, end) (an odometer over the outer axes), and the entry point, which splits
 * the elements evenly over the threads when there are enough of them. */
static void emit_driver(kiln_strbuf *t, const kiln_graph *g) {
    int nops = 1 + g->ninputs;
    kiln_cg_put_item_sizes(t, g);
    kiln_strbuf_printf(t,
        "static void KILN_SYM_range(char *const *p, int ndim, const int64_t *shape, const int64_t *st, int64_t begin,\n"
        "                                int64_t end) {\n"
        "    const int64_t inner = shape[ndim - 1];\n"
        "    int64_t row = begin / inner, col = begin %% inner, idx[%d];\n"
        "    char *base[%d], *q[%d];\n"
        "    int64_t is[%d];\n"
        "    for (int k = 0; k < %d; k++) base[k] = p[k], is[k] = st[k * %d + ndim - 1] / KILN_SYM_isz[k];\n"
        "    for (int d = ndim - 2; d >= 0; d--) {\n"
        "        idx[d] = row %% shape[d];\n"
        "        row /= shape[d];\n"
        "        for (int k = 0; k < %d; k++) base[k] += idx[d] * st[k * %d + d];\n"
        "    }\n"
        "    while (begin < end) {\n"
        "        int64_t n = inner - col < end - begin ? inner - col : end - begin;\n"
        "        for (int k = 0; k < %d; k++) q[k] = base[k] + col * st[k * %d + ndim - 1];\n"
        "        KILN_SYM_row(q, is, n);\n"
        "        begin += n, col = 0;\n"
        "        for (int d = ndim - 2; d >= 0; d--) {\n"
        "            for (int k = 0; k < %d; k++) base[k] += st[k * %d + d];\n"
        "            if (++idx[d] < shape[d]) break;\n"
        "            for (int k = 0; k < %d; k++) base[k] -= st[k * %d + d] * shape[d];\n"
        "            idx[d] = 0;\n"
        "        }\n"
        "    }\n"
        "}\n\n",
        KILN_MAX_DIMS, nops, nops, nops, nops, KILN_MAX_DIMS, nops, KILN_MAX_DIMS, nops, KILN_MAX_DIMS, nops,
        KILN_MAX_DIMS, nops, KILN_MAX_DIMS);
    kiln_strbuf_printf(t,
        "void KILN_SYM(char *const *p, int ndim, const int64_t *shape, const int64_t *st) {\n"
        "    int64_t total = 1;\n"
        "    for (int d = 0; d < ndim; d++) total *= shape[d];\n"
        "    if (total <= 0) return;\n"
        "    int64_t nt = total / %d;\n"
        "    if (nt > omp_get_max_threads()) nt = omp_get_max_threads();\n"
        "    if (nt <= 1 || omp_in_parallel()) {\n"
        "        KILN_SYM_range(p, ndim, shape, st, 0, total);\n"
        "        return;\n"
        "    }\n"
        "#pragma omp parallel num_threads((int)nt)\n"
        "    {\n"
        "        int64_t parts = omp_get_num_threads(), t = omp_get_thread_num();\n"
        "        int64_t chunk = ((total + parts - 1) / parts + 63) / 64 * 64;\n"
        "        int64_t b = t * chunk, e = b + chunk < total ? b + chunk : total;\n"
        "        if (b < e) KILN_SYM_range(p, ndim, shape, st, b, e);\n"
        "    }\n"
        "}\n",
        PARALLEL_MIN / 2);
}

kiln_status kiln_codegen_emit(const kiln_graph *sub, const int8_t *inner_kind, char **source, char symbol[48]) {
    if (!kiln_codegen_supports(sub)) return kiln_error(KILN_ERR_NOT_IMPLEMENTED, "codegen: unsupported fused group");
    kiln_strbuf body = {kiln_malloc(4096), 0, 4096, false};
    if (!body.buf) return kiln_error(KILN_ERR_MEMORY, "out of memory generating code");
    body.buf[0] = '\0';
    bool rows = kiln_codegen_has_rows(sub);
    kiln_strbuf_printf(&body, "/* kiln fused %s kernel: %d inputs, %d ops */\n", rows ? "row" : "elementwise", sub->ninputs,
                       sub->nnodes);
    kiln_cg_prelude(&body, kiln_cg_uses(sub));
    kiln_strbuf_printf(&body, "\n");
    if (rows) {
        kiln_cg_emit_rows(&body, sub, inner_kind);
    } else {
        emit_row(&body, sub, inner_kind);
        emit_driver(&body, sub);
    }
    if (body.failed) {
        free(body.buf);
        return kiln_error(KILN_ERR_MEMORY, "out of memory generating code");
    }
    /* named by a hash of the code, the placeholder KILN_SYM replaced by the name */
    uint64_t h = kiln_codegen_hash(body.buf, body.len, 0x6b696c6eu);
    snprintf(symbol, 48, "kiln_fused_%016llx", (unsigned long long)h);
    size_t nsym = strlen(symbol), nplace = strlen("KILN_SYM"), count = 0;
    for (const char *p = strstr(body.buf, "KILN_SYM"); p; p = strstr(p + nplace, "KILN_SYM")) count++;
    kiln_strbuf full = {kiln_malloc(body.len + count * nsym + 1), 0, body.len + count * nsym + 1, false};
    if (full.buf) {
        char *o = full.buf;
        const char *p = body.buf;
        for (const char *q = strstr(p, "KILN_SYM"); q; p = q + nplace, q = strstr(p, "KILN_SYM")) {
            memcpy(o, p, (size_t)(q - p)), o += q - p;
            memcpy(o, symbol, nsym), o += nsym;
        }
        memcpy(o, p, strlen(p) + 1);
    }
    free(body.buf);
    if (!full.buf) return kiln_error(KILN_ERR_MEMORY, "out of memory generating code");
    *source = full.buf;
    return KILN_OK;
}
