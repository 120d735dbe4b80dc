/* Reads the text form printed by kiln_graph_to_string back into a graph (for pass tests).
 *
 *   graph(%0: float32[2, 3], %1: float32[3]) {
 *     %2: float32[] = constant(2)         (0-d constant; on other shapes: filled with the value)
 *     %3: float32[4] = constant            (zeros; likewise `captured`, `parameter`)
 *     %4: float32[2, 3] = add(%0, %1) {ints; floats}  # file:line
 *     return (%4)
 *   }
 *   subgraph 0: graph(...) { ... }
 *
 * Symbolic sizes (src/ir/symbolic.h): the header declares the graph's symbols, each with its
 * lower bound and hint, and sizes (in types and in attributes) are expressions of them:
 *   graph<s0 >= 2 (8), s1 >= 1 (3)>(%0: float32[s0, 64], %1: float32[s1]) {
 *     %2: float32[s0*64] = reshape(%0) {s0*64}
 * (sums, differences, products, "//" by a positive constant, parentheses).
 *
 * Value ids are renumbered in order of definition. Attributes without ';' are ints, unless a
 * token is not an integer or the op takes only floats (clamp, dropout). A subgraph block
 * belongs to the innermost graph whose next subgraph index it carries.
 *
 * The text may come from anywhere: every size it declares is bounded before anything is
 * allocated (see kiln/graph.h: nesting depth, values per graph, dimensions, shapes, elements of
 * a constant), and every error is KILN_ERR_VALUE naming the line (KILN_ERR_MEMORY when an
 * allocation fails). */
#include <ctype.h>
#include <errno.h>

#include "../core/internal.h"
#include "symbolic.h"

#define MAX_TEXT_ID KILN_GRAPH_TEXT_MAX_VALUES

typedef struct {
    const char *next; /* start of the next unread line (NULL at the end) */
    const char *line; /* start of the current line */
    const char *end;  /* end of the current line ('\n' or '\0') */
    const char *cur;  /* cursor within the line */
    int lineno;
} parser;

/* Per-graph map from text ids to graph value ids. */
typedef struct {
    int32_t *ids;
    int32_t cap;
} idmap;

static kiln_status fail(const parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static kiln_status fail(const parser *p, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kiln_error(KILN_ERR_VALUE, "graph text line %d: %s", p->lineno, msg);
}

/* ---- lines and tokens -------------------------------------------------------------------- */

static void skip_ws(parser *p) {
    while (p->cur < p->end && isspace((unsigned char)*p->cur)) p->cur++;
}

/* Moves to the next non-blank line; false at the end of the text. */
static bool next_line(parser *p) {
    while (p->next) {
        const char *s = p->next, *e = strchr(s, '\n');
        if (!e) e = s + strlen(s);
        p->next = *e ? e + 1 : NULL;
        p->lineno++;
        p->line = s, p->end = e, p->cur = s;
        skip_ws(p);
        if (p->cur < p->end) return true;
    }
    return false;
}

static bool accept(parser *p, const char *tok) {
    skip_ws(p);
    size_t n = strlen(tok);
    if ((size_t)(p->end - p->cur) >= n && memcmp(p->cur, tok, n) == 0) {
        p->cur += n;
        return true;
    }
    return false;
}

static kiln_status expect(parser *p, const char *tok) {
    if (accept(p, tok)) return KILN_OK;
    return fail(p, "expected '%s' at column %d", tok, (int)(p->cur - p->line) + 1);
}

static bool at_end(parser *p) {
    skip_ws(p);
    return p->cur == p->end;
}

/* An identifier ([A-Za-z_][A-Za-z0-9_]*) into buf. */
static kiln_status ident(parser *p, char *buf, size_t size) {
    skip_ws(p);
    const char *s = p->cur;
    while (p->cur < p->end && (isalnum((unsigned char)*p->cur) || *p->cur == '_')) p->cur++;
    size_t n = (size_t)(p->cur - s);
    if (n == 0 || isdigit((unsigned char)*s)) return fail(p, "expected a name at column %d", (int)(s - p->line) + 1);
    if (n >= size) return fail(p, "name too long");
    memcpy(buf, s, n);
    buf[n] = '\0';
    return KILN_OK;
}

static kiln_status integer(parser *p, int64_t *v) {
    skip_ws(p);
    if (p->cur == p->end) return fail(p, "expected an integer at the end of the line");
    char *e;
    errno = 0;
    long long x = strtoll(p->cur, &e, 10);
    if (e == p->cur || e > p->end || errno) return fail(p, "expected an integer at column %d", (int)(p->cur - p->line) + 1);
    p->cur = e;
    *v = x;
    return KILN_OK;
}

/* "%N": the text id N. */
static kiln_status text_id(parser *p, int64_t *id) {
    if (!accept(p, "%")) return fail(p, "expected a value (%%N) at column %d", (int)(p->cur - p->line) + 1);
    if (p->cur >= p->end || !isdigit((unsigned char)*p->cur)) return fail(p, "expected a value number after '%%'");
    KILN_TRY(integer(p, id));
    if (*id < 0 || *id >= MAX_TEXT_ID)
        return fail(p, "value id %%%lld out of range (a graph text holds at most %d values)", (long long)*id, MAX_TEXT_ID);
    return KILN_OK;
}

/* ---- symbolic sizes --------------------------------------------------------------------- */

#define MAX_SIZE_NESTING 64 /* parentheses in one size expression */

static kiln_status sym_sum(parser *p, kiln_symtab *t, int depth, kiln_sdim *out);

/* "(sum)", "s<k>" (a declared symbol) or a non-negative integer. */
static kiln_status sym_atom(parser *p, kiln_symtab *t, int depth, kiln_sdim *out) {
    skip_ws(p);
    if (accept(p, "(")) {
        if (depth >= MAX_SIZE_NESTING) return fail(p, "a size nests more than %d parentheses", MAX_SIZE_NESTING);
        KILN_TRY(sym_sum(p, t, depth + 1, out));
        return expect(p, ")");
    }
    if (p->cur < p->end && *p->cur == 's' && p->cur + 1 < p->end && isdigit((unsigned char)p->cur[1])) {
        p->cur++;
        int64_t k;
        KILN_TRY(integer(p, &k));
        if (k < 0 || k >= kiln_sym_count(t)) return fail(p, "symbol s%lld is not declared", (long long)k);
        *out = kiln_sym_get(t, (int32_t)k);
        return KILN_OK;
    }
    if (p->cur == p->end || !isdigit((unsigned char)*p->cur))
        return fail(p, "expected a size at column %d", (int)(p->cur - p->line) + 1);
    int64_t v;
    KILN_TRY(integer(p, &v));
    *out = kiln_sdim_const(v);
    return KILN_OK;
}

/* atom ("*" atom | "//" integer)* */
static kiln_status sym_product(parser *p, kiln_symtab *t, int depth, kiln_sdim *out) {
    KILN_TRY(sym_atom(p, t, depth, out));
    for (;;) {
        if (accept(p, "//")) {
            int64_t c;
            KILN_TRY(integer(p, &c));
            KILN_TRY(kiln_sym_floordiv(t, *out, c, out));
        } else if (accept(p, "*")) {
            kiln_sdim b;
            KILN_TRY(sym_atom(p, t, depth, &b));
            KILN_TRY(kiln_sym_mul(t, *out, b, out));
        } else {
            return KILN_OK;
        }
    }
}

/* ["-"] product (("+" | "-") product)* */
static kiln_status sym_sum(parser *p, kiln_symtab *t, int depth, kiln_sdim *out) {
    bool neg = accept(p, "-");
    KILN_TRY(sym_product(p, t, depth, out));
    if (neg) KILN_TRY(kiln_sym_mul(t, *out, kiln_sdim_const(-1), out));
    for (;;) {
        bool plus = accept(p, "+");
        if (!plus && !accept(p, "-")) return KILN_OK;
        kiln_sdim b;
        KILN_TRY(sym_product(p, t, depth, &b));
        if (!plus) KILN_TRY(kiln_sym_mul(t, b, kiln_sdim_const(-1), &b));
        KILN_TRY(kiln_sym_add(t, *out, b, out));
    }
}

/* "<s0 >= 2 (8), ...>" after "graph": the symbols, declared in order. */
static kiln_status symbols(parser *p, kiln_graph *g) {
    if (!accept(p, "<")) return KILN_OK;
    do {
        int64_t k, lower, hint;
        skip_ws(p);
        if (!accept(p, "s")) return fail(p, "expected a symbol (s0, s1, ...) at column %d", (int)(p->cur - p->line) + 1);
        KILN_TRY(integer(p, &k));
        if (k != (g->syms ? kiln_sym_count(g->syms) : 0)) return fail(p, "symbol s%lld declared out of order", (long long)k);
        KILN_TRY(expect(p, ">="));
        KILN_TRY(integer(p, &lower));
        KILN_TRY(expect(p, "("));
        KILN_TRY(integer(p, &hint));
        KILN_TRY(expect(p, ")"));
        kiln_sdim unused;
        kiln_status s = kiln_graph_add_symbol(g, lower, hint, &unused);
        if (s != KILN_OK) return s == KILN_ERR_MEMORY ? s : kiln_error_context(s, "graph text line %d", p->lineno);
    } while (accept(p, ","));
    return expect(p, ">");
}

/* "float32[2, 3]", "float32[s0, 64]" (sizes: shape, with their hints in m) */
static kiln_status type(parser *p, kiln_symtab *t, kiln_meta *m, kiln_sshape *shape) {
    char name[32];
    KILN_TRY(ident(p, name, sizeof name));
    int dt = 0;
    while (dt < KILN_DTYPE_COUNT && strcmp(kiln_dtype_name((kiln_dtype)dt), name) != 0) dt++;
    if (dt == KILN_DTYPE_COUNT) return fail(p, "unknown dtype '%s'", name);
    m->dtype = (kiln_dtype)dt;
    m->ndim = 0;
    shape->ndim = 0;
    KILN_TRY(expect(p, "["));
    if (accept(p, "]")) return KILN_OK;
    do {
        if (m->ndim == KILN_MAX_DIMS) return fail(p, "more than %d dimensions", KILN_MAX_DIMS);
        kiln_sdim d;
        if (t) {
            KILN_TRY(sym_sum(p, t, 0, &d));
        } else {
            d.e = 0;
            KILN_TRY(integer(p, &d.v));
        }
        if (d.v < 0) return fail(p, "negative dimension %lld", (long long)d.v);
        shape->d[m->ndim] = d;
        m->shape[m->ndim++] = d.v;
    } while (accept(p, ","));
    KILN_TRY(expect(p, "]"));
    shape->ndim = m->ndim;
    int64_t n;
    kiln_status s = kiln_shape_numel_checked(m->ndim, m->shape, &n);
    return s == KILN_OK ? KILN_OK : kiln_error_context(s, "graph text line %d", p->lineno);
}

/* ---- value ids ---------------------------------------------------------------------------- */

static kiln_status define(parser *p, idmap *map, int64_t tid, int32_t value) {
    if (tid >= map->cap) {
        int32_t ncap = map->cap ? map->cap : 64;
        while (ncap <= tid) ncap *= 2;
        int32_t *grown = kiln_realloc(map->ids, sizeof(int32_t) * (size_t)ncap);
        if (!grown) return kiln_error(KILN_ERR_MEMORY, "out of memory parsing a graph");
        for (int32_t k = map->cap; k < ncap; k++) grown[k] = -1;
        map->ids = grown;
        map->cap = ncap;
    }
    if (map->ids[tid] >= 0) return fail(p, "value %%%lld is defined twice", (long long)tid);
    map->ids[tid] = value;
    return KILN_OK;
}

static kiln_status use(parser *p, const idmap *map, int32_t *value) {
    int64_t tid;
    KILN_TRY(text_id(p, &tid));
    if (tid >= map->cap || map->ids[tid] < 0) return fail(p, "value %%%lld is not defined", (long long)tid);
    *value = map->ids[tid];
    return KILN_OK;
}

/* ---- lines -------------------------------------------------------------------------------- */

/* "graph(%0: T, ...) {" after the cursor. */
static kiln_status header(parser *p, kiln_graph *g, idmap *map) {
    KILN_TRY(expect(p, "graph"));
    KILN_TRY(symbols(p, g));
    KILN_TRY(expect(p, "("));
    if (!accept(p, ")")) {
        do {
            int64_t tid;
            kiln_meta m;
            kiln_sshape shape;
            int32_t v;
            KILN_TRY(text_id(p, &tid));
            KILN_TRY(expect(p, ":"));
            KILN_TRY(type(p, g->syms, &m, &shape));
            KILN_TRY(kiln_graph_add_input_sym(g, m.dtype, &shape, &v));
            KILN_TRY(define(p, map, tid, v));
        } while (accept(p, ","));
        KILN_TRY(expect(p, ")"));
    }
    KILN_TRY(expect(p, "{"));
    return at_end(p) ? KILN_OK : fail(p, "unexpected text after '{'");
}

static kiln_status capture(parser *p, kiln_graph *g, idmap *map, int64_t tid, const kiln_meta *m, const char *kind) {
    bool has_value = false, integral = false;
    double value = 0;
    long long ivalue = 0;
    if (strcmp(kind, "constant") == 0 && accept(p, "(")) {
        skip_ws(p);
        char *e = (char *)p->cur, *ie = (char *)p->cur;
        if (p->cur < p->end) {
            value = strtod(p->cur, &e);
            errno = 0;
            ivalue = strtoll(p->cur, &ie, 10);
        }
        if (e == p->cur || e > p->end) return fail(p, "expected a number in constant(...)");
        /* An integer constant is read as an integer: through a double, int64 values beyond 2^53
         * would change. */
        integral = !kiln_dtype_is_float(m->dtype) && ie == e && errno == 0;
        p->cur = e;
        has_value = true;
        KILN_TRY(expect(p, ")"));
    }
    if (!at_end(p)) return fail(p, "unexpected text after %s", kind);
    int64_t numel = kiln_meta_numel(m); /* type() checked the shape */
    if (numel > KILN_GRAPH_TEXT_MAX_CONSTANT)
        return fail(p, "a %s declared in text holds at most %lld elements, this one %lld", kind,
                    (long long)KILN_GRAPH_TEXT_MAX_CONSTANT, (long long)numel);
    kiln_tensor *t = NULL, *scalar = NULL;
    KILN_TRY(kiln_tensor_zeros(m->dtype, m->ndim, m->shape, &t));
    kiln_status s = KILN_OK;
    if (has_value) {
        s = kiln_tensor_empty(integral ? KILN_DTYPE_INT64 : KILN_DTYPE_FLOAT64, 0, NULL, &scalar);
        if (s == KILN_OK) {
            if (integral)
                *(int64_t *)scalar->data = ivalue;
            else
                *(double *)scalar->data = value;
            s = kiln_copy_into(t, scalar);
        }
        kiln_tensor_release(scalar);
    }
    t->requires_grad = strcmp(kind, "parameter") == 0;
    int32_t v = -1;
    if (s == KILN_OK) s = kiln_graph_add_capture(g, t, false, &v);
    if (s == KILN_OK) g->values[v].constant = strcmp(kind, "constant") == 0;
    kiln_tensor_release(t);
    if (s == KILN_OK) s = define(p, map, tid, v);
    return s;
}

/* Ops whose attributes are floats only: "{a, b}" holds floats there. */
static bool float_only(kiln_op op) { return op == KILN_OP_CLAMP || op == KILN_OP_DROPOUT; }

/* One attribute token ending at ',', ';' or '}'. */
static kiln_status attr_token(parser *p, const char **s, size_t *n) {
    skip_ws(p);
    *s = p->cur;
    while (p->cur < p->end && *p->cur != ',' && *p->cur != ';' && *p->cur != '}') p->cur++;
    const char *e = p->cur;
    while (e > *s && isspace((unsigned char)e[-1])) e--;
    *n = (size_t)(e - *s);
    if (*n == 0 || *n > 63) return fail(p, "bad attribute at column %d", (int)(*s - p->line) + 1);
    return KILN_OK;
}

static bool token_is_int(const char *s, size_t n) {
    size_t k = (s[0] == '-' || s[0] == '+') ? 1 : 0;
    if (k == n) return false;
    for (; k < n; k++)
        if (!isdigit((unsigned char)s[k])) return false;
    return true;
}

/* A size expression among the int attributes ("s0*64"): it names a symbol (no number does). */
static bool token_is_sym(const char *s, size_t n) { return memchr(s, 's', n) != NULL; }

/* ai (NULL in graphs without symbols): the int attributes as sizes. */
static kiln_status attrs(parser *p, kiln_symtab *t, kiln_op op, kiln_attrs *a, kiln_sdim *ai) {
    const char *tok[KILN_MAX_ATTR_INTS + KILN_MAX_ATTR_FLOATS + 1];
    size_t len[KILN_MAX_ATTR_INTS + KILN_MAX_ATTR_FLOATS + 1];
    int ntok = 0, split = -1; /* split: number of tokens before ';' */
    bool all_int = true;
    if (!accept(p, "}")) {
        if (accept(p, ";")) split = 0;
        for (;;) {
            if (ntok == (int)(sizeof tok / sizeof tok[0])) return fail(p, "too many attributes");
            KILN_TRY(attr_token(p, &tok[ntok], &len[ntok]));
            all_int &= token_is_int(tok[ntok], len[ntok]) || (t && token_is_sym(tok[ntok], len[ntok]));
            ntok++;
            if (accept(p, ",")) continue;
            if (accept(p, ";")) {
                if (split >= 0) return fail(p, "two ';' in attributes");
                split = ntok;
                continue;
            }
            KILN_TRY(expect(p, "}"));
            break;
        }
    }
    if (split < 0) split = (all_int && !float_only(op)) ? ntok : 0;
    if (split > KILN_MAX_ATTR_INTS || ntok - split > KILN_MAX_ATTR_FLOATS)
        return fail(p, "too many attributes (%d ints, %d floats)", split, ntok - split);
    kiln_attrs_clear(a);
    for (int k = 0; k < ntok; k++) {
        char buf[64], *e;
        memcpy(buf, tok[k], len[k]);
        buf[len[k]] = '\0';
        errno = 0;
        if (k < split && t && token_is_sym(buf, len[k])) {
            parser sub = *p;
            sub.cur = tok[k], sub.end = tok[k] + len[k];
            KILN_TRY(sym_sum(&sub, t, 0, &ai[a->ni]));
            if (!at_end(&sub)) return fail(p, "attribute '%s' is not a size", buf);
            kiln_attrs_push_int(a, ai[a->ni].v);
        } else if (k < split) {
            long long v = strtoll(buf, &e, 10);
            if (ai) ai[a->ni] = kiln_sdim_const(v);
            if (*e || errno) return fail(p, "attribute '%s' is not an integer", buf);
            kiln_attrs_push_int(a, v);
        } else {
            double v = strtod(buf, &e);
            if (*e) return fail(p, "attribute '%s' is not a number", buf);
            kiln_attrs_push_float(a, v);
        }
    }
    return KILN_OK;
}

static kiln_status node(parser *p, kiln_graph *g, idmap *map, int nout, const int64_t *tids, const kiln_meta *metas,
                        const kiln_sshape *shapes, const char *name) {
    kiln_op op = kiln_op_from_name(name);
    if (op == KILN_OP_COUNT) return fail(p, "unknown op '%s'", name);
    if (kiln_op_table[op].nout != nout && kiln_op_table[op].nout != KILN_VARIADIC)
        return fail(p, "%s has %d outputs, the line declares %d", name, kiln_op_table[op].nout, nout);
    int32_t *in = NULL;
    int nin = 0, cap = 0;
    kiln_status s = expect(p, "(");
    if (s == KILN_OK && !accept(p, ")")) {
        do {
            if (nin == cap) {
                cap = cap ? cap * 2 : 8;
                int32_t *grown = kiln_realloc(in, sizeof(int32_t) * (size_t)cap);
                if (!grown) {
                    s = kiln_error(KILN_ERR_MEMORY, "out of memory parsing a graph");
                    break;
                }
                in = grown;
            }
            s = use(p, map, &in[nin++]);
        } while (s == KILN_OK && accept(p, ","));
        if (s == KILN_OK) s = expect(p, ")");
    }
    kiln_attrs a;
    kiln_attrs_clear(&a);
    kiln_sdim ai[KILN_MAX_ATTR_INTS];
    if (s == KILN_OK && accept(p, "{")) s = attrs(p, g->syms, op, &a, g->syms ? ai : NULL);
    int32_t loc = -1;
    if (s == KILN_OK && accept(p, "#")) {
        skip_ws(p);
        const char *e = p->end;
        while (e > p->cur && isspace((unsigned char)e[-1])) e--;
        char buf[512];
        size_t n = (size_t)(e - p->cur);
        if (n >= sizeof buf) n = sizeof buf - 1;
        memcpy(buf, p->cur, n);
        buf[n] = '\0';
        p->cur = p->end;
        s = kiln_graph_add_loc(g, buf, &loc);
    }
    if (s == KILN_OK && !at_end(p)) s = fail(p, "unexpected text at column %d", (int)(p->cur - p->line) + 1);
    if (s == KILN_OK && kiln_op_nout(op, &a) != nout)
        s = fail(p, "%s has %d outputs (attribute 2), the line declares %d", name, kiln_op_nout(op, &a), nout);
    int32_t outs[KILN_MAX_OUTPUTS];
    if (s == KILN_OK) {
        s = kiln_graph_add_node_sym(g, op, nin, in, &a, g->syms ? ai : NULL, loc, outs);
        if (s != KILN_OK) s = kiln_error_context(s == KILN_ERR_MEMORY ? s : KILN_ERR_VALUE, "graph text line %d", p->lineno);
    }
    free(in);
    for (int k = 0; k < nout && s == KILN_OK; k++) {
        const kiln_meta *got = &g->values[outs[k]].meta;
        kiln_sshape shape;
        kiln_graph_value_sshape(g, outs[k], &shape);
        bool same = true;
        for (int d = 0; d < shape.ndim && d < shapes[k].ndim; d++) same &= kiln_sdim_same(shape.d[d], shapes[k].d[d]);
        if (!same) return fail(p, "%s output %d is declared with other symbolic sizes than it has", name, k);
        if (!kiln_meta_equal(got, &metas[k])) {
            char a1[160], a2[160];
            return fail(p, "%s output %d is declared %s%s but is %s%s", name, k, kiln_dtype_name(metas[k].dtype),
                        kiln_shape_str(&metas[k], a1, sizeof a1), kiln_dtype_name(got->dtype),
                        kiln_shape_str(got, a2, sizeof a2));
        }
        s = define(p, map, tids[k], outs[k]);
    }
    return s;
}

/* "%a: T[, %b: T] = op(...) ..." or "%a: T = constant|captured|parameter". */
static kiln_status definition(parser *p, kiln_graph *g, idmap *map) {
    int64_t tids[KILN_MAX_OUTPUTS];
    kiln_meta metas[KILN_MAX_OUTPUTS];
    kiln_sshape shapes[KILN_MAX_OUTPUTS];
    int nout = 0;
    do {
        if (nout == KILN_MAX_OUTPUTS) return fail(p, "more than %d outputs", KILN_MAX_OUTPUTS);
        KILN_TRY(text_id(p, &tids[nout]));
        KILN_TRY(expect(p, ":"));
        KILN_TRY(type(p, g->syms, &metas[nout], &shapes[nout]));
        nout++;
    } while (accept(p, ","));
    KILN_TRY(expect(p, "="));
    char name[64];
    KILN_TRY(ident(p, name, sizeof name));
    if (strcmp(name, "constant") == 0 || strcmp(name, "captured") == 0 || strcmp(name, "parameter") == 0) {
        if (nout != 1) return fail(p, "a %s defines one value", name);
        for (int d = 0; d < shapes[0].ndim; d++)
            if (shapes[0].d[d].e) return fail(p, "a %s has concrete sizes", name);
        return capture(p, g, map, tids[0], &metas[0], name);
    }
    return node(p, g, map, nout, tids, metas, shapes, name);
}

static kiln_status ret(parser *p, kiln_graph *g, const idmap *map) {
    KILN_TRY(expect(p, "("));
    int32_t *outs = NULL;
    int n = 0, cap = 0;
    kiln_status s = KILN_OK;
    if (!accept(p, ")")) {
        do {
            if (n == cap) {
                cap = cap ? cap * 2 : 16;
                int32_t *grown = kiln_realloc(outs, sizeof(int32_t) * (size_t)cap);
                if (!grown) {
                    s = kiln_error(KILN_ERR_MEMORY, "out of memory parsing a graph");
                    break;
                }
                outs = grown;
            }
            s = use(p, map, &outs[n++]);
        } while (s == KILN_OK && accept(p, ","));
        if (s == KILN_OK) s = expect(p, ")");
    }
    if (s == KILN_OK && !at_end(p)) s = fail(p, "unexpected text after return");
    if (s == KILN_OK) s = kiln_graph_set_outputs(g, n, outs);
    free(outs);
    return s;
}

/* Whether the current line is "subgraph K:" with K the next index of g (cursor after ':'). */
static bool subgraph_line(parser *p, const kiln_graph *g) {
    const char *save = p->cur;
    int64_t k;
    if (accept(p, "subgraph") && integer(p, &k) == KILN_OK && k == g->nsubgraphs && accept(p, ":")) return true;
    kiln_clear_error();
    p->cur = save;
    return false;
}

/* The graph whose header is at the cursor (nested `depth` subgraphs deep: 0 for the top graph),
 * its body, and the subgraph blocks that follow it.
 * The subgraphs are read first (control-flow nodes infer their outputs from them), then the
 * body. On return the current line is the first one not consumed (more = false at the end). */
static kiln_status graph_block(parser *p, kiln_graph *g, int depth, bool *more) {
    if (depth > KILN_GRAPH_TEXT_MAX_DEPTH)
        return fail(p, "subgraphs nested more than %d deep", KILN_GRAPH_TEXT_MAX_DEPTH);
    idmap map = {0};
    kiln_status s = header(p, g, &map);
    parser body_start = *p;
    bool closed = false;
    while (s == KILN_OK && !closed) { /* skip the body: it holds no nested blocks */
        if (!next_line(p)) s = fail(p, "missing '}' closing the graph");
        else closed = accept(p, "}");
    }
    *more = s == KILN_OK && next_line(p);
    while (s == KILN_OK && *more && subgraph_line(p, g)) {
        kiln_graph *sub = NULL;
        int32_t idx;
        s = kiln_graph_new(&sub);
        if (s == KILN_OK) s = graph_block(p, sub, depth + 1, more);
        if (s == KILN_OK) s = kiln_graph_add_subgraph(g, sub, &idx);
        if (s != KILN_OK) kiln_graph_free(sub);
    }
    if (s != KILN_OK) {
        free(map.ids);
        return s;
    }
    parser after = *p;
    *p = body_start;
    bool returned = false;
    while (s == KILN_OK) {
        if (!next_line(p)) {
            s = fail(p, "missing '}' closing the graph");
            break;
        }
        if (accept(p, "}")) {
            s = at_end(p) ? KILN_OK : fail(p, "unexpected text after '}'");
            if (s == KILN_OK && !returned) s = fail(p, "graph has no return line");
            break;
        }
        if (returned) {
            s = fail(p, "text after the return line");
        } else if (accept(p, "return")) {
            s = ret(p, g, &map);
            returned = true;
        } else {
            s = definition(p, g, &map);
        }
    }
    free(map.ids);
    if (s == KILN_OK) *p = after;
    return s;
}

kiln_status kiln_graph_parse(const char *text, kiln_graph **out) {
    *out = NULL;
    if (!text) return kiln_error(KILN_ERR_VALUE, "graph text: NULL");
    parser p = {.next = text};
    if (!next_line(&p)) return kiln_error(KILN_ERR_VALUE, "graph text: empty");
    kiln_graph *g;
    KILN_TRY(kiln_graph_new(&g));
    bool more = false;
    kiln_status s = graph_block(&p, g, 0, &more);
    if (s == KILN_OK && more) s = fail(&p, "unexpected text after the graph");
    if (s == KILN_OK) {
        s = kiln_graph_verify(g);
        if (s != KILN_OK) s = kiln_error_context(s == KILN_ERR_MEMORY ? s : KILN_ERR_VALUE, "graph text");
    }
    if (s == KILN_ERR_LIMIT) s = kiln_error_context(KILN_ERR_VALUE, "graph text"); /* sizes past the algebra's capacity */
    if (s != KILN_OK) {
        kiln_graph_free(g);
        return s;
    }
    *out = g;
    return KILN_OK;
}
