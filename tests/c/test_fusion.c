/* Elementwise fusion and generated kernels: the pass's IR for small graphs; random elementwise
 * graphs (broadcasting, float32/float64, bool intermediates) give the same results fused and
 * unfused, natively (within a few ulp) and interpreted (bitwise); the vectorized float32 math
 * against libm over special and random values; inputs in unexpected layouts; and the compiler
 * cache across processes (disk hit, corrupt and truncated entries, unusable cache directories,
 * no compiler at all), run in child processes of this program. */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "codegen/codegen.h"
#include "codegen/fused.h"
#include "core/internal.h"
#include "kiln/graph.h"
#include "kiln/passes.h"

static const kiln_pass_options o1 = {KILN_LEVEL_O1, false, false, KILN_CONV_FUSE_ALL, false};

static uint64_t rng = 88172645463325252ull;
static uint64_t next_u64(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static double uniform(double lo, double hi) { return lo + (hi - lo) * (double)(next_u64() >> 11) / 9007199254740992.0; }
static int pick(int n) { return (int)(next_u64() % (uint64_t)n); }

static kiln_tensor *random_tensor(const kiln_meta *m, double lo, double hi) {
    kiln_tensor *t = NULL;
    if (kiln_tensor_empty(m->dtype, m->ndim, m->shape, &t) != KILN_OK) exit(2);
    for (int64_t i = 0; i < t->numel; i++) {
        double v = uniform(lo, hi);
        if (m->dtype == KILN_DTYPE_FLOAT32) ((float *)t->data)[i] = (float)v;
        else if (m->dtype == KILN_DTYPE_FLOAT64) ((double *)t->data)[i] = v;
        else if (m->dtype == KILN_DTYPE_BOOL) ((uint8_t *)t->data)[i] = v > 0;
        else if (m->dtype == KILN_DTYPE_INT32) ((int32_t *)t->data)[i] = (int32_t)(v * 10);
    }
    return t;
}

static int count_op(const kiln_graph *g, kiln_op op) {
    int n = 0;
    for (int32_t i = 0; i < g->nnodes; i++) n += g->nodes[i].op == op;
    return n;
}

/* Runs g compiled as is; outputs are new references. */
static kiln_status run_graph(const kiln_graph *g, kiln_tensor **in, kiln_tensor **out) {
    kiln_executable *e = NULL;
    KILN_TRY(kiln_compile(g, NULL, &e));
    kiln_status s = kiln_executable_run(e, g->ninputs, in, g->noutputs, out);
    kiln_executable_free(e);
    return s;
}

/* Element-wise comparison: |got - want| <= rtol * |want| + atol, NaNs equal, infinities exact;
 * rtol < 0: bitwise. */
static int64_t mismatches(const kiln_tensor *got, const kiln_tensor *want, double rtol, double atol, int64_t *first) {
    int64_t bad = 0;
    *first = -1;
    size_t isz = kiln_dtype_size(want->meta.dtype);
    for (int64_t i = 0; i < want->numel; i++) {
        bool ok;
        if (rtol < 0) {
            ok = memcmp((const char *)got->data + i * isz, (const char *)want->data + i * isz, isz) == 0;
        } else {
            double a = kiln_tensor_get_double(got, i), b = kiln_tensor_get_double(want, i);
            if (a != a || b != b) ok = (a != a) == (b != b);
            else if (isinf(a) || isinf(b)) ok = a == b;
            else ok = fabs(a - b) <= rtol * fabs(b) + atol;
        }
        if (!ok) {
            if (*first < 0) *first = i;
            bad++;
        }
    }
    return bad;
}

/* ---- the pass's IR -------------------------------------------------------------------------- */

static void test_pass_ir(void) {
    kiln_graph *g = NULL;
    CHECK_OK(kiln_graph_new(&g));
    kiln_meta m23 = {.dtype = KILN_DTYPE_FLOAT32, .ndim = 2, .shape = {2, 3}};
    kiln_meta m3 = {.dtype = KILN_DTYPE_FLOAT32, .ndim = 1, .shape = {3}};
    int32_t x, y, z, a, b, c, s, d, e, two;
    CHECK_OK(kiln_graph_add_input(g, &m23, &x));
    CHECK_OK(kiln_graph_add_input(g, &m3, &y));
    CHECK_OK(kiln_graph_add_input(g, &m23, &z));
    kiln_attrs full = {0};
    kiln_attrs_push_int(&full, KILN_DTYPE_FLOAT32), kiln_attrs_push_int(&full, 0), kiln_attrs_push_float(&full, 2.0);
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_FULL, 0, NULL, &full, -1, &two));
    int32_t xy[2] = {x, y};
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_MUL, 2, xy, NULL, -1, &a)); /* broadcast (2,3) * (3,) */
    int32_t az[2] = {a, z};
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_ADD, 2, az, NULL, -1, &b));
    int32_t b2[2] = {b, two};
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_MUL, 2, b2, NULL, -1, &c));
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_GELU, 1, &c, NULL, -1, &s)); /* first output */
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_EXP, 1, &s, NULL, -1, &d)); /* one op: left alone */
    int32_t sd[2] = {s, d};
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_SUM, 1, &sd[1], &(kiln_attrs){.ni = 2, .i = {3, 0}}, -1, &e));
    int32_t outs[2] = {s, e};
    CHECK_OK(kiln_graph_set_outputs(g, 2, outs));
    CHECK_OK(kiln_run_pass("fuse_elementwise", &g, &o1));
    char *text = kiln_graph_to_string(g);
    const char *want =
        "graph(%0: float32[2, 3], %1: float32[3], %2: float32[2, 3]) {\n"
        "  %3: float32[2, 3] = fused(%0, %1, %2) {0, 6, 2, 2, 3}\n"
        "  %4: float32[2, 3] = exp(%3)\n"
        "  %5: float32[] = sum(%4) {3, 0}\n"
        "  return (%3, %5)\n"
        "}\n"
        "subgraph 0: graph(%0: float32[2, 3], %1: float32[3], %2: float32[2, 3]) {\n"
        "  %3: float32[] = full() {6, 0; 2}\n"
        "  %4: float32[2, 3] = mul(%0, %1)\n"
        "  %5: float32[2, 3] = add(%4, %2)\n"
        "  %6: float32[2, 3] = mul(%5, %3)\n"
        "  %7: float32[2, 3] = gelu(%6)\n"
        "  return (%7)\n"
        "}\n";
    CHECK(text && strcmp(text, want) == 0);
    if (text && strcmp(text, want) != 0) fprintf(stderr, "got:\n%s", text);
    free(text);
    kiln_graph_free(g);
}

/* An intermediate used outside its group, a graph output in the middle, an in-place op between
 * producer and consumer, and a lone op: the pass leaves each where fusing would be wrong. */
static void test_pass_boundaries(void) {
    kiln_graph *g = NULL;
    CHECK_OK(kiln_graph_new(&g));
    kiln_meta m = {.dtype = KILN_DTYPE_FLOAT32, .ndim = 1, .shape = {8}};
    int32_t x, y, a, b, c, d, mm;
    CHECK_OK(kiln_graph_add_input(g, &m, &x));
    CHECK_OK(kiln_graph_add_input(g, &m, &y));
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_TANH, 1, &x, NULL, -1, &a));
    int32_t ay[2] = {a, y};
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_MUL, 2, ay, NULL, -1, &b));
    int32_t y2[2] = {y, x};
    kiln_attrs sl = {.ni = 24};
    sl.i[8] = 1, sl.i[16] = 8; /* axis 0: start 0, step 1, length 8 */
    /* y[0:8] = x in place: b (reading y) may not move past it */
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_SLICE_ASSIGN, 2, y2, &sl, -1, &mm));
    int32_t bx[2] = {b, x};
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_ADD, 2, bx, NULL, -1, &c));
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_SIGMOID, 1, &c, NULL, -1, &d));
    int32_t outs[2] = {d, a};
    CHECK_OK(kiln_graph_set_outputs(g, 2, outs));
    CHECK_OK(kiln_run_pass("fuse_elementwise", &g, &o1));
    char *text = kiln_graph_to_string(g);
    /* tanh is an output; mul stays before the slice_assign; add+sigmoid fuse */
    CHECK(text && strstr(text, "= tanh(") && strstr(text, "= mul(%2, %1)\n") &&
          strstr(text, "= fused(%3, %0) {0, 6, 1, 8}") && count_op(g, KILN_OP_FUSED) == 1);
    if (text && count_op(g, KILN_OP_FUSED) != 1) fprintf(stderr, "%s", text);
    free(text);
    kiln_graph_free(g);
}

/* A chain of 100 ops: groups hold at most 64. */
static void test_pass_group_cap(void) {
    kiln_graph *g = NULL;
    CHECK_OK(kiln_graph_new(&g));
    kiln_meta m = {.dtype = KILN_DTYPE_FLOAT32, .ndim = 1, .shape = {1000}};
    int32_t v;
    CHECK_OK(kiln_graph_add_input(g, &m, &v));
    for (int k = 0; k < 100; k++) CHECK_OK(kiln_graph_add_node(g, k % 3 ? KILN_OP_NEG : KILN_OP_TANH, 1, &v, NULL, -1, &v));
    CHECK_OK(kiln_graph_set_outputs(g, 1, &v));
    kiln_graph *fg = NULL;
    CHECK_OK(kiln_graph_clone(g, &fg));
    CHECK_OK(kiln_run_pass("fuse_elementwise", &fg, &o1));
    CHECK(count_op(fg, KILN_OP_FUSED) == 2 && fg->nnodes == 2);
    kiln_tensor *x = random_tensor(&m, -2, 2), *want = NULL, *got = NULL;
    CHECK_OK(run_graph(g, &x, &want));
    CHECK_OK(run_graph(fg, &x, &got));
    int64_t first;
    CHECK(want && got && mismatches(got, want, 1e-5, 1e-6, &first) == 0);
    kiln_tensor_release(x), kiln_tensor_release(want), kiln_tensor_release(got);
    kiln_graph_free(fg), kiln_graph_free(g);
}

/* ---- random graphs: fused == unfused ----------------------------------------------------- */

typedef struct {
    kiln_graph *g;
    int32_t pool[64];
    int npool;
} builder;

static int32_t add_op(builder *b, kiln_op op, int nin, const int32_t *in, const kiln_attrs *a) {
    int32_t out;
    kiln_status s = kiln_graph_add_node(b->g, op, nin, in, a, -1, &out);
    if (s != KILN_OK) {
        fprintf(stderr, "add_op %s: %s\n", kiln_op_table[op].name, kiln_last_error());
        exit(2);
    }
    if (b->npool < 64) b->pool[b->npool++] = out;
    return out;
}

/* A value from the pool, preferring recent ones. */
static int32_t operand(builder *b) {
    int k = b->npool - 1 - pick(b->npool < 3 ? b->npool : 3);
    if (pick(4) == 0) k = pick(b->npool);
    return b->pool[k];
}

/* Bounded ops keep values finite through long chains. */
static void random_op(builder *b, kiln_dtype dt) {
    int32_t x = operand(b), y = operand(b), in[3], v;
    kiln_attrs a = {0};
    switch (pick(17)) {
    case 0: in[0] = x, in[1] = y, add_op(b, KILN_OP_ADD, 2, in, NULL); break;
    case 1: in[0] = x, in[1] = y, add_op(b, KILN_OP_SUB, 2, in, NULL); break;
    case 2: in[0] = x, in[1] = y, add_op(b, KILN_OP_MUL, 2, in, NULL); break;
    case 3: add_op(b, KILN_OP_TANH, 1, &x, NULL); break;
    case 4: add_op(b, KILN_OP_SIGMOID, 1, &x, NULL); break;
    case 5: add_op(b, KILN_OP_GELU, 1, &x, NULL); break;
    case 6: add_op(b, KILN_OP_ERF, 1, &x, NULL); break;
    case 7: add_op(b, KILN_OP_SILU, 1, &x, NULL); break;
    case 8: in[0] = x, in[1] = y, add_op(b, KILN_OP_MAXIMUM, 2, in, NULL); break;
    case 9:
        v = add_op(b, KILN_OP_ABS, 1, &x, NULL);
        kiln_attrs_push_float(&a, -1.5), kiln_attrs_push_float(&a, 1.5);
        v = add_op(b, KILN_OP_CLAMP, 1, &v, &a);
        add_op(b, KILN_OP_EXP, 1, &v, NULL);
        break;
    case 10: /* where(x > y, x, y * 0.5) with a bool intermediate */
        in[0] = x, in[1] = y;
        v = add_op(b, KILN_OP_GT, 2, in, NULL);
        kiln_attrs_push_int(&a, dt), kiln_attrs_push_int(&a, 0), kiln_attrs_push_float(&a, 0.5);
        in[0] = y, in[1] = add_op(b, KILN_OP_FULL, 0, NULL, &a);
        in[2] = add_op(b, KILN_OP_MUL, 2, in, NULL);
        in[0] = v, in[1] = x;
        add_op(b, KILN_OP_WHERE, 3, in, NULL);
        break;
    case 11: /* log(1 + x * x) */
        in[0] = x, in[1] = x;
        v = add_op(b, KILN_OP_MUL, 2, in, NULL);
        kiln_attrs_push_int(&a, dt), kiln_attrs_push_int(&a, 0), kiln_attrs_push_float(&a, 1.0);
        in[0] = add_op(b, KILN_OP_FULL, 0, NULL, &a), in[1] = v;
        v = add_op(b, KILN_OP_ADD, 2, in, NULL);
        add_op(b, KILN_OP_LOG, 1, &v, NULL);
        break;
    case 12: /* x / (1 + |y|) */
        v = add_op(b, KILN_OP_ABS, 1, &y, NULL);
        kiln_attrs_push_int(&a, dt), kiln_attrs_push_int(&a, 0), kiln_attrs_push_float(&a, 1.0);
        in[0] = add_op(b, KILN_OP_FULL, 0, NULL, &a), in[1] = v;
        in[1] = add_op(b, KILN_OP_ADD, 2, in, NULL), in[0] = x;
        add_op(b, KILN_OP_DIV, 2, in, NULL);
        break;
    case 13: /* sqrt(|x|) */
        v = add_op(b, KILN_OP_ABS, 1, &x, NULL);
        add_op(b, KILN_OP_SQRT, 1, &v, NULL);
        break;
    case 14: in[0] = x, in[1] = y, add_op(b, KILN_OP_MINIMUM, 2, in, NULL); break;
    case 15: add_op(b, KILN_OP_NEG, 1, &x, NULL); break;
    default: /* a round trip through the other float dtype */
        kiln_attrs_push_int(&a, dt == KILN_DTYPE_FLOAT32 ? KILN_DTYPE_FLOAT64 : KILN_DTYPE_FLOAT32);
        v = add_op(b, KILN_OP_CAST, 1, &x, &a);
        v = add_op(b, KILN_OP_TANH, 1, &v, NULL);
        kiln_attrs_clear(&a), kiln_attrs_push_int(&a, dt);
        add_op(b, KILN_OP_CAST, 1, &v, &a);
        break;
    }
}

/* One random graph: inputs broadcasting against a base shape, a chain of ops, one or two
 * outputs; checks fused vs unfused natively and interpreted. Returns the fused node count. */
static int random_graph_case(int seed, bool large) {
    rng = 0x9e3779b97f4a7c15ull * (uint64_t)(seed + 1);
    kiln_dtype dt = pick(4) == 0 ? KILN_DTYPE_FLOAT64 : KILN_DTYPE_FLOAT32;
    int ndim = 1 + pick(3);
    int64_t base[3];
    for (int d = 0; d < ndim; d++) base[d] = large ? (d == ndim - 1 ? 4096 + pick(100) : 3 + pick(6)) : 1 + pick(7);
    builder b = {0};
    CHECK_OK(kiln_graph_new(&b.g));
    int nin = 1 + pick(3);
    for (int k = 0; k < nin; k++) {
        kiln_meta m = {.dtype = dt, .ndim = ndim};
        for (int d = 0; d < ndim; d++) m.shape[d] = pick(3) == 0 ? 1 : base[d];
        if (k == 0)
            for (int d = 0; d < ndim; d++) m.shape[d] = base[d];
        if (k > 0 && pick(3) == 0) { /* fewer leading axes */
            m.ndim = ndim - 1;
            for (int d = 0; d < m.ndim; d++) m.shape[d] = m.shape[d + 1];
        }
        if (k > 0 && pick(5) == 0) m.dtype = KILN_DTYPE_INT32; /* converted on load */
        int32_t v;
        CHECK_OK(kiln_graph_add_input(b.g, &m, &v));
        b.pool[b.npool++] = v;
    }
    int nops = 2 + pick(6);
    for (int k = 0; k < nops; k++) random_op(&b, dt);
    int32_t outs[2] = {b.pool[b.npool - 1], b.pool[b.npool - 1 - pick(b.npool - nin)]};
    int nout = pick(3) == 0 && outs[1] != outs[0] ? 2 : 1;
    CHECK_OK(kiln_graph_set_outputs(b.g, nout, outs));
    kiln_graph *fused = NULL;
    CHECK_OK(kiln_graph_clone(b.g, &fused));
    CHECK_OK(kiln_run_pass("fuse_elementwise", &fused, &o1));
    int nfused = count_op(fused, KILN_OP_FUSED);

    kiln_tensor *in[3] = {0}, *want[2] = {0}, *got[2] = {0}, *interp[2] = {0};
    for (int k = 0; k < nin; k++) in[k] = random_tensor(&b.g->values[b.g->inputs[k]].meta, -3, 3);
    CHECK_OK(run_graph(b.g, in, want));
    CHECK_OK(run_graph(fused, in, got));
    setenv("KILN_DISABLE_CODEGEN", "1", 1);
    CHECK_OK(run_graph(fused, in, interp));
    unsetenv("KILN_DISABLE_CODEGEN");
    for (int k = 0; k < nout; k++) {
        int64_t first;
        bool f32 = false; /* float32 anywhere upstream: float32 tolerances */
        for (int32_t v = 0; v < b.g->nvalues; v++) f32 |= b.g->values[v].meta.dtype == KILN_DTYPE_FLOAT32;
        int64_t bad = want[k] && got[k] ? mismatches(got[k], want[k], f32 ? 1e-5 : 1e-12, f32 ? 1e-6 : 1e-13, &first) : -1;
        CHECK(bad == 0);
        if (bad != 0)
            fprintf(stderr, "seed %d output %d: %lld mismatches, first at %lld: %.9g vs %.9g\n", seed, k, (long long)bad,
                    (long long)first, got[k] ? kiln_tensor_get_double(got[k], first) : 0.0,
                    want[k] ? kiln_tensor_get_double(want[k], first) : 0.0);
        bad = want[k] && interp[k] ? mismatches(interp[k], want[k], -1, 0, &first) : -1;
        CHECK(bad == 0); /* the interpreted path is the unfused graph's kernels */
    }
    if (check_failures) {
        char *text = kiln_graph_to_string(fused);
        fprintf(stderr, "seed %d graph:\n%s", seed, text ? text : "?");
        free(text);
    }
    kiln_release_all(in, 3), kiln_release_all(want, 2), kiln_release_all(got, 2), kiln_release_all(interp, 2);
    kiln_graph_free(fused);
    kiln_graph_free(b.g);
    return nfused;
}

static void test_random_graphs(void) {
    int fused = 0;
    for (int seed = 0; seed < 100 && !check_failures; seed++) fused += random_graph_case(seed, false);
    for (int seed = 1000; seed < 1008 && !check_failures; seed++) fused += random_graph_case(seed, true);
    CHECK(fused > 60);
}

/* ---- float32 math against libm --------------------------------------------------------------- */

/* A group of unary op `op` behind a neg pair (so it fuses), on values covering specials,
 * subnormals and a wide range; native against interpreted (libm) within max_ulp ulps of the
 * result plus per_x * |x| (gelu's 1 + erf(x) cancels: an ulp of erf near -1 is what it is). */
static void check_unary_math(kiln_op op, double max_ulp, double per_x) {
    int64_t n = 200000;
    kiln_meta m = {.dtype = KILN_DTYPE_FLOAT32, .ndim = 1, .shape = {n}};
    kiln_graph *g = NULL;
    CHECK_OK(kiln_graph_new(&g));
    int32_t x, a, b, c;
    CHECK_OK(kiln_graph_add_input(g, &m, &x));
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_NEG, 1, &x, NULL, -1, &a));
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_NEG, 1, &a, NULL, -1, &b));
    CHECK_OK(kiln_graph_add_node(g, op, 1, &b, NULL, -1, &c));
    CHECK_OK(kiln_graph_set_outputs(g, 1, &c));
    kiln_tensor *xt = random_tensor(&m, 0, 1), *want = NULL, *got = NULL;
    float *px = xt->data;
    static const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-45f, -1e-45f, 1e-40f, 1.17549435e-38f,
                                    3.4e38f, -3.4e38f, 88.72f, 88.73f, -87.3f, -103.9f, -104.1f, 1.0f, -1.0f,
                                    0.625f, -0.625f, 3.9f, 4.0f, 4.1f, -4.1f, 1e-8f, -1e-8f, 0.5f, 2.0f};
    int nspecial = (int)(sizeof special / sizeof special[0]);
    for (int64_t i = 0; i < n; i++) {
        if (i < nspecial) px[i] = special[i];
        else if (i % 3 == 0) px[i] = (float)uniform(-10, 10);
        else if (i % 3 == 1) px[i] = (float)(uniform(-1, 1) * exp(uniform(-90, 90))); /* every magnitude */
        else px[i] = (float)uniform(-120, 120);
    }
    CHECK_OK(run_graph(g, &xt, &want));
    kiln_graph *fg = NULL;
    CHECK_OK(kiln_graph_clone(g, &fg));
    CHECK_OK(kiln_run_pass("fuse_elementwise", &fg, &o1));
    CHECK(count_op(fg, KILN_OP_FUSED) == 1);
    CHECK_OK(run_graph(fg, &xt, &got));
    double worst = 0;
    int64_t worst_at = -1, bad_special = 0;
    for (int64_t i = 0; got && want && i < n; i++) {
        float w = ((float *)want->data)[i], v = ((float *)got->data)[i];
        if (w != w || v != v || isinf(w) || isinf(v)) {
            bool same = (w != w && v != v) || w == v;
            if (!same && bad_special++ < 3)
                fprintf(stderr, "%s(%g): got %g, libm %g\n", kiln_op_table[op].name, (double)px[i], (double)v, (double)w);
            continue;
        }
        float aw = fabsf(w);
        double ulp = aw < 1.17549435e-38f ? 1.401298464e-45 : (double)(nextafterf(aw, INFINITY) - aw);
        double e = (fabs((double)v - (double)w) - per_x * fabs((double)px[i])) / ulp;
        if (e > worst) worst = e, worst_at = i;
    }
    CHECK(bad_special == 0);
    CHECK(worst <= max_ulp);
    if (worst > max_ulp)
        fprintf(stderr, "%s: %.2f ulp at x = %.9g\n", kiln_op_table[op].name, worst, (double)px[worst_at]);
    kiln_tensor_release(xt), kiln_tensor_release(want), kiln_tensor_release(got);
    kiln_graph_free(fg), kiln_graph_free(g);
}

static void test_math(void) {
    check_unary_math(KILN_OP_EXP, 2, 0);
    check_unary_math(KILN_OP_ERF, 7, 0);
    check_unary_math(KILN_OP_TANH, 3, 0);
    check_unary_math(KILN_OP_LOG, 2, 0);
    check_unary_math(KILN_OP_SIGMOID, 3, 0);
    check_unary_math(KILN_OP_SILU, 4, 0);
    check_unary_math(KILN_OP_GELU, 7, 2.5e-7);
    check_unary_math(KILN_OP_SQRT, 0, 0);
}

/* ---- layouts the code was not generated for ------------------------------------------------------ */

static void test_layouts(void) {
    int64_t r = 37, c = 1029;
    kiln_meta m = {.dtype = KILN_DTYPE_FLOAT32, .ndim = 2, .shape = {r, c}};
    kiln_meta mc = {.dtype = KILN_DTYPE_FLOAT32, .ndim = 2, .shape = {r, 1}};
    kiln_graph *g = NULL;
    CHECK_OK(kiln_graph_new(&g));
    int32_t x, y, col, a, b, o;
    CHECK_OK(kiln_graph_add_input(g, &m, &x));
    CHECK_OK(kiln_graph_add_input(g, &m, &y));
    CHECK_OK(kiln_graph_add_input(g, &mc, &col));
    int32_t xy[2] = {x, y};
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_MUL, 2, xy, NULL, -1, &a));
    int32_t ac[2] = {a, col};
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_SUB, 2, ac, NULL, -1, &b));
    CHECK_OK(kiln_graph_add_node(g, KILN_OP_TANH, 1, &b, NULL, -1, &o));
    CHECK_OK(kiln_graph_set_outputs(g, 1, &o));
    kiln_graph *fg = NULL;
    CHECK_OK(kiln_graph_clone(g, &fg));
    CHECK_OK(kiln_run_pass("fuse_elementwise", &fg, &o1));
    CHECK(count_op(fg, KILN_OP_FUSED) == 1);
    kiln_tensor *xt = random_tensor(&m, -2, 2), *ct = random_tensor(&mc, -1, 1);
    /* y: a transposed view of a (c, r) tensor; col: a (r, 1) view with a row stride of 3 */
    kiln_meta mt = {.dtype = KILN_DTYPE_FLOAT32, .ndim = 2, .shape = {c, r}};
    kiln_meta mw = {.dtype = KILN_DTYPE_FLOAT32, .ndim = 1, .shape = {3 * r}};
    kiln_tensor *yt_base = random_tensor(&mt, -2, 2), *wide = random_tensor(&mw, -1, 1), *yt = NULL, *colv = NULL;
    int64_t tstr[2] = {1, r}, cstr[2] = {3, 1};
    CHECK_OK(kiln_tensor_view(yt_base, 2, m.shape, tstr, 0, &yt));
    CHECK_OK(kiln_tensor_view(wide, 2, mc.shape, cstr, 1, &colv));
    kiln_tensor *cases[2][3] = {{xt, yt, ct}, {yt, xt, colv}};
    for (int k = 0; k < 2; k++) {
        kiln_tensor *want = NULL, *got = NULL;
        CHECK_OK(run_graph(g, cases[k], &want));
        CHECK_OK(run_graph(fg, cases[k], &got));
        int64_t first;
        CHECK(want && got && mismatches(got, want, 2e-6, 0, &first) == 0);
        kiln_tensor_release(want), kiln_tensor_release(got);
    }
    kiln_tensor_release(xt), kiln_tensor_release(ct), kiln_tensor_release(yt_base), kiln_tensor_release(wide);
    kiln_tensor_release(yt), kiln_tensor_release(colv);
    kiln_graph_free(fg), kiln_graph_free(g);
}

/* ---- the compiler cache, across processes ---------------------------------------------------------- */

/* The child's work: prepares `groups` distinct fused groups (then builds them together),
 * runs them natively or not against the unfused graph, prints
 * "native=N identical=I compiles=C disk=D memory=M rebuilt=R". */
static int child_main(int groups) {
    int native = 0, identical = 1;
    kiln_graph *g[4] = {0};
    kiln_fused_kernel *fk[4] = {0};
    kiln_meta m = {.dtype = KILN_DTYPE_FLOAT32, .ndim = 1, .shape = {70000}};
    for (int k = 0; k < groups && k < 4; k++) {
        CHECK_OK(kiln_graph_new(&g[k]));
        int32_t x, y, z, a, b, o;
        CHECK_OK(kiln_graph_add_input(g[k], &m, &x));
        CHECK_OK(kiln_graph_add_input(g[k], &m, &y));
        CHECK_OK(kiln_graph_add_input(g[k], &m, &z));
        int32_t xy[2] = {x, y};
        CHECK_OK(kiln_graph_add_node(g[k], k == 1 ? KILN_OP_SUB : KILN_OP_MUL, 2, xy, NULL, -1, &a));
        int32_t az[2] = {a, z};
        CHECK_OK(kiln_graph_add_node(g[k], KILN_OP_ADD, 2, az, NULL, -1, &b));
        CHECK_OK(kiln_graph_add_node(g[k], k == 2 ? KILN_OP_TANH : k == 3 ? KILN_OP_SIGMOID : KILN_OP_GELU, 1, &b,
                                     NULL, -1, &o));
        CHECK_OK(kiln_graph_set_outputs(g[k], 1, &o));
        CHECK_OK(kiln_fused_prepare(g[k], &fk[k]));
    }
    for (int k = 0; k < groups && k < 4; k++) {
        native += kiln_fused_is_native(fk[k]);
        kiln_tensor *in[3], *want = NULL, *got = NULL;
        for (int j = 0; j < 3; j++) in[j] = random_tensor(&m, -3, 3);
        CHECK_OK(run_graph(g[k], in, &want));
        CHECK_OK(kiln_tensor_empty(KILN_DTYPE_FLOAT32, 1, m.shape, &got));
        CHECK_OK(kiln_fused_run(fk[k], 3, in, got));
        int64_t first;
        if (mismatches(got, want, -1, 0, &first) != 0) identical = 0;
        CHECK(mismatches(got, want, 1e-5, 1e-6, &first) == 0);
        kiln_release_all(in, 3), kiln_tensor_release(want), kiln_tensor_release(got);
        kiln_fused_free(fk[k]);
        kiln_graph_free(g[k]);
    }
    kiln_codegen_stats st;
    kiln_codegen_get_stats(&st);
    printf("native=%d identical=%d compiles=%lld disk=%lld memory=%lld rebuilt=%lld\n", native, identical,
           (long long)st.compiles, (long long)st.disk_hits, (long long)st.memory_hits, (long long)st.rebuilt);
    return check_failures ? 1 : 0;
}

typedef struct {
    int native, identical, compiles, disk, memory, rebuilt, warnings, status;
} child_result;

/* Runs this program as a child with the environment given (NULL values unset it). */
static child_result run_child(int groups, const char *cache_dir, const char *cc, const char *scratch) {
    child_result r = {-1, -1, -1, -1, -1, -1, -1, -1};
    char out_path[512], err_path[512], arg[16];
    snprintf(out_path, sizeof out_path, "%s/child.out", scratch);
    snprintf(err_path, sizeof err_path, "%s/child.err", scratch);
    snprintf(arg, sizeof arg, "%d", groups);
    fflush(stdout), fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        if (cache_dir) setenv("KILN_CACHE_DIR", cache_dir, 1);
        if (cc) setenv("CC", cc, 1);
        else unsetenv("CC");
        int fo = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600), fe = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(fo, 1), dup2(fe, 2);
        char *argv[] = {"test_fusion", "--child", arg, NULL};
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    int ws = 0;
    waitpid(pid, &ws, 0);
    r.status = WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
    FILE *f = fopen(out_path, "r");
    if (f) {
        if (fscanf(f, "native=%d identical=%d compiles=%d disk=%d memory=%d rebuilt=%d", &r.native, &r.identical,
                   &r.compiles, &r.disk, &r.memory, &r.rebuilt) != 6)
            r.native = -1;
        fclose(f);
    }
    f = fopen(err_path, "r");
    if (f) {
        char line[1024];
        r.warnings = 0;
        while (fgets(line, sizeof line, f))
            if (strstr(line, "kiln: warning")) r.warnings++;
        fclose(f);
    }
    if (r.status != 0) {
        char *text = NULL;
        f = fopen(err_path, "r");
        if (f) {
            text = calloc(1, 4096);
            if (text && fread(text, 1, 4095, f) == 0) text[0] = '\0';
            fclose(f);
        }
        fprintf(stderr, "child failed (status %d): %s\n", r.status, text ? text : "");
        free(text);
    }
    return r;
}

/* The first .so in dir (malloc'd), or NULL. */
static char *entry_path(const char *dir) {
    DIR *d = opendir(dir);
    char *found = NULL;
    for (struct dirent *e = d ? readdir(d) : NULL; e && !found; e = readdir(d)) {
        size_t n = strlen(e->d_name);
        if (n > 3 && strcmp(e->d_name + n - 3, ".so") == 0) {
            found = malloc(strlen(dir) + n + 2);
            if (found) sprintf(found, "%s/%s", dir, e->d_name);
        }
    }
    if (d) closedir(d);
    return found;
}

static int count_entries(const char *dir) {
    char *p = entry_path(dir);
    free(p);
    return p != NULL;
}

/* Deletes the files in dir, then dir. */
static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    char path[1024];
    for (struct dirent *e = d ? readdir(d) : NULL; e; e = readdir(d)) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    if (d) closedir(d);
    rmdir(dir);
}

static void test_cache(const char *scratch) {
    char cache[600], bad[700], shared[600], file[600];
    snprintf(cache, sizeof cache, "%s/cache", scratch);
    /* cold: one compile (created with mode 0700) */
    child_result r = run_child(1, cache, NULL, scratch);
    CHECK(r.status == 0 && r.native == 1 && r.compiles == 1 && r.disk == 0);
    struct stat st;
    CHECK(stat(cache, &st) == 0 && (st.st_mode & 0777) == 0700);
    char *entry = entry_path(cache);
    CHECK(entry != NULL);
    /* a new process: a disk hit, no compile */
    r = run_child(1, cache, NULL, scratch);
    CHECK(r.status == 0 && r.native == 1 && r.compiles == 0 && r.disk == 1);
    if (entry) {
        /* truncated: detected, rebuilt, then hit again */
        CHECK(stat(entry, &st) == 0);
        CHECK(truncate(entry, st.st_size / 2) == 0);
        r = run_child(1, cache, NULL, scratch);
        CHECK(r.status == 0 && r.native == 1 && r.rebuilt == 1 && r.compiles == 1);
        r = run_child(1, cache, NULL, scratch);
        CHECK(r.status == 0 && r.disk == 1 && r.compiles == 0);
        /* one byte flipped, same size */
        FILE *f = fopen(entry, "r+b");
        CHECK(f != NULL);
        if (f) {
            fseek(f, 200, SEEK_SET);
            int c = fgetc(f);
            fseek(f, 200, SEEK_SET);
            fputc(c ^ 0x5a, f);
            fclose(f);
        }
        r = run_child(1, cache, NULL, scratch);
        CHECK(r.status == 0 && r.native == 1 && r.rebuilt == 1 && r.compiles == 1);
        /* a zero-length file */
        f = fopen(entry, "wb");
        if (f) fclose(f);
        r = run_child(1, cache, NULL, scratch);
        CHECK(r.status == 0 && r.native == 1 && r.rebuilt == 1 && r.compiles == 1);
    }
    /* a cache directory that cannot be created (its parent is a file): compiled in a temp dir */
    snprintf(file, sizeof file, "%s/plain-file", scratch);
    FILE *f = fopen(file, "w");
    if (f) fclose(f);
    snprintf(bad, sizeof bad, "%s/cache", file);
    r = run_child(1, bad, NULL, scratch);
    CHECK(r.status == 0 && r.native == 1 && r.compiles == 1);
    /* a directory others may write to is not trusted: nothing is written there */
    snprintf(shared, sizeof shared, "%s/shared", scratch);
    CHECK(mkdir(shared, 0700) == 0 && chmod(shared, 0777) == 0);
    r = run_child(1, shared, NULL, scratch);
    CHECK(r.status == 0 && r.native == 1 && r.compiles == 1 && count_entries(shared) == 0);
    /* several groups prepared together: one compiler run, then one disk hit in a new process */
    r = run_child(3, cache, NULL, scratch);
    CHECK(r.status == 0 && r.native == 3 && r.compiles == 1 && r.disk == 0);
    r = run_child(3, cache, NULL, scratch);
    CHECK(r.status == 0 && r.native == 3 && r.compiles == 0 && r.disk == 1);
    /* no compiler: interpreted, bitwise as the unfused graph, one warning for three groups */
    r = run_child(3, cache, "/nonexistent", scratch);
    CHECK(r.status == 0 && r.native == 0 && r.identical == 1 && r.compiles == 0 && r.warnings == 1);
    free(entry);
    remove_dir(cache), remove_dir(shared);
    unlink(file);
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--child") == 0) return child_main(atoi(argv[2]));
    /* this process's objects go to a scratch cache, not the user's */
    char scratch[] = "/tmp/kiln-test-fusion-XXXXXX";
    if (!mkdtemp(scratch)) return 2;
    char cache[600];
    snprintf(cache, sizeof cache, "%s/parent-cache", scratch);
    setenv("KILN_CACHE_DIR", cache, 1);
    test_pass_ir();
    test_pass_boundaries();
    test_pass_group_cap();
    test_random_graphs();
    test_math();
    test_layouts();
    test_cache(scratch);
    remove_dir(cache);
    remove_dir(scratch);
    CHECK_DONE();
}
