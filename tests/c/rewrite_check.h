/* Helpers of the C tests of graph passes: random inputs, the canonical text of a graph, and
 * "these passes turn this text into that text" with the test's own check that the rewritten
 * graph computes what the input does. */
#ifndef KILN_TEST_REWRITE_CHECK_H
#define KILN_TEST_REWRITE_CHECK_H

#include "check.h"
#include "core/internal.h"
#include "kiln/graph.h"
#include "kiln/passes.h"

static uint64_t rc_rng_state = 0x9e3779b97f4a7c15ull;

static inline double rc_rnd(void) {
    rc_rng_state ^= rc_rng_state << 13, rc_rng_state ^= rc_rng_state >> 7, rc_rng_state ^= rc_rng_state << 17;
    return (double)(rc_rng_state >> 11) / 9007199254740992.0;
}

static inline int rc_rnd_int(int n) { return (int)(rc_rnd() * n) % n; }

/* Values in [-2, 2) for floats, small integers (-3..3) otherwise, 0/1 for bool. */
static inline kiln_tensor *rc_random_tensor(const kiln_meta *m) {
    kiln_tensor *t = NULL, *src = NULL;
    if (kiln_tensor_empty(KILN_DTYPE_FLOAT64, m->ndim, m->shape, &src) != KILN_OK ||
        kiln_tensor_empty(m->dtype, m->ndim, m->shape, &t) != KILN_OK) {
        fprintf(stderr, "random_tensor: %s\n", kiln_last_error());
        exit(2);
    }
    for (int64_t i = 0; i < src->numel; i++) {
        double v = kiln_dtype_is_float(m->dtype) ? 4 * rc_rnd() - 2 : (double)(rc_rnd_int(7) - 3);
        ((double *)src->data)[i] = m->dtype == KILN_DTYPE_BOOL ? (double)(v > 0) : v;
    }
    if (kiln_copy_into(t, src) != KILN_OK) exit(2);
    kiln_tensor_release(src);
    return t;
}

/* Whether a and b hold the same values (within float tolerance; NaNs match). */
static inline int rc_same_values(const kiln_tensor *a, const kiln_tensor *b) {
    if (a->meta.dtype != b->meta.dtype || a->numel != b->numel) return 0;
    for (int64_t i = 0; i < a->numel; i++) {
        double x = kiln_tensor_get_double(a, i), y = kiln_tensor_get_double(b, i);
        if ((x != x && y != y) || x == y) continue;
        if (!(fabs(x - y) <= 1e-5 * (1 + fabs(y)))) {
            fprintf(stderr, "  element %lld: %g vs %g\n", (long long)i, x, y);
            return 0;
        }
    }
    return 1;
}

/* Runs both graphs `runs` times (same random inputs, same random seed) and compares their outputs
 * (rc_same_values); 1 when they agree. */
static inline int rc_same_results(const kiln_graph *a, const kiln_graph *b, int runs) {
    kiln_compile_options copt = {KILN_ORDER_BFS, true, "kbk"};
    kiln_executable *ea = NULL, *eb = NULL;
    int ok = kiln_compile(a, &copt, &ea) == KILN_OK && kiln_compile(b, &copt, &eb) == KILN_OK;
    if (!ok) fprintf(stderr, "compile failed: %s\n", kiln_last_error());
    for (int run = 0; run < runs && ok; run++) {
        kiln_tensor *in[16] = {0}, *oa[16] = {0}, *ob[16] = {0};
        int nin = a->ninputs, nout = a->noutputs;
        if (nin > 16 || nout > 16 || b->ninputs != nin || b->noutputs != nout) return 0;
        for (int k = 0; k < nin; k++) in[k] = rc_random_tensor(&a->values[a->inputs[k]].meta);
        kiln_manual_seed(42 + (uint64_t)run);
        kiln_status sa = kiln_executable_run(ea, nin, in, nout, oa);
        kiln_manual_seed(42 + (uint64_t)run);
        kiln_status sb = kiln_executable_run(eb, nin, in, nout, ob);
        ok = sa == sb;
        if (!ok) fprintf(stderr, "  statuses differ: %d vs %d (%s)\n", (int)sa, (int)sb, kiln_last_error());
        for (int k = 0; k < nout && ok && sa == KILN_OK; k++) ok = rc_same_values(oa[k], ob[k]);
        kiln_release_all(in, nin), kiln_release_all(oa, nout), kiln_release_all(ob, nout);
    }
    kiln_executable_free(ea), kiln_executable_free(eb);
    return ok;
}

/* The canonical form of graph text: ids renumbered in order of first appearance (which is the
 * order of definition; each "subgraph" starts afresh), malloc'd; NULL when the text does not
 * parse. Renumbered as text, not printed again: a parsed bare "constant" is zeros, so reprinting
 * would turn a folded constant's "constant" into "constant(0)". */
static inline char *rc_canon(const char *text) {
    kiln_graph *g = NULL;
    if (kiln_graph_parse(text, &g) != KILN_OK) {
        fprintf(stderr, "parse failed: %s\n%s", kiln_last_error(), text);
        return NULL;
    }
    kiln_graph_free(g);
    size_t n = strlen(text), len = 0;
    char *out = malloc(2 * n + 1);
    long *seen = malloc(sizeof(long) * (n + 1));
    int nseen = 0;
    for (size_t i = 0; out && seen && i < n;) {
        if (strncmp(text + i, "subgraph ", 9) == 0 && (i == 0 || text[i - 1] == '\n')) nseen = 0;
        if (text[i] == '%' && i + 1 < n && text[i + 1] >= '0' && text[i + 1] <= '9') {
            char *end;
            long id = strtol(text + i + 1, &end, 10);
            int k = 0;
            while (k < nseen && seen[k] != id) k++;
            if (k == nseen) seen[nseen++] = id;
            len += (size_t)sprintf(out + len, "%%%d", k);
            i = (size_t)(end - text);
        } else {
            out[len++] = text[i++];
        }
    }
    if (out) out[len] = '\0';
    free(seen);
    return out;
}

/* The test's check that `rewritten` computes what `orig` does (prints what differs; 1 when same). */
typedef int (*rc_same_fn)(const kiln_graph *orig, const kiln_graph *rewritten);

/* Runs the comma-separated passes on the parsed input; the result must print as `want` (which
 * must be canonical; NULL: the passes leave the graph unchanged) and pass `same`. */
static inline void rc_expect_rewrite_at(int line, const char *passes, const kiln_pass_options *opt, const char *input,
                                        const char *want, rc_same_fn same) {
    kiln_graph *g = NULL, *orig = NULL;
    if (kiln_graph_parse(input, &g) != KILN_OK || kiln_graph_parse(input, &orig) != KILN_OK) {
        fprintf(stderr, "line %d: input does not parse: %s\n", line, kiln_last_error());
        check_failures++;
        kiln_graph_free(g), kiln_graph_free(orig);
        return;
    }
    char *before = kiln_graph_to_string(g), names[128];
    snprintf(names, sizeof names, "%s", passes);
    for (char *name = strtok(names, ","); name; name = strtok(NULL, ","))
        if (kiln_run_pass(name, &g, opt) != KILN_OK) {
            fprintf(stderr, "line %d: pass %s failed: %s\n", line, name, kiln_last_error());
            check_failures++;
        }
    char *printed = kiln_graph_to_string(g), *got = printed ? rc_canon(printed) : NULL;
    char *want_canon = want ? rc_canon(want) : NULL;
    if (want && (!want_canon || strcmp(want_canon, want) != 0)) {
        fprintf(stderr, "line %d: the expected text is not canonical; canonical form:\n%s", line,
                want_canon ? want_canon : "?");
        check_failures++;
    }
    const char *expected = want ? want : before;
    if (!got || strcmp(got, expected) != 0) {
        fprintf(stderr, "line %d: after %s\n--- got:\n%s--- want:\n%s", line, passes, got ? got : "?\n", expected);
        check_failures++;
    }
    if (!same(orig, g)) {
        fprintf(stderr, "line %d: the rewritten graph computes something else\n", line);
        check_failures++;
    }
    free(before), free(printed), free(got), free(want_canon);
    kiln_graph_free(g), kiln_graph_free(orig);
}

#endif
