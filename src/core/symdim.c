/* Symbolic sizes: the table of symbols and canonical expressions (see symdim.h). */
#include "symdim.h"

typedef struct term {
    int64_t coef;
    int32_t nf;
    int32_t f[KILN_SYM_MAX_FACTORS]; /* atom entries, ascending (repeated for powers) */
} term;

/* A sum of terms: no zero coefficient, no two terms with the same factors, in term_cmp order. */
typedef struct poly {
    int32_t nt;
    term t[KILN_SYM_MAX_TERMS];
} poly;

typedef enum { E_SYM, E_FDIV, E_POLY } entry_kind;

typedef struct entry {
    entry_kind kind;
    int64_t hint;
    int32_t sym;    /* E_SYM: its index k (s<k>) */
    int64_t lower;  /* E_SYM */
    int32_t num;    /* E_FDIV: floor(num / div), num an entry */
    int64_t div;
    poly p;         /* E_POLY: at least two terms, or one that is not a lone atom */
} entry;

struct kiln_symtab {
    entry *e; /* e[0] unused: entry 0 means "a constant" */
    int32_t n, cap;
    int32_t *syms; /* entry of symbol k */
    int32_t nsyms, cap_syms;
};

kiln_status kiln_symtab_new(kiln_symtab **out) {
    kiln_symtab *t = kiln_calloc(1, sizeof *t);
    if (!t) return kiln_error(KILN_ERR_MEMORY, "out of memory allocating a symbol table");
    t->n = 1;
    *out = t;
    return KILN_OK;
}

void kiln_symtab_free(kiln_symtab *t) {
    if (!t) return;
    free(t->e), free(t->syms), free(t);
}

kiln_status kiln_symtab_clone(const kiln_symtab *t, kiln_symtab **out) {
    kiln_symtab *c = NULL;
    KILN_TRY(kiln_symtab_new(&c));
    if (t->e) {
        c->e = kiln_malloc(sizeof *c->e * (size_t)t->n);
        if (c->e) memcpy(c->e, t->e, sizeof *c->e * (size_t)t->n), c->n = c->cap = t->n;
    }
    if (t->nsyms) {
        c->syms = kiln_malloc(sizeof *c->syms * (size_t)t->nsyms);
        if (c->syms) memcpy(c->syms, t->syms, sizeof *c->syms * (size_t)t->nsyms), c->nsyms = c->cap_syms = t->nsyms;
    }
    if ((t->e && !c->e) || (t->nsyms && !c->syms)) {
        kiln_symtab_free(c);
        return kiln_error(KILN_ERR_MEMORY, "out of memory copying a symbol table");
    }
    *out = c;
    return KILN_OK;
}

int32_t kiln_symtab_entries(const kiln_symtab *t) { return t->n; }
int32_t kiln_sym_count(const kiln_symtab *t) { return t->nsyms; }
int64_t kiln_sym_lower(const kiln_symtab *t, int32_t k) { return t->e[t->syms[k]].lower; }
int64_t kiln_sym_hint(const kiln_symtab *t, int32_t k) { return t->e[t->syms[k]].hint; }
kiln_sdim kiln_sym_get(const kiln_symtab *t, int32_t k) { return (kiln_sdim){t->syms[k], t->e[t->syms[k]].hint}; }

void kiln_sym_hints(const kiln_symtab *t, int64_t *out) {
    for (int32_t k = 0; k < t->nsyms; k++) out[k] = t->e[t->syms[k]].hint;
}

static kiln_status push(kiln_symtab *t, const entry *e, int32_t *id) {
    if (t->n >= KILN_SYM_MAX_ENTRIES)
        return kiln_error(KILN_ERR_LIMIT, "symbolic sizes: more than %d expressions in one table", KILN_SYM_MAX_ENTRIES);
    if (t->n >= t->cap) { /* entry 0 is never stored: the first push allocates */
        int32_t ncap = t->cap ? t->cap * 2 : 16;
        entry *grown = kiln_realloc(t->e, sizeof *grown * (size_t)ncap);
        if (!grown) return kiln_error(KILN_ERR_MEMORY, "out of memory growing a symbol table");
        t->e = grown, t->cap = ncap;
    }
    t->e[t->n] = *e;
    *id = t->n++;
    return KILN_OK;
}

kiln_status kiln_sym_new(kiln_symtab *t, int64_t lower, int64_t hint, kiln_sdim *out) {
    if (lower < 0 || hint < lower)
        return kiln_error(KILN_ERR_VALUE, "symbolic sizes: symbol s%d needs 0 <= lower bound (%lld) <= hint (%lld)",
                          t->nsyms, (long long)lower, (long long)hint);
    if (t->nsyms == t->cap_syms) {
        int32_t ncap = t->cap_syms ? t->cap_syms * 2 : 8;
        int32_t *grown = kiln_realloc(t->syms, sizeof *grown * (size_t)ncap);
        if (!grown) return kiln_error(KILN_ERR_MEMORY, "out of memory growing a symbol table");
        t->syms = grown, t->cap_syms = ncap;
    }
    entry e = {.kind = E_SYM, .hint = hint, .sym = t->nsyms, .lower = lower};
    int32_t id = 0;
    KILN_TRY(push(t, &e, &id));
    t->syms[t->nsyms++] = id;
    *out = (kiln_sdim){id, hint};
    return KILN_OK;
}

/* ---- polynomials ---------------------------------------------------------------------------- */

static int term_cmp(const term *a, const term *b) {
    if (a->nf != b->nf) return a->nf > b->nf ? -1 : 1; /* more factors first, constants last */
    for (int32_t k = 0; k < a->nf; k++)
        if (a->f[k] != b->f[k]) return a->f[k] < b->f[k] ? -1 : 1;
    return 0;
}

static void normalize(poly *p) {
    int32_t n = 0;
    for (int32_t k = 0; k < p->nt; k++)
        if (p->t[k].coef != 0) p->t[n++] = p->t[k];
    p->nt = n;
    for (int32_t i = 1; i < n; i++) /* insertion sort: a handful of terms */
        for (int32_t j = i; j > 0 && term_cmp(&p->t[j - 1], &p->t[j]) > 0; j--) {
            term tmp = p->t[j];
            p->t[j] = p->t[j - 1], p->t[j - 1] = tmp;
        }
}

static kiln_status too_large(void) {
    return kiln_error(KILN_ERR_LIMIT, "symbolic sizes: an expression outgrows %d terms of %d factors",
                      KILN_SYM_MAX_TERMS, KILN_SYM_MAX_FACTORS);
}

static kiln_status overflow(void) { return kiln_error(KILN_ERR_LIMIT, "symbolic sizes: a coefficient overflows"); }

/* p += x (a term), merging with the term of the same factors. */
static kiln_status add_term(poly *p, const term *x) {
    if (x->coef == 0) return KILN_OK;
    for (int32_t k = 0; k < p->nt; k++)
        if (term_cmp(&p->t[k], x) == 0) {
            if (__builtin_add_overflow(p->t[k].coef, x->coef, &p->t[k].coef)) return overflow();
            return KILN_OK;
        }
    if (p->nt == KILN_SYM_MAX_TERMS) return too_large();
    p->t[p->nt++] = *x;
    return KILN_OK;
}

static void to_poly(const kiln_symtab *t, kiln_sdim a, poly *p) {
    memset(p, 0, sizeof *p);
    if (a.e == 0) {
        p->nt = a.v != 0;
        p->t[0].coef = a.v;
    } else if (t->e[a.e].kind == E_POLY) {
        *p = t->e[a.e].p;
    } else {
        p->nt = 1;
        p->t[0].coef = 1, p->t[0].nf = 1, p->t[0].f[0] = a.e;
    }
}

static kiln_status eval_entry(const kiln_symtab *t, int32_t e, const int64_t *b, int64_t *out);

static int64_t floordiv(int64_t a, int64_t c) { return a / c - (a % c != 0 && a < 0); }

static kiln_status eval_poly(const kiln_symtab *t, const poly *p, const int64_t *b, int64_t *out) {
    int64_t sum = 0;
    for (int32_t k = 0; k < p->nt; k++) {
        int64_t prod = p->t[k].coef;
        for (int32_t f = 0; f < p->t[k].nf; f++) {
            int64_t x;
            KILN_TRY(eval_entry(t, p->t[k].f[f], b, &x));
            if (__builtin_mul_overflow(prod, x, &prod))
                return kiln_error(KILN_ERR_VALUE, "symbolic sizes: a size overflows");
        }
        if (__builtin_add_overflow(sum, prod, &sum)) return kiln_error(KILN_ERR_VALUE, "symbolic sizes: a size overflows");
    }
    *out = sum;
    return KILN_OK;
}

static kiln_status eval_entry(const kiln_symtab *t, int32_t e, const int64_t *b, int64_t *out) {
    const entry *x = &t->e[e];
    if (x->kind == E_SYM) {
        *out = b ? b[x->sym] : x->hint;
        return KILN_OK;
    }
    if (x->kind == E_FDIV) {
        int64_t n;
        KILN_TRY(eval_entry(t, x->num, b, &n));
        *out = floordiv(n, x->div);
        return KILN_OK;
    }
    return eval_poly(t, &x->p, b, out);
}

kiln_status kiln_sym_eval(const kiln_symtab *t, kiln_sdim a, const int64_t *bindings, int64_t *out) {
    if (a.e == 0) {
        *out = a.v;
        return KILN_OK;
    }
    return eval_entry(t, a.e, bindings, out);
}

static bool poly_equal(const poly *a, const poly *b) {
    if (a->nt != b->nt) return false;
    for (int32_t k = 0; k < a->nt; k++)
        if (a->t[k].coef != b->t[k].coef || term_cmp(&a->t[k], &b->t[k]) != 0) return false;
    return true;
}

/* The entry (or constant) of a normalized p, interned. */
static kiln_status from_poly(kiln_symtab *t, const poly *p, kiln_sdim *out) {
    if (p->nt == 0) {
        *out = kiln_sdim_const(0);
        return KILN_OK;
    }
    if (p->nt == 1 && p->t[0].nf == 0) {
        *out = kiln_sdim_const(p->t[0].coef);
        return KILN_OK;
    }
    if (p->nt == 1 && p->t[0].nf == 1 && p->t[0].coef == 1) {
        *out = (kiln_sdim){p->t[0].f[0], t->e[p->t[0].f[0]].hint};
        return KILN_OK;
    }
    for (int32_t e = 1; e < t->n; e++)
        if (t->e[e].kind == E_POLY && poly_equal(&t->e[e].p, p)) {
            *out = (kiln_sdim){e, t->e[e].hint};
            return KILN_OK;
        }
    entry x = {.kind = E_POLY, .p = *p};
    if (eval_poly(t, p, NULL, &x.hint) != KILN_OK) /* no room for it either: not a wrong size */
        return kiln_error(KILN_ERR_LIMIT, "symbolic sizes: an expression's value at the hints overflows int64");
    int32_t id = 0;
    KILN_TRY(push(t, &x, &id));
    *out = (kiln_sdim){id, x.hint};
    return KILN_OK;
}

kiln_status kiln_sym_add(kiln_symtab *t, kiln_sdim a, kiln_sdim b, kiln_sdim *out) {
    if (a.e == 0 && b.e == 0) {
        int64_t v;
        if (__builtin_add_overflow(a.v, b.v, &v)) return overflow();
        *out = kiln_sdim_const(v);
        return KILN_OK;
    }
    poly p, q;
    to_poly(t, a, &p);
    to_poly(t, b, &q);
    for (int32_t k = 0; k < q.nt; k++) KILN_TRY(add_term(&p, &q.t[k]));
    normalize(&p);
    return from_poly(t, &p, out);
}

kiln_status kiln_sym_mul(kiln_symtab *t, kiln_sdim a, kiln_sdim b, kiln_sdim *out) {
    if (a.e == 0 && b.e == 0) {
        int64_t v;
        if (__builtin_mul_overflow(a.v, b.v, &v)) return overflow();
        *out = kiln_sdim_const(v);
        return KILN_OK;
    }
    poly p, q, r = {0};
    to_poly(t, a, &p);
    to_poly(t, b, &q);
    for (int32_t i = 0; i < p.nt; i++)
        for (int32_t j = 0; j < q.nt; j++) {
            const term *x = &p.t[i], *y = &q.t[j];
            if (x->nf + y->nf > KILN_SYM_MAX_FACTORS) return too_large();
            term z = {0};
            if (__builtin_mul_overflow(x->coef, y->coef, &z.coef)) return overflow();
            int32_t u = 0, v = 0; /* merge the sorted factor lists */
            while (u < x->nf || v < y->nf)
                z.f[z.nf++] = (v >= y->nf || (u < x->nf && x->f[u] <= y->f[v])) ? x->f[u++] : y->f[v++];
            KILN_TRY(add_term(&r, &z));
        }
    normalize(&r);
    return from_poly(t, &r, out);
}

kiln_status kiln_sym_floordiv(kiln_symtab *t, kiln_sdim a, int64_t c, kiln_sdim *out) {
    if (c == 0) return kiln_error(KILN_ERR_VALUE, "symbolic sizes: floor division by zero");
    if (c < 0) { /* floor(a / c) = floor(-a / -c) */
        if (c == INT64_MIN) return overflow();
        kiln_sdim neg;
        KILN_TRY(kiln_sym_mul(t, a, kiln_sdim_const(-1), &neg));
        return kiln_sym_floordiv(t, neg, -c, out);
    }
    if (a.e == 0) {
        *out = kiln_sdim_const(floordiv(a.v, c));
        return KILN_OK;
    }
    if (c == 1) {
        *out = a;
        return KILN_OK;
    }
    /* floor((c*A + B) / c) = A + floor(B / c): the terms c divides leave the division */
    poly p, whole = {0}, rest = {0};
    to_poly(t, a, &p);
    for (int32_t k = 0; k < p.nt; k++) {
        term x = p.t[k];
        if (x.coef % c == 0) {
            x.coef /= c;
            whole.t[whole.nt++] = x;
        } else {
            rest.t[rest.nt++] = x;
        }
    }
    kiln_sdim w, r;
    KILN_TRY(from_poly(t, &whole, &w));
    KILN_TRY(from_poly(t, &rest, &r));
    if (r.e == 0) {
        r = kiln_sdim_const(floordiv(r.v, c));
    } else {
        entry x = {.kind = E_FDIV, .num = r.e, .div = c};
        if (t->e[r.e].kind == E_FDIV) { /* floor(floor(n / d) / c) = floor(n / (d * c)) */
            x.num = t->e[r.e].num;
            if (__builtin_mul_overflow(t->e[r.e].div, c, &x.div)) return overflow();
        }
        int32_t id = 0;
        for (int32_t e = 1; e < t->n && !id; e++)
            if (t->e[e].kind == E_FDIV && t->e[e].num == x.num && t->e[e].div == x.div) id = e;
        if (!id) {
            KILN_TRY(eval_entry(t, x.num, NULL, &x.hint));
            x.hint = floordiv(x.hint, x.div);
            KILN_TRY(push(t, &x, &id));
        }
        r = (kiln_sdim){id, t->e[id].hint};
    }
    return kiln_sym_add(t, w, r, out);
}

kiln_status kiln_sym_sub(kiln_symtab *t, kiln_sdim a, kiln_sdim b, kiln_sdim *out) {
    kiln_sdim nb;
    KILN_TRY(kiln_sym_mul(t, b, kiln_sdim_const(-1), &nb));
    return kiln_sym_add(t, a, nb, out);
}

kiln_status kiln_sym_mod(kiln_symtab *t, kiln_sdim a, int64_t c, kiln_sdim *out) {
    if (c == 0) return kiln_error(KILN_ERR_VALUE, "symbolic sizes: modulo by zero");
    if (a.e == 0) { /* Python's %: the sign of c */
        if (c == -1) {
            *out = kiln_sdim_const(0);
            return KILN_OK;
        }
        int64_t r = a.v % c;
        *out = kiln_sdim_const(r != 0 && (r < 0) != (c < 0) ? r + c : r);
        return KILN_OK;
    }
    kiln_sdim q, cq; /* a - c * (a // c) */
    KILN_TRY(kiln_sym_floordiv(t, a, c, &q));
    KILN_TRY(kiln_sym_mul(t, q, kiln_sdim_const(c), &cq));
    return kiln_sym_sub(t, a, cq, out);
}

/* The entry (or constant) of src's entry e in dst, each symbol k replaced by map[k]. */
static kiln_status subst_entry(kiln_symtab *dst, const kiln_symtab *src, int32_t e, const kiln_sdim *map,
                               kiln_sdim *out) {
    entry copy = src->e[e]; /* dst may be src: its entries move as it grows */
    const entry *x = &copy;
    if (x->kind == E_SYM) {
        if (map[x->sym].e < 0) return kiln_error(KILN_ERR_VALUE, "symbolic sizes: symbol s%d has no value here", x->sym);
        *out = map[x->sym];
        return KILN_OK;
    }
    if (x->kind == E_FDIV) {
        kiln_sdim n;
        KILN_TRY(subst_entry(dst, src, x->num, map, &n));
        return kiln_sym_floordiv(dst, n, x->div, out);
    }
    kiln_sdim sum = kiln_sdim_const(0);
    for (int32_t k = 0; k < x->p.nt; k++) {
        kiln_sdim prod = kiln_sdim_const(x->p.t[k].coef);
        for (int32_t f = 0; f < x->p.t[k].nf; f++) {
            kiln_sdim a;
            KILN_TRY(subst_entry(dst, src, x->p.t[k].f[f], map, &a));
            KILN_TRY(kiln_sym_mul(dst, prod, a, &prod));
        }
        KILN_TRY(kiln_sym_add(dst, sum, prod, &sum));
    }
    *out = sum;
    return KILN_OK;
}

kiln_status kiln_sym_subst(kiln_symtab *dst, const kiln_symtab *src, kiln_sdim a, const kiln_sdim *map,
                           kiln_sdim *out) {
    if (a.e == 0) {
        *out = a;
        return KILN_OK;
    }
    return subst_entry(dst, src, a.e, map, out);
}

int32_t kiln_sym_symbol_of(const kiln_symtab *t, kiln_sdim a) {
    return a.e != 0 && t->e[a.e].kind == E_SYM ? t->e[a.e].sym : -1;
}

kiln_status kiln_sym_divexact(kiln_symtab *t, kiln_sdim a, kiln_sdim b, kiln_sdim *out) {
    poly p, q, r = {0};
    to_poly(t, a, &p);
    to_poly(t, b, &q);
    if (q.nt != 1 || q.t[0].coef <= 0) return kiln_error(KILN_ERR_VALUE, "symbolic sizes: division by a sum or a size <= 0");
    const term *d = &q.t[0];
    for (int32_t k = 0; k < p.nt; k++) {
        term x = p.t[k], z = {0};
        if (x.coef % d->coef != 0) return kiln_error(KILN_ERR_VALUE, "symbolic sizes: an inexact division");
        z.coef = x.coef / d->coef;
        int32_t j = 0; /* the sorted factors of x without those of d */
        for (int32_t f = 0; f < x.nf; f++) {
            if (j < d->nf && x.f[f] == d->f[j]) j++;
            else z.f[z.nf++] = x.f[f];
        }
        if (j != d->nf) return kiln_error(KILN_ERR_VALUE, "symbolic sizes: an inexact division");
        r.t[r.nt++] = z;
    }
    normalize(&r);
    return from_poly(t, &r, out);
}

/* ---- bounds, uses, text --------------------------------------------------------------------- */

static int64_t lower_entry(const kiln_symtab *t, int32_t e);

/* The lower bound of p's terms with positive coefficients and its constant; INT64_MIN when a term
 * on atoms has a negative coefficient or an atom may be negative. */
static int64_t lower_plain(const kiln_symtab *t, const poly *p) {
    int64_t sum = 0;
    for (int32_t k = 0; k < p->nt; k++) {
        const term *y = &p->t[k];
        int64_t prod = y->coef;
        if (y->nf > 0 && prod < 0) return INT64_MIN;
        for (int32_t f = 0; f < y->nf; f++) {
            int64_t b = lower_entry(t, y->f[f]);
            if (b < 0 || __builtin_mul_overflow(prod, b, &prod)) return INT64_MIN;
        }
        if (__builtin_add_overflow(sum, prod, &sum)) return INT64_MIN;
    }
    return sum;
}

/* A lower bound of p. Terms -k * floor(N / c) (N >= 0) are bounded by -k * N / c: with L the product
 * of those c, L * p >= q = L * (the other terms) - sum of k * (L / c) * N, so p >= ceil(lb(q) / L)
 * (s1 - s1 // 2 >= s1 / 2 >= 1 for s1 >= 2). */
static int64_t lower_poly(const kiln_symtab *t, const poly *p) {
    int64_t plain = lower_plain(t, p);
    if (plain != INT64_MIN) return plain;
    int64_t L = 1;
    for (int32_t k = 0; k < p->nt; k++) {
        const term *y = &p->t[k];
        if (y->nf == 0 || y->coef > 0) continue;
        const entry *x = y->nf == 1 ? &t->e[y->f[0]] : NULL;
        if (!x || x->kind != E_FDIV || lower_entry(t, x->num) < 0) return INT64_MIN;
        if (L % x->div != 0 && __builtin_mul_overflow(L, x->div, &L)) return INT64_MIN;
    }
    poly q = {0};
    for (int32_t k = 0; k < p->nt; k++) {
        term y = p->t[k];
        if (y.nf == 0 || y.coef > 0) {
            if (__builtin_mul_overflow(y.coef, L, &y.coef) || add_term(&q, &y) != KILN_OK) return kiln_clear_error(), INT64_MIN;
            continue;
        }
        const entry *x = &t->e[y.f[0]];
        poly n;
        to_poly(t, (kiln_sdim){x->num, 0}, &n);
        int64_t scale;
        if (__builtin_mul_overflow(y.coef, L / x->div, &scale)) return INT64_MIN;
        for (int32_t j = 0; j < n.nt; j++) {
            term z = n.t[j];
            if (__builtin_mul_overflow(z.coef, scale, &z.coef) || add_term(&q, &z) != KILN_OK)
                return kiln_clear_error(), INT64_MIN;
        }
    }
    normalize(&q);
    int64_t lq = lower_plain(t, &q);
    if (lq == INT64_MIN) return lq;
    return lq / L + (lq % L > 0); /* ceil */
}

static int64_t lower_entry(const kiln_symtab *t, int32_t e) {
    const entry *x = &t->e[e];
    if (x->kind == E_SYM) return x->lower;
    if (x->kind == E_FDIV) {
        int64_t n = lower_entry(t, x->num);
        return n == INT64_MIN ? n : floordiv(n, x->div);
    }
    return lower_poly(t, &x->p);
}

int64_t kiln_sym_lower_bound(const kiln_symtab *t, kiln_sdim a) { return a.e == 0 ? a.v : lower_entry(t, a.e); }

static bool uses_entry(const kiln_symtab *t, int32_t e, int32_t k) {
    const entry *x = &t->e[e];
    if (x->kind == E_SYM) return x->sym == k;
    if (x->kind == E_FDIV) return uses_entry(t, x->num, k);
    for (int32_t i = 0; i < x->p.nt; i++)
        for (int32_t f = 0; f < x->p.t[i].nf; f++)
            if (uses_entry(t, x->p.t[i].f[f], k)) return true;
    return false;
}

bool kiln_sym_uses(const kiln_symtab *t, kiln_sdim a, int32_t k) { return a.e != 0 && uses_entry(t, a.e, k); }

static void print_entry(kiln_strbuf *b, const kiln_symtab *t, int32_t e, bool factor, const char *const *names);

static void print_poly(kiln_strbuf *b, const kiln_symtab *t, const poly *p, const char *const *names) {
    for (int32_t k = 0; k < p->nt; k++) {
        const term *x = &p->t[k];
        int64_t c = x->coef;
        if (x->nf == 0) {
            kiln_strbuf_printf(b, k && c >= 0 ? "+%lld" : "%lld", (long long)c);
            continue;
        }
        if (c < 0) kiln_strbuf_printf(b, "-");
        else if (k) kiln_strbuf_printf(b, "+");
        /* a floor division is parenthesized in a product or after a minus ("-((-s0)//2)", not
         * "-(-s0)//2", which reads as (s0)//2) */
        bool many = x->nf > 1 || c != 1;
        for (int32_t f = 0; f < x->nf; f++) {
            if (f) kiln_strbuf_printf(b, "*");
            print_entry(b, t, x->f[f], many, names);
        }
        if (c != 1 && c != -1) kiln_strbuf_printf(b, "*%lld", (long long)(c < 0 ? -(unsigned long long)c : (unsigned long long)c));
    }
}

/* factor: a floor division inside a product is parenthesized ("s1*(s0//2)"). */
static void print_entry(kiln_strbuf *b, const kiln_symtab *t, int32_t e, bool factor, const char *const *names) {
    const entry *x = &t->e[e];
    if (x->kind == E_SYM) {
        if (names && names[x->sym]) kiln_strbuf_printf(b, "%s", names[x->sym]);
        else kiln_strbuf_printf(b, "s%d", x->sym);
    } else if (x->kind == E_FDIV) {
        bool wrap = t->e[x->num].kind == E_POLY;
        kiln_strbuf_printf(b, "%s%s", factor ? "(" : "", wrap ? "(" : "");
        print_entry(b, t, x->num, false, names);
        kiln_strbuf_printf(b, "%s//%lld%s", wrap ? ")" : "", (long long)x->div, factor ? ")" : "");
    } else {
        if (factor) kiln_strbuf_printf(b, "(");
        print_poly(b, t, &x->p, names);
        if (factor) kiln_strbuf_printf(b, ")");
    }
}

void kiln_sym_print_named(kiln_strbuf *b, const kiln_symtab *t, kiln_sdim a, const char *const *names) {
    if (a.e == 0) kiln_strbuf_printf(b, "%lld", (long long)a.v);
    else print_entry(b, t, a.e, false, names);
}

void kiln_sym_print(kiln_strbuf *b, const kiln_symtab *t, kiln_sdim a) { kiln_sym_print_named(b, t, a, NULL); }

void kiln_sshape_print(kiln_strbuf *b, const kiln_symtab *t, const kiln_sshape *s) {
    kiln_strbuf_printf(b, "(");
    for (int d = 0; d < s->ndim; d++) {
        if (d) kiln_strbuf_printf(b, ", ");
        kiln_sym_print(b, t, s->d[d]);
    }
    kiln_strbuf_printf(b, s->ndim == 1 ? ",)" : ")");
}
