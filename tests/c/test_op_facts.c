/* Per-op facts of the op table (ops.def): commutativity, the math functions a C expression calls,
 * side effects, row kernels; the one view stride rule (kiln_view_strides) against the view
 * kernels; kiln_meta_equal / kiln_shape_equal. */
#include "check.h"
#include "core/internal.h"
#include "ops/rows.h"
#include "ops/view.h"

static unsigned flags(kiln_op op) { return kiln_op_table[op].flags; }

static void test_commutative(void) {
    CHECK(flags(KILN_OP_ADD) & KILN_OPF_COMMUTATIVE);
    CHECK(flags(KILN_OP_MUL) & KILN_OPF_COMMUTATIVE);
    CHECK(flags(KILN_OP_MAXIMUM) & KILN_OPF_COMMUTATIVE);
    CHECK(!(flags(KILN_OP_SUB) & KILN_OPF_COMMUTATIVE));
    CHECK(!(flags(KILN_OP_DIV) & KILN_OPF_COMMUTATIVE));
    CHECK(!(flags(KILN_OP_LT) & KILN_OPF_COMMUTATIVE));
    for (int op = 0; op < KILN_OP_COUNT; op++) /* only binary ops */
        if (flags((kiln_op)op) & KILN_OPF_COMMUTATIVE) CHECK(kiln_op_table[op].nin == 2);
}

/* Whether C expression e calls fn (a name not preceded by an identifier character). */
static bool calls(const char *e, const char *fn) {
    size_t n = strlen(fn);
    for (const char *p = strstr(e, fn); p; p = strstr(p + 1, fn)) {
        bool start = p == e || !(p[-1] == '_' || (p[-1] >= 'a' && p[-1] <= 'z') || (p[-1] >= '0' && p[-1] <= '9'));
        if (start && p[n] == '(') return true;
    }
    return false;
}

static void test_math(void) {
    CHECK(kiln_op_calls_math(KILN_OP_EXP) && (flags(KILN_OP_EXP) & KILN_OPF_EXP));
    CHECK(flags(KILN_OP_GELU) & KILN_OPF_ERF);
    CHECK(flags(KILN_OP_POW) & KILN_OPF_LIBM);
    CHECK(!kiln_op_calls_math(KILN_OP_ADD));
    CHECK(!kiln_op_calls_math(KILN_OP_RELU));
    CHECK(!kiln_op_calls_math(KILN_OP_MATMUL));
    /* every expression's flags say what it calls, and only that */
    static const struct {
        unsigned flag;
        const char *fns[20];
    } math[] = {{KILN_OPF_EXP, {"exp"}},
                {KILN_OPF_LOG, {"log"}},
                {KILN_OPF_ERF, {"erf"}},
                {KILN_OPF_TANH, {"tanh"}},
                {KILN_OPF_LIBM, {"sqrt", "sin", "cos", "pow", "log1p", "expm1", "tan", "asin", "acos", "atan", "sinh", "cosh",
                                  "asinh", "acosh", "atanh", "log2", "log10", "exp2", "atan2", "hypot"}}};
    for (int op = 0; op < KILN_OP_COUNT; op++) {
        const char *e = kiln_op_table[op].c_expr;
        for (size_t m = 0; m < sizeof math / sizeof math[0]; m++) {
            bool called = false;
            for (int k = 0; k < 20 && math[m].fns[k]; k++) called |= e && calls(e, math[m].fns[k]);
            if (called != ((flags((kiln_op)op) & math[m].flag) != 0))
                fprintf(stderr, "op %s: math flag %#x does not match its C expression %s\n", kiln_op_table[op].name,
                        math[m].flag, e ? e : "(none)");
            CHECK(called == ((flags((kiln_op)op) & math[m].flag) != 0));
        }
    }
}

static void test_side_effects(void) {
    static const kiln_op effects[] = {KILN_OP_PRINT, KILN_OP_CHECK, KILN_OP_SGD_UPDATE, KILN_OP_ADAM_UPDATE,
                                      KILN_OP_SLICE_ASSIGN, KILN_OP_INDEX_PUT, KILN_OP_RAND, KILN_OP_RANDN,
                                      KILN_OP_DROPOUT, KILN_OP_BATCH_NORM};
    for (size_t k = 0; k < sizeof effects / sizeof effects[0]; k++) CHECK(kiln_op_has_side_effects(effects[k]));
    CHECK(!kiln_op_has_side_effects(KILN_OP_ADD));
    CHECK(!kiln_op_has_side_effects(KILN_OP_MATMUL));
    CHECK(!kiln_op_has_side_effects(KILN_OP_RESHAPE));
    CHECK(!kiln_op_has_side_effects(KILN_OP_SOFTMAX));
}

static void test_rows(void) {
    CHECK(kiln_op_rows[KILN_OP_SUM].axis == KILN_ROWS_REDUCE);
    CHECK(kiln_op_rows[KILN_OP_MAX].axis == KILN_ROWS_REDUCE);
    CHECK(kiln_op_rows[KILN_OP_SOFTMAX].axis == KILN_ROWS_ALONG);
    CHECK(kiln_op_rows[KILN_OP_LOG_SOFTMAX_BACKWARD].axis == KILN_ROWS_ALONG);
    CHECK(kiln_op_rows[KILN_OP_ADD].axis == KILN_ROWS_NONE);
    CHECK(kiln_op_rows[KILN_OP_PROD].axis == KILN_ROWS_NONE);
    /* softmax: max, exp(x - max), sum, 1 / sum, multiply */
    const kiln_row_step *s = kiln_op_rows[KILN_OP_SOFTMAX].step;
    CHECK(s[0].kind == KILN_ROW_MAX && s[0].in[0] == KILN_ROW_INPUT(0));
    CHECK(s[2].kind == KILN_ROW_SUM && s[4].kind == KILN_ROW_EXPR && s[5].kind == KILN_ROW_END);
    /* recipes are well formed: reduction-class ops with fixed inputs, operands defined before use */
    for (int op = 0; op < KILN_OP_COUNT; op++) {
        const kiln_row_recipe *r = &kiln_op_rows[op];
        if (r->axis == KILN_ROWS_NONE) continue;
        CHECK(kiln_op_table[op].fusion == KILN_FUSE_REDUCTION && kiln_op_table[op].nin >= 1);
        CHECK(r->step[0].kind != KILN_ROW_END);
        for (int j = 0; j < KILN_ROW_MAX_STEPS && r->step[j].kind != KILN_ROW_END; j++) {
            const kiln_row_step *st = &r->step[j];
            CHECK(st->nin >= 1 && st->nin <= 3 && (st->kind == KILN_ROW_EXPR) == (st->expr != NULL));
            for (int k = 0; k < st->nin; k++)
                CHECK(st->in[k] < 0 ? KILN_ROW_INPUT(st->in[k]) < kiln_op_table[op].nin : st->in[k] < j);
        }
    }
}

/* The strides kiln_view_strides gives a view of x equal those of the view kernel's result. */
static void check_view(kiln_op op, kiln_tensor *x, const kiln_attrs *a, bool view) {
    kiln_tensor *y = NULL;
    int64_t strides[KILN_MAX_DIMS];
    CHECK(kiln_view_strides(op, a, &x->meta, x->strides, strides) == view);
    CHECK_OK(kiln_apply(op, 1, &x, a, &y));
    if (!y) return;
    CHECK(kiln_tensor_same_storage(x, y) == view);
    for (int d = 0; view && d < y->meta.ndim; d++) CHECK(strides[d] == y->strides[d]);
    kiln_tensor_release(y);
}

static void test_view_strides(void) {
    int64_t shape[3] = {2, 3, 4};
    kiln_tensor *x = NULL, *xt = NULL;
    CHECK_OK(kiln_tensor_empty(KILN_DTYPE_FLOAT32, 3, shape, &x));
    kiln_attrs a;
    kiln_attrs_clear(&a); /* permute (2, 0, 1) */
    kiln_attrs_push_int(&a, 2), kiln_attrs_push_int(&a, 0), kiln_attrs_push_int(&a, 1);
    check_view(KILN_OP_PERMUTE, x, &a, true);
    CHECK_OK(kiln_apply(KILN_OP_PERMUTE, 1, &x, &a, &xt)); /* (4, 2, 3), not contiguous */
    kiln_attrs_clear(&a); /* reshape (8, 3): a copy; (4, 6) and (4, 2, 3, 1): views */
    kiln_attrs_push_int(&a, 8), kiln_attrs_push_int(&a, 3);
    check_view(KILN_OP_RESHAPE, xt, &a, false);
    a.i[0] = 4, a.i[1] = 6;
    check_view(KILN_OP_RESHAPE, xt, &a, true);
    kiln_attrs_clear(&a);
    kiln_attrs_push_int(&a, 4), kiln_attrs_push_int(&a, 2), kiln_attrs_push_int(&a, 3), kiln_attrs_push_int(&a, 1);
    check_view(KILN_OP_RESHAPE, xt, &a, true);
    kiln_attrs_clear(&a); /* expand (5, 4, 2, 3) */
    kiln_attrs_push_int(&a, 5), kiln_attrs_push_int(&a, 4), kiln_attrs_push_int(&a, 2), kiln_attrs_push_int(&a, 3);
    check_view(KILN_OP_EXPAND, xt, &a, true);
    kiln_attrs_clear(&a); /* slice: start, step, length per axis */
    for (int k = 0; k < 24; k++) kiln_attrs_push_int(&a, 0);
    a.i[0] = 3, a.i[8] = -2, a.i[16] = 2; /* axis 0: 3, 1 */
    a.i[9] = 1, a.i[17] = 2;
    a.i[2] = 1, a.i[10] = 1, a.i[18] = 2;
    check_view(KILN_OP_SLICE, xt, &a, true);
    int64_t st[KILN_MAX_DIMS];
    CHECK(!kiln_view_strides(KILN_OP_ADD, &a, &x->meta, x->strides, st));
    kiln_tensor_release(xt);
    kiln_tensor_release(x);
}

static void test_meta_equal(void) {
    int64_t s1[2] = {2, 3}, s2[2] = {3, 2};
    kiln_meta a, b;
    kiln_meta_set(&a, KILN_DTYPE_FLOAT32, 2, s1);
    kiln_meta_set(&b, KILN_DTYPE_FLOAT32, 2, s1);
    CHECK(kiln_meta_equal(&a, &b) && kiln_shape_equal(&a, 2, s1));
    b.dtype = KILN_DTYPE_FLOAT64;
    CHECK(!kiln_meta_equal(&a, &b) && kiln_shape_equal(&b, a.ndim, a.shape));
    CHECK(!kiln_shape_equal(&a, 2, s2) && !kiln_shape_equal(&a, 1, s1));
}

int main(void) {
    test_commutative();
    test_math();
    test_side_effects();
    test_rows();
    test_view_strides();
    test_meta_equal();
    CHECK_DONE();
}
