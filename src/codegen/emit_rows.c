/* C source for a fused row group: elementwise ops, reductions over the innermost axis (sum,
 * mean, max, min) and the softmax family, computed one row at a time. A row is walked once per
 * reduction level: the loop of pass p accumulates the reductions whose inputs are ready in pass
 * p, and values that vary along the row are recomputed from the inputs in every pass that needs
 * them (the row stays in cache), so no scratch memory is needed. Per-row values (reduction
 * results and what is computed from them) are plain scalars between the loops. Each op's steps
 * (softmax: max, exp(x - max), sum, multiply by 1 / sum) are its row recipe in ops.def
 * (KILN_ROWS); sums accumulate in double as in the eager kernels.
 * Rows are spread over OpenMP threads when there are enough elements. */
#include "emit_internal.h"

#define MAX_STEPS 512

typedef enum { ST_INPUT, ST_NODE, ST_EXPR, ST_REDUCE } step_kind;
typedef enum { RED_SUM, RED_MAX, RED_MIN } red_kind;

/* The group lowered to steps: graph nodes, and the steps of row ops' recipes. */
typedef struct {
    step_kind kind;
    bool row;         /* varies along the row (else one value per row) */
    kiln_dtype dtype; /* of its variable */
    int nin, in[3];   /* operand steps */
    int32_t node;     /* ST_NODE: the graph node; ST_INPUT: the input index */
    const char *expr; /* ST_EXPR: C expression over a, b, c (typed as their steps), T = dtype */
    red_kind red;     /* ST_REDUCE */
    bool divide;      /* ST_REDUCE: mean (divide the sum by the row length) */
    int when;         /* row steps: the first pass that can compute it; others: the stage it is ready */
} step;

typedef struct {
    step s[MAX_STEPS];
    int n;
    bool overflow;
} program;

static int add(program *p, step st) {
    if (p->n == MAX_STEPS) {
        p->overflow = true;
        return 0;
    }
    int w = 0;
    for (int k = 0; k < st.nin; k++) {
        const step *o = &p->s[st.in[k]];
        if (o->when > w) w = o->when;
        if (o->row && st.kind != ST_REDUCE) st.row = true;
    }
    st.when = st.kind == ST_REDUCE ? p->s[st.in[0]].when + 1 : w;
    p->s[p->n] = st;
    return p->n++;
}

static int expr(program *p, kiln_dtype d, const char *e, int nin, int a, int b, int c) {
    return add(p, (step){.kind = ST_EXPR, .dtype = d, .expr = e, .nin = nin, .in = {a, b, c}});
}

static int reduce(program *p, kiln_dtype d, red_kind r, bool divide, int x) {
    return add(p, (step){.kind = ST_REDUCE, .dtype = d, .red = r, .divide = divide, .nin = 1, .in = {x}});
}

/* Whether a value of shape m varies along the space's last axis (of length n >= 2). */
static bool varies(const kiln_meta *m, int64_t n) { return m->ndim >= 1 && m->shape[m->ndim - 1] == n; }

/* Lowers sub; map[v] is the step of value v. Returns the output's step. */
static int lower(program *p, const kiln_graph *g, int64_t n, int *map) {
    for (int32_t k = 0; k < g->ninputs; k++) {
        const kiln_meta *m = &g->values[g->inputs[k]].meta;
        map[g->inputs[k]] = add(p, (step){.kind = ST_INPUT, .dtype = m->dtype, .node = k});
        p->s[map[g->inputs[k]]].row = varies(m, n);
    }
    for (int32_t i = 0; i < g->nnodes; i++) {
        const kiln_node *nd = &g->nodes[i];
        kiln_dtype d = g->values[nd->out[0]].meta.dtype;
        const kiln_dtype acc = KILN_DTYPE_FLOAT64;
        const kiln_row_recipe *rows = &kiln_op_rows[nd->op];
        int r = 0, at[KILN_ROW_MAX_STEPS]; /* at[j]: the program step of recipe step j */
        if (rows->axis == KILN_ROWS_NONE) {
            step st = {.kind = ST_NODE, .dtype = d, .node = i, .nin = nd->nin};
            for (int k = 0; k < nd->nin && k < 3; k++) st.in[k] = map[nd->in[k]];
            r = add(p, st);
        }
        for (int j = 0; rows->axis != KILN_ROWS_NONE && j < KILN_ROW_MAX_STEPS && rows->step[j].kind != KILN_ROW_END; j++) {
            const kiln_row_step *rs = &rows->step[j];
            int o[3] = {0, 0, 0};
            for (int k = 0; k < rs->nin; k++) /* KILN_ROW_INPUT is its own inverse */
                o[k] = rs->in[k] < 0 ? map[nd->in[KILN_ROW_INPUT(rs->in[k])]] : at[rs->in[k]];
            switch (rs->kind) {
            case KILN_ROW_EXPR: r = expr(p, d, rs->expr, rs->nin, o[0], o[1], o[2]); break;
            case KILN_ROW_SUM:
            case KILN_ROW_MEAN: r = reduce(p, acc, RED_SUM, rs->kind == KILN_ROW_MEAN, o[0]); break;
            case KILN_ROW_MAX: r = reduce(p, d, RED_MAX, false, o[0]); break;
            default: r = reduce(p, d, RED_MIN, false, o[0]); break;
            }
            at[j] = r;
        }
        map[nd->out[0]] = r;
    }
    return map[g->outputs[0]];
}

static void name_of(int j, char name[16]) { snprintf(name, 16, "s%d", j); }

/* The statement defining step j (not ST_INPUT / ST_REDUCE), indented for a loop body. */
static void emit_step(kiln_strbuf *t, const kiln_graph *g, const program *p, int j) {
    const step *st = &p->s[j];
    char names[3][16], out[16];
    const char *ops[3] = {names[0], names[1], names[2]};
    for (int k = 0; k < st->nin; k++) name_of(st->in[k], names[k]);
    name_of(j, out);
    if (st->kind == ST_NODE) {
        kiln_cg_put_expr(t, g, st->node, ops, out);
        return;
    }
    const char *ot = kiln_cg_c_type(st->dtype);
    kiln_strbuf_printf(t, "        %s %s;\n        {\n            typedef %s T;\n", ot, out, ot);
    static const char letters[3] = {'a', 'b', 'c'};
    for (int k = 0; k < st->nin; k++)
        kiln_strbuf_printf(t, "            const %s %c = %s;\n", kiln_cg_c_type(p->s[st->in[k]].dtype), letters[k], names[k]);
    kiln_strbuf_printf(t, "            %s = (T)(%s);\n        }\n", out, st->expr);
}

/* Marks the row steps a pass computes: what its reductions and a row output need (stop: a step
 * the pass reads back instead, or -1). */
static void mark(const program *p, int j, bool *need, int stop) {
    if (need[j] || !p->s[j].row) return;
    need[j] = true;
    if (j == stop) return;
    for (int k = 0; k < p->s[j].nin; k++) mark(p, p->s[j].in[k], need, stop);
}

/* Marks what pass `pass` computes; returns whether it has anything to do. */
static void mark_pass(const program *p, int pass, int out, bool *need, int stop) {
    memset(need, 0, sizeof(bool) * (size_t)p->n);
    for (int j = 0; j < p->n; j++)
        if (p->s[j].kind == ST_REDUCE && p->s[j].when == pass + 1) mark(p, p->s[j].in[0], need, stop);
    if (p->s[out].row && p->s[out].when == pass) mark(p, out, need, stop);
}

/* The row value the last pass reads back from the output row instead of computing it again: the
 * latest one of the output's dtype that the pass before computes and the last pass needs (the
 * exp(x - max) of softmax, the x - mean of a layer norm); -1: none. */
static int kept_in_output(const program *p, int out, int passes, bool *need_last, bool *need_before) {
    if (!p->s[out].row || passes < 2) return -1;
    mark_pass(p, passes - 1, out, need_last, -1);
    mark_pass(p, passes - 2, out, need_before, -1);
    for (int j = out - 1; j >= 0; j--)
        if (need_last[j] && need_before[j] && p->s[j].kind != ST_INPUT && p->s[j].dtype == p->s[out].dtype) return j;
    return -1;
}

static void emit_row_fn(kiln_strbuf *t, const kiln_graph *g, const program *p, int out, const int8_t *kinds) {
    const char *ot = kiln_cg_c_type(g->values[g->outputs[0]].meta.dtype);
    kiln_strbuf_printf(t, "static inline __attribute__((always_inline)) void KILN_SYM_row(char *const *q, const int64_t *is, int64_t n) {\n");
    kiln_strbuf_printf(t, "    (void)is;\n    %s *restrict o = (%s *)q[0];\n", ot, ot);
    if (kinds[0] == KILN_INNER_STRIDED) kiln_strbuf_printf(t, "    const int64_t os = is[0];\n");
    for (int j = 0; j < p->n; j++) {
        const step *st = &p->s[j];
        if (st->kind != ST_INPUT) continue;
        const char *ct = kiln_cg_c_type(st->dtype);
        int op = 1 + st->node;
        if (!st->row) kiln_strbuf_printf(t, "    const %s s%d = *(const %s *)q[%d];\n", ct, j, ct, op);
        else kiln_strbuf_printf(t, "    const %s *restrict x%d = (const %s *)q[%d];\n", ct, j, ct, op);
        if (st->row && kinds[op] == KILN_INNER_STRIDED) kiln_strbuf_printf(t, "    const int64_t i%d = is[%d];\n", j, op);
    }
    int passes = 0;
    for (int j = 0; j < p->n; j++)
        if (p->s[j].kind == ST_REDUCE && p->s[j].when > passes) passes = p->s[j].when;
    bool row_out = p->s[out].row;
    if (row_out && p->s[out].when + 1 > passes) passes = p->s[out].when + 1;
    bool need[MAX_STEPS], spare[MAX_STEPS];
    int kept = kept_in_output(p, out, passes, need, spare);
    const char *o_at = kinds[0] == KILN_INNER_STRIDED ? "i * os" : "i";
    for (int stage = 0; stage <= passes; stage++) {
        for (int j = 0; j < p->n; j++) /* the per-row values ready now */
            if (!p->s[j].row && p->s[j].when == stage && (p->s[j].kind == ST_NODE || p->s[j].kind == ST_EXPR))
                emit_step(t, g, p, j);
        if (stage == passes) break;
        bool last = stage == passes - 1;
        mark_pass(p, stage, out, need, last ? kept : -1);
        kiln_strbuf red[1] = {{NULL, 0, 0, false}}; /* the loop's reduction clauses */
        for (int j = 0; j < p->n; j++) {
            const step *st = &p->s[j];
            if (st->kind != ST_REDUCE || st->when != stage + 1) continue;
            const char *at = kiln_cg_c_type(st->dtype);
            if (st->red == RED_SUM) {
                kiln_strbuf_printf(t, "    %s acc%d = 0;\n", at, j);
                kiln_strbuf_printf(red, " reduction(+:acc%d)", j);
            } else {
                kiln_strbuf_printf(t, "    %s acc%d = %s__builtin_inf();\n    int nan%d = 0;\n", at, j,
                                   st->red == RED_MAX ? "-" : "", j);
                kiln_strbuf_printf(red, " reduction(%s:acc%d) reduction(|:nan%d)", st->red == RED_MAX ? "max" : "min", j, j);
            }
        }
        bool writes = row_out && p->s[out].when == stage;
        if (red->failed) t->failed = true;
        kiln_strbuf_printf(t, "#pragma omp simd%s\n    for (int64_t i = 0; i < n; i++) {\n", red->buf ? red->buf : "");
        free(red->buf);
        for (int j = 0; j < p->n; j++) {
            if (!need[j]) continue;
            const step *st = &p->s[j];
            if (last && j == kept) {
                kiln_strbuf_printf(t, "        const %s s%d = o[%s];\n", kiln_cg_c_type(st->dtype), j, o_at);
            } else if (st->kind == ST_INPUT) {
                const char *ct = kiln_cg_c_type(st->dtype);
                if (kinds[1 + st->node] == KILN_INNER_STRIDED)
                    kiln_strbuf_printf(t, "        const %s s%d = x%d[i * i%d];\n", ct, j, j, j);
                else kiln_strbuf_printf(t, "        const %s s%d = x%d[i];\n", ct, j, j);
            } else {
                emit_step(t, g, p, j);
            }
            if (stage == passes - 2 && j == kept) kiln_strbuf_printf(t, "        o[%s] = s%d;\n", o_at, j);
        }
        for (int j = 0; j < p->n; j++) {
            const step *st = &p->s[j];
            if (st->kind != ST_REDUCE || st->when != stage + 1) continue;
            const char *at = kiln_cg_c_type(st->dtype);
            if (st->red == RED_SUM) kiln_strbuf_printf(t, "        acc%d += (%s)s%d;\n", j, at, st->in[0]);
            else
                kiln_strbuf_printf(t, "        acc%d = s%d %s acc%d ? s%d : acc%d;\n        nan%d |= s%d != s%d;\n", j,
                                   st->in[0], st->red == RED_MAX ? ">" : "<", j, st->in[0], j, j, st->in[0], st->in[0]);
        }
        if (writes) kiln_strbuf_printf(t, "        o[%s] = s%d;\n", o_at, out);
        kiln_strbuf_printf(t, "    }\n");
        for (int j = 0; j < p->n; j++) { /* the reductions' values */
            const step *st = &p->s[j];
            if (st->kind != ST_REDUCE || st->when != stage + 1) continue;
            const char *at = kiln_cg_c_type(st->dtype);
            if (st->red == RED_SUM && st->divide) kiln_strbuf_printf(t, "    const %s s%d = acc%d / (%s)n;\n", at, j, j, at);
            else if (st->red == RED_SUM) kiln_strbuf_printf(t, "    const %s s%d = acc%d;\n", at, j, j);
            else kiln_strbuf_printf(t, "    const %s s%d = nan%d ? (%s)__builtin_nan(\"\") : acc%d;\n", at, j, j, at, j);
        }
    }
    if (!row_out) kiln_strbuf_printf(t, "    o[0] = s%d;\n", out);
    kiln_strbuf_printf(t, "}\n\n");
}
/* The rows [rb, re) of the space, and the entry point, which spreads rows over the threads when
 * there are enough elements. */
static void emit_driver(kiln_strbuf *t, const kiln_graph *g) {
    int nops = 1 + g->ninputs;
    kiln_cg_put_item_sizes(t, g);
    kiln_strbuf_printf(t,
        "static void KILN_SYM_rows(char *const *p, int ndim, const int64_t *shape, const int64_t *st, int64_t rb,\n"
        "                          int64_t re) {\n"
        "    const int64_t n = shape[ndim - 1];\n"
        "    int64_t is[%d];\n"
        "    char *q[%d];\n"
        "    for (int k = 0; k < %d; k++) is[k] = st[k * %d + ndim - 1] / KILN_SYM_isz[k];\n"
        "    for (int64_t r = rb; r < re; r++) {\n"
        "        int64_t rem = r;\n"
        "        for (int k = 0; k < %d; k++) q[k] = p[k];\n"
        "        for (int d = ndim - 2; d >= 0; d--) {\n"
        "            const int64_t i = rem %% shape[d];\n"
        "            rem /= shape[d];\n"
        "            for (int k = 0; k < %d; k++) q[k] += i * st[k * %d + d];\n"
        "        }\n"
        "        KILN_SYM_row(q, is, n);\n"
        "    }\n"
        "}\n\n",
        nops, nops, nops, KILN_MAX_DIMS, nops, nops, KILN_MAX_DIMS);
    kiln_strbuf_printf(t,
        "void KILN_SYM(char *const *p, int ndim, const int64_t *shape, const int64_t *st) {\n"
        "    int64_t rows = 1;\n"
        "    for (int d = 0; d + 1 < ndim; d++) rows *= shape[d];\n"
        "    if (rows <= 0 || shape[ndim - 1] <= 0) return;\n"
        "    int64_t nt = rows * shape[ndim - 1] / %d;\n"
        "    if (nt > omp_get_max_threads()) nt = omp_get_max_threads();\n"
        "    if (nt > rows) nt = rows;\n"
        "    if (nt <= 1 || omp_in_parallel()) {\n"
        "        KILN_SYM_rows(p, ndim, shape, st, 0, rows);\n"
        "        return;\n"
        "    }\n"
        "#pragma omp parallel num_threads((int)nt)\n"
        "    {\n"
        "        int64_t parts = omp_get_num_threads(), t = omp_get_thread_num();\n"
        "        int64_t b = rows * t / parts, e = rows * (t + 1) / parts;\n"
        "        if (b < e) KILN_SYM_rows(p, ndim, shape, st, b, e);\n"
        "    }\n"
        "}\n",
        KILN_PARALLEL_MIN / 2);
}

void kiln_cg_emit_rows(kiln_strbuf *t, const kiln_graph *sub, const int8_t *kinds) {
    int nd;
    int64_t shape[KILN_MAX_DIMS];
    kiln_codegen_space(sub, &nd, shape);
    program *p = kiln_calloc(1, sizeof *p);
    int *map = kiln_malloc(sizeof(int) * (size_t)(sub->nvalues ? sub->nvalues : 1));
    if (!p || !map) {
        t->failed = true;
    } else {
        int out = lower(p, sub, shape[nd - 1], map);
        if (p->overflow) t->failed = true;
        else {
            emit_row_fn(t, sub, p, out, kinds);
            emit_driver(t, sub);
        }
    }
    free(p), free(map);
}
