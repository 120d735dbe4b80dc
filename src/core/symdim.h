/* Symbolic sizes: a table of size symbols (each with a lower bound and the hint, its size where
 * the graph was recorded) and of expressions over them: sums, products and floor division by a
 * positive constant, kept in one canonical form (a sum of terms, each an integer coefficient
 * times a sorted product of atoms: symbols and floor divisions), so that two equal expressions
 * built in any order are the same entry. A graph owns one table (kiln_graph.syms); the op
 * table's symbolic shape rules (src/ops/infer_sym.c) build expressions in it.
 *
 * A size is a kiln_sdim: e == 0, the constant v; e > 0, entry e of the table, v its hint (the
 * expression evaluated at the symbols' hints). */
#ifndef KILN_SYMDIM_H
#define KILN_SYMDIM_H

#include "internal.h"
#include "strbuf.h"

#define KILN_SYM_MAX_TERMS 8     /* terms of one expression */
#define KILN_SYM_MAX_FACTORS 8   /* atoms in one term */
#define KILN_SYM_MAX_ENTRIES 4096 /* entries of one table */

typedef struct kiln_sdim {
    int32_t e;
    int64_t v;
} kiln_sdim;

/* A shape whose sizes may be symbolic. */
typedef struct kiln_sshape {
    int32_t ndim;
    kiln_sdim d[KILN_MAX_DIMS];
} kiln_sshape;

typedef struct kiln_symtab kiln_symtab;

kiln_status kiln_symtab_new(kiln_symtab **out);
void kiln_symtab_free(kiln_symtab *t);
kiln_status kiln_symtab_clone(const kiln_symtab *t, kiln_symtab **out);
/* Entries so far (valid e: 1 .. count - 1). */
int32_t kiln_symtab_entries(const kiln_symtab *t);

/* A new symbol s<k>, k = kiln_sym_count before the call: sizes >= lower (>= 0), hint >= lower. */
kiln_status kiln_sym_new(kiln_symtab *t, int64_t lower, int64_t hint, kiln_sdim *out);
int32_t kiln_sym_count(const kiln_symtab *t);
int64_t kiln_sym_lower(const kiln_symtab *t, int32_t k);
int64_t kiln_sym_hint(const kiln_symtab *t, int32_t k);
/* Symbol k as a size. */
kiln_sdim kiln_sym_get(const kiln_symtab *t, int32_t k);
/* The hints of every symbol (kiln_sym_count of them) into out. */
void kiln_sym_hints(const kiln_symtab *t, int64_t *out);

static inline kiln_sdim kiln_sdim_const(int64_t v) { return (kiln_sdim){0, v}; }
static inline bool kiln_sdim_is_const(kiln_sdim a) { return a.e == 0; }
/* Equal as expressions (entries are canonical: the same expression is one entry). */
static inline bool kiln_sdim_same(kiln_sdim a, kiln_sdim b) { return a.e == b.e && (a.e != 0 || a.v == b.v); }

/* a + b, a - b, a * b, floor(a / c) and a % c (Python's: the sign of c; a - c * (a // c)) for a
 * constant c != 0 (KILN_ERR_VALUE for 0). KILN_ERR_LIMIT when the result outgrows the limits above
 * a coefficient or the value at the hints overflows: nothing is wrong with the sizes, the table
 * has no room for the expression (a caller may treat its sizes as constants). */
kiln_status kiln_sym_add(kiln_symtab *t, kiln_sdim a, kiln_sdim b, kiln_sdim *out);
kiln_status kiln_sym_sub(kiln_symtab *t, kiln_sdim a, kiln_sdim b, kiln_sdim *out);
kiln_status kiln_sym_mul(kiln_symtab *t, kiln_sdim a, kiln_sdim b, kiln_sdim *out);
kiln_status kiln_sym_floordiv(kiln_symtab *t, kiln_sdim a, int64_t c, kiln_sdim *out);
kiln_status kiln_sym_mod(kiln_symtab *t, kiln_sdim a, int64_t c, kiln_sdim *out);
/* a (an expression of src) rebuilt in dst with src's symbol k replaced by map[k] (a size of dst; e < 0:
 * none, KILN_ERR_VALUE when a uses it): copies an expression between tables, or fixes symbols. */
kiln_status kiln_sym_subst(kiln_symtab *dst, const kiln_symtab *src, kiln_sdim a, const kiln_sdim *map,
                           kiln_sdim *out);
/* k when a is the lone symbol s<k>, else -1. */
int32_t kiln_sym_symbol_of(const kiln_symtab *t, kiln_sdim a);

/* a / b where b divides a as expressions (b a product of atoms times a constant dividing every
 * coefficient of a's terms, whose atoms each term holds): s0*s1*64 / (s1*8) = s0*8; KILN_ERR_VALUE
 * otherwise (the division would not be exact at every binding). */
kiln_status kiln_sym_divexact(kiln_symtab *t, kiln_sdim a, kiln_sdim b, kiln_sdim *out);
/* The smallest value a can take given the symbols' lower bounds; INT64_MIN when not known (a
 * term with a negative coefficient on symbols). */
int64_t kiln_sym_lower_bound(const kiln_symtab *t, kiln_sdim a);
/* a's value with symbol k bound to bindings[k]; KILN_ERR_VALUE on overflow. */
kiln_status kiln_sym_eval(const kiln_symtab *t, kiln_sdim a, const int64_t *bindings, int64_t *out);
/* Whether a's value depends on symbol k. */
bool kiln_sym_uses(const kiln_symtab *t, kiln_sdim a, int32_t k);
/* Text of a: "64", "s0", "s0*64", "s0+s1-1", "(s0+1)//2" (parsed back by src/ir/parse.c). */
void kiln_sym_print(kiln_strbuf *b, const kiln_symtab *t, kiln_sdim a);
/* The same with symbol k written names[k] ("s<k>" where names or names[k] is NULL). */
void kiln_sym_print_named(kiln_strbuf *b, const kiln_symtab *t, kiln_sdim a, const char *const *names);
/* "(s0, 64)" ("(s0,)" for one dimension, like kiln_shape_str). */
void kiln_sshape_print(kiln_strbuf *b, const kiln_symtab *t, const kiln_sshape *s);

#endif
