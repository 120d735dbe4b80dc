/* kiln_sublinear_optimize: which values to recompute, searched as MegEngine's
 * SublinearMemoryConfig does (see include/kiln/sublinear.h). A candidate is a sorted list of split
 * points (node indices ending blocks; the last node always ends one). Chen's greedy makes one from
 * a threshold: walking the nodes, a block ends when the bytes made in it and still alive reach
 * the threshold. Thresholds are tried halving from the baseline peak, then thresh_nr_try of them
 * evenly below it, then thresh_nr_try around the best. genetic_nr_iter rounds then breed the
 * candidates (tournament selection, mutations that insert, remove or move a split point, one-point
 * crossover; a fixed seed). Every candidate is rewritten by kiln_recompute_rewrite and scored by
 * kiln_plan_arena_bytes, the planner's own arena size, on num_worker threads; candidates are made in
 * one thread and their scores merged in a fixed order, so the result does not depend on the
 * number of threads. The plan chosen is the one with the fewest recomputed FLOPs among those
 * whose peak is within PEAK_SLACK of the lowest (and, after genetic rounds, no higher than the
 * greedy search's choice); with lb_memory above that, among those whose peak is at most
 * lb_memory. Last, split points are added at the costliest recomputed nodes while the peak stays
 * within that bound. Before searching, in-place updates are moved to just after their
 * gradients (kiln_hoist_updates), which the baseline candidate and every other one share. */
#include "plan.h"

#include "kiln/sublinear.h"

typedef struct {
    int32_t *sp, n;
    int64_t thresh; /* the threshold that made it, or -1 */
    size_t peak;
    int64_t flops;
    int32_t ops;
    kiln_status s;
} candidate;

typedef struct {
    const kiln_graph *g;
    kiln_exec_order order;
    int32_t nn;
    int64_t lb;
    int64_t *bytes;       /* per value: bytes of its own buffer (0 for views and aliases) */
    int32_t *last_reader; /* per value: the last node reading it, or -1 */
    uint64_t rng;
    int32_t scored;
} search;

static uint64_t next_random(search *S) { /* xorshift64* */
    uint64_t x = S->rng;
    x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
    S->rng = x;
    return x * 0x2545F4914F6CDD1DULL;
}

static int compare_sp(const candidate *a, const candidate *b) {
    if (a->n != b->n) return a->n < b->n ? -1 : 1;
    for (int32_t k = 0; k < a->n; k++)
        if (a->sp[k] != b->sp[k]) return a->sp[k] < b->sp[k] ? -1 : 1;
    return 0;
}

/* <0 when a is the better plan */
static int compare(const search *S, const candidate *a, const candidate *b) {
    if ((a->s == KILN_OK) != (b->s == KILN_OK)) return a->s == KILN_OK ? -1 : 1;
    bool ga = S->lb > 0 && (int64_t)a->peak <= S->lb, gb = S->lb > 0 && (int64_t)b->peak <= S->lb;
    if (ga != gb) return ga ? -1 : 1;
    if (!ga && a->peak != b->peak) return a->peak < b->peak ? -1 : 1;
    if (a->flops != b->flops) return a->flops < b->flops ? -1 : 1;
    if (a->peak != b->peak) return a->peak < b->peak ? -1 : 1;
    return compare_sp(a, b);
}

/* blocks of a candidate: block[i] = the index of the first split point >= i */
static kiln_status blocks_of(const search *S, const candidate *c, int32_t **block, bool **endpoint) {
    *block = kiln_malloc(sizeof(int32_t) * (size_t)(S->nn ? S->nn : 1));
    *endpoint = kiln_calloc((size_t)(S->nn ? S->nn : 1), sizeof(bool));
    if (!*block || !*endpoint) return kiln_error(KILN_ERR_MEMORY, "out of memory searching checkpoints");
    int32_t k = 0;
    for (int32_t i = 0; i < S->nn; i++) {
        while (k < c->n && c->sp[k] < i) k++;
        (*block)[i] = k;
        if (k < c->n && c->sp[k] == i) (*endpoint)[i] = true;
    }
    return KILN_OK;
}

/* Rewrites and plans candidate c (thread-safe: reads S, writes c). recomputed: optional. */
static void score(const search *S, candidate *c, bool *recomputed) {
    int32_t *block = NULL;
    bool *endpoint = NULL;
    kiln_graph *out = NULL;
    kiln_recompute_stats st = {0};
    c->s = blocks_of(S, c, &block, &endpoint);
    if (c->s == KILN_OK) c->s = kiln_recompute_rewrite(S->g, block, endpoint, &out, &st, recomputed);
    if (c->s == KILN_OK) c->s = kiln_plan_arena_bytes(out ? out : S->g, S->order, &c->peak);
    c->flops = st.extra_flops;
    c->ops = st.recomputed_ops;
    kiln_graph_free(out);
    free(block), free(endpoint);
}

static void score_all(search *S, candidate *cs, int32_t n, int workers) {
#pragma omp parallel for num_threads(workers) schedule(dynamic, 1)
    for (int32_t k = 0; k < n; k++) score(S, &cs[k], NULL);
    S->scored += n;
}

static kiln_status make(candidate *c, int32_t n) {
    memset(c, 0, sizeof *c);
    c->thresh = -1;
    c->sp = kiln_malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    return c->sp ? KILN_OK : kiln_error(KILN_ERR_MEMORY, "out of memory searching checkpoints");
}

static kiln_status copy_candidate(candidate *dst, const candidate *src) {
    KILN_TRY(make(dst, src->n));
    memcpy(dst->sp, src->sp, sizeof(int32_t) * (size_t)src->n);
    dst->n = src->n, dst->thresh = src->thresh, dst->peak = src->peak, dst->flops = src->flops;
    dst->ops = src->ops, dst->s = src->s;
    return KILN_OK;
}

/* Chen's greedy: a block ends where the bytes made in it and still alive reach thresh. */
static kiln_status from_threshold(const search *S, int64_t thresh, candidate *c) {
    KILN_TRY(make(c, S->nn));
    const kiln_graph *g = S->g;
    bool *alive = kiln_calloc((size_t)(g->nvalues ? g->nvalues : 1), sizeof(bool));
    if (!alive) return kiln_error(KILN_ERR_MEMORY, "out of memory searching checkpoints");
    int64_t usage = 0;
    for (int32_t i = 0; i < S->nn; i++) {
        const kiln_node *n = &g->nodes[i];
        for (int k = 0; k < n->nout; k++) {
            alive[n->out[k]] = true;
            usage += S->bytes[n->out[k]];
        }
        for (int k = 0; k < n->nin; k++)
            if (S->last_reader[n->in[k]] == i && alive[n->in[k]]) {
                alive[n->in[k]] = false;
                usage -= S->bytes[n->in[k]];
            }
        if (i + 1 < S->nn && usage < thresh) continue;
        c->sp[c->n++] = i;
        usage = 0;
        memset(alive, 0, sizeof(bool) * (size_t)g->nvalues);
    }
    free(alive);
    c->thresh = thresh;
    return KILN_OK;
}

static kiln_status mutate(search *S, const candidate *a, candidate *c) {
    KILN_TRY(make(c, a->n + 1));
    int32_t p = (int32_t)(next_random(S) % (uint64_t)a->n), kind = (int32_t)(next_random(S) % 4);
    for (int32_t k = 0; k < a->n; k++) {
        int32_t lo = k > 0 ? a->sp[k - 1] + 1 : 0;
        bool last = k == a->n - 1;
        if (k != p || kind == 3) {
            c->sp[c->n++] = a->sp[k];
        } else if (kind == 0) { /* insert one before it */
            if (a->sp[k] > lo) c->sp[c->n++] = lo + (int32_t)(next_random(S) % (uint64_t)(a->sp[k] - lo));
            c->sp[c->n++] = a->sp[k];
        } else if (kind == 1) { /* remove it (never the last node) */
            if (last) c->sp[c->n++] = a->sp[k];
        } else { /* move it between its neighbours */
            if (last) c->sp[c->n++] = a->sp[k];
            else c->sp[c->n++] = lo + (int32_t)(next_random(S) % (uint64_t)(a->sp[k + 1] - lo));
        }
    }
    return KILN_OK;
}

static kiln_status crossover(search *S, const candidate *a, const candidate *b, candidate *c) {
    KILN_TRY(make(c, a->n + b->n));
    int32_t cut = (int32_t)(next_random(S) % (uint64_t)(S->nn > 1 ? S->nn : 1));
    for (int32_t k = 0; k < a->n; k++)
        if (a->sp[k] < cut) c->sp[c->n++] = a->sp[k];
    for (int32_t k = 0; k < b->n; k++)
        if (b->sp[k] >= cut) c->sp[c->n++] = b->sp[k];
    return KILN_OK;
}

/* a growing list of scored candidates */
typedef struct {
    candidate *c;
    int32_t n, cap;
} pool;

static kiln_status pool_room(pool *p, int32_t more) {
    if (p->n + more <= p->cap) return KILN_OK;
    int32_t cap = (p->n + more) * 2;
    candidate *grown = kiln_realloc(p->c, sizeof *grown * (size_t)cap);
    if (!grown) return kiln_error(KILN_ERR_MEMORY, "out of memory searching checkpoints");
    p->c = grown, p->cap = cap;
    return KILN_OK;
}

static void pool_clear(pool *p) {
    for (int32_t k = 0; k < p->n; k++) free(p->c[k].sp);
    p->n = 0;
}

/* Scores p->c[from..]; a candidate that fails (out of memory) loses every comparison. */
static kiln_status score_from(search *S, pool *p, int32_t from, int workers) {
    score_all(S, p->c + from, p->n - from, workers);
    return KILN_OK;
}

static kiln_status add_thresholds(search *S, pool *p, const int64_t *th, int32_t n, int workers) {
    int32_t from = p->n;
    KILN_TRY(pool_room(p, n));
    for (int32_t k = 0; k < n; k++) {
        KILN_TRY(from_threshold(S, th[k] > 0 ? th[k] : 1, &p->c[p->n]));
        p->n++;
    }
    return score_from(S, p, from, workers);
}

static int32_t best_of(const search *S, const pool *p) {
    int32_t b = 0;
    for (int32_t k = 1; k < p->n; k++)
        if (compare(S, &p->c[k], &p->c[b]) < 0) b = k;
    return b;
}

/* The plan chosen from p: the fewest FLOPs among those whose peak is at most `bound` (ties: the
 * lower peak, then the smaller split list); -1 when none is. */
static int32_t cheapest_under(const pool *p, size_t bound) {
    int32_t b = -1;
    for (int32_t k = 0; k < p->n; k++) {
        const candidate *c = &p->c[k];
        if (c->s != KILN_OK || c->peak > bound) continue;
        if (b < 0 || c->flops < p->c[b].flops ||
            (c->flops == p->c[b].flops && (c->peak < p->c[b].peak || (c->peak == p->c[b].peak && compare_sp(c, &p->c[b]) < 0))))
            b = k;
    }
    return b;
}

/* Peaks within this fraction of the lowest count as equal, and the cheaper plan wins: a
 * recomputation that saves a few percent of memory is not worth a product's time. */
#define PEAK_SLACK 0.05

static size_t slack_bound(const search *S, const pool *p) {
    size_t low = p->c[best_of(S, p)].peak;
    return low + (size_t)((double)low * PEAK_SLACK);
}

static kiln_status threshold_search(search *S, pool *p, const kiln_sublinear_config *cfg, size_t base, int w) {
    int64_t th[128];
    int32_t n = 0;
    for (int64_t t = (int64_t)base / 2; t >= 1024 && n < 64; t /= 2) th[n++] = t;
    int32_t tries = cfg->thresh_nr_try < 60 ? cfg->thresh_nr_try : 60;
    for (int32_t k = 1; k <= tries; k++) th[n++] = (int64_t)base / (tries + 1) * k;
    KILN_TRY(add_thresholds(S, p, th, n, w));
    /* around the best threshold so far: from half of it to twice it */
    int64_t best = -1;
    for (int32_t k = 0; k < p->n; k++)
        if (p->c[k].thresh > 0 && (best < 0 || compare(S, &p->c[k], &p->c[best]) < 0 ||
                                   (compare(S, &p->c[k], &p->c[best]) == 0 && p->c[k].thresh > p->c[best].thresh)))
            best = k;
    if (best < 0 || tries < 2) return KILN_OK;
    int64_t t0 = p->c[best].thresh, start = t0 / 2, step = (t0 * 2 - start) / (tries - 1);
    for (n = 0; n < tries; n++) th[n] = start + step * n;
    return add_thresholds(S, p, th, n, w);
}

static kiln_status genetic_search(search *S, pool *p, const kiln_sublinear_config *cfg, int w) {
    pool next = {0};
    kiln_status s = KILN_OK;
    for (int32_t round = 0; round < cfg->genetic_nr_iter && s == KILN_OK && p->n > 0; round++) {
        int32_t size = cfg->genetic_pool_size < p->n ? cfg->genetic_pool_size : p->n;
        s = pool_room(&next, 3 * size);
        /* tournament selection (two drawn, the better kept) */
        for (int32_t k = 0; k < size && s == KILN_OK; k++) {
            int32_t a = (int32_t)(next_random(S) % (uint64_t)p->n), b = (int32_t)(next_random(S) % (uint64_t)p->n);
            s = copy_candidate(&next.c[next.n], compare(S, &p->c[a], &p->c[b]) <= 0 ? &p->c[a] : &p->c[b]);
            if (s == KILN_OK) next.n++;
        }
        int32_t from = next.n;
        for (int32_t k = 0; k < size && s == KILN_OK; k++) {
            candidate once;
            s = mutate(S, &next.c[k], &once);
            if (s == KILN_OK) s = mutate(S, &once, &next.c[next.n]);
            free(once.sp);
            if (s != KILN_OK) break;
            next.n++;
            int32_t mate = (int32_t)(next_random(S) % (uint64_t)size);
            s = crossover(S, &next.c[k], &next.c[mate], &next.c[next.n]);
            if (s == KILN_OK) next.n++;
        }
        if (s == KILN_OK) s = score_from(S, &next, from, w);
        /* the best so far always survives */
        if (s == KILN_OK) s = pool_room(&next, 1);
        if (s == KILN_OK) {
            s = copy_candidate(&next.c[next.n], &p->c[best_of(S, p)]);
            if (s == KILN_OK) next.n++;
        }
        pool swap = *p;
        *p = next;
        next = swap;
        pool_clear(&next);
    }
    pool_clear(&next);
    free(next.c);
    return s;
}

/* Split points at the costliest recomputed nodes, each kept when it lowers the FLOPs with the peak
 * at most the bound: lb_memory when set (trading memory back for speed), else the best peak (a
 * recomputation that does not lower the peak is not worth its time). */
static kiln_status refine(search *S, candidate *best, size_t bound) {
    if (best->ops == 0 || best->peak > bound) return KILN_OK;
    bool *recomputed = kiln_calloc((size_t)S->nn, sizeof(bool));
    int32_t *nodes = kiln_malloc(sizeof(int32_t) * (size_t)S->nn);
    kiln_status s = recomputed && nodes ? KILN_OK : kiln_error(KILN_ERR_MEMORY, "out of memory searching checkpoints");
    candidate trial = {0};
    if (s == KILN_OK) s = copy_candidate(&trial, best);
    if (s == KILN_OK) score(S, &trial, recomputed);
    int32_t n = 0;
    for (int32_t i = 0; i < S->nn && s == KILN_OK; i++)
        if (recomputed[i]) nodes[n++] = i;
    for (int32_t a = 1; a < n; a++) /* costliest first (insertion sort: the list is short) */
        for (int32_t b = a; b > 0 && kiln_node_flops(S->g, nodes[b]) > kiln_node_flops(S->g, nodes[b - 1]); b--) {
            int32_t t = nodes[b];
            nodes[b] = nodes[b - 1], nodes[b - 1] = t;
        }
    for (int32_t k = 0; k < n && k < 64 && s == KILN_OK; k++) {
        candidate more;
        s = make(&more, best->n + 1);
        if (s != KILN_OK) break;
        bool present = false;
        for (int32_t j = 0; j < best->n; j++) {
            more.sp[more.n++] = best->sp[j];
            present |= best->sp[j] == nodes[k];
        }
        if (!present) { /* insert nodes[k], keeping the list sorted */
            int32_t j = more.n++;
            for (; j > 0 && more.sp[j - 1] > nodes[k]; j--) more.sp[j] = more.sp[j - 1];
            more.sp[j] = nodes[k];
        }
        score(S, &more, NULL);
        S->scored++;
        if (more.s == KILN_OK && more.peak <= bound && more.flops < best->flops) {
            free(best->sp);
            *best = more;
        } else {
            free(more.sp);
        }
    }
    free(trial.sp), free(recomputed), free(nodes);
    return s;
}

static kiln_status prepare(search *S) {
    const kiln_graph *g = S->g;
    int32_t nv = g->nvalues;
    S->bytes = kiln_calloc((size_t)(nv ? nv : 1), sizeof(int64_t));
    S->last_reader = kiln_malloc(sizeof(int32_t) * (size_t)(nv ? nv : 1));
    if (!S->bytes || !S->last_reader) return kiln_error(KILN_ERR_MEMORY, "out of memory searching checkpoints");
    for (int32_t v = 0; v < nv; v++) {
        const kiln_value *val = &g->values[v];
        S->last_reader[v] = -1;
        bool alias = val->kind == KILN_VALUE_NODE && val->index == 0 &&
                     (kiln_op_table[g->nodes[val->node].op].flags & (KILN_OPF_VIEW | KILN_OPF_MUTATES));
        if (val->kind == KILN_VALUE_NODE && !alias)
            S->bytes[v] = kiln_meta_numel(&val->meta) * (int64_t)kiln_dtype_size(val->meta.dtype);
    }
    for (int32_t i = 0; i < g->nnodes; i++)
        for (int k = 0; k < g->nodes[i].nin; k++) S->last_reader[g->nodes[i].in[k]] = i;
    return KILN_OK;
}

kiln_status kiln_sublinear_optimize(kiln_graph **g, kiln_exec_order order, const kiln_sublinear_config *cfg,
                                    kiln_sublinear_report *report) {
    memset(report, 0, sizeof *report);
    if (cfg->thresh_nr_try < 0 || cfg->genetic_nr_iter < 0 || cfg->genetic_pool_size < 0 || cfg->lb_memory < 0 ||
        cfg->num_worker < 1)
        return kiln_error(KILN_ERR_VALUE,
                          "sublinear memory: thresh_nr_try, genetic_nr_iter, genetic_pool_size and lb_memory must "
                          "be >= 0 and num_worker >= 1 (got %d, %d, %d, %lld, %d)",
                          cfg->thresh_nr_try, cfg->genetic_nr_iter, cfg->genetic_pool_size,
                          (long long)cfg->lb_memory, cfg->num_worker);
    KILN_TRY(kiln_plan_arena_bytes(*g, order, &report->peak_before));
    report->peak_after = report->peak_greedy = report->peak_hoisted = report->peak_before;
    if ((*g)->nnodes < 2 || (cfg->lb_memory > 0 && (size_t)cfg->lb_memory >= report->peak_before)) return KILN_OK;
    kiln_graph *hoisted = NULL, *out = NULL;
    KILN_TRY(kiln_hoist_updates(*g, &hoisted));
    const kiln_graph *work = hoisted ? hoisted : *g;
    search S = {work, order, work->nnodes, cfg->lb_memory, NULL, NULL, cfg->seed ? cfg->seed : 0x9E3779B97F4A7C15ULL, 0};
    pool p = {0};
    candidate best = {0};
    kiln_status s = prepare(&S);
    if (s == KILN_OK) s = pool_room(&p, 1);
    if (s == KILN_OK) s = make(&p.c[0], 1); /* the baseline: one block, nothing dropped */
    if (s == KILN_OK) {
        p.c[0].sp[0] = S.nn - 1, p.c[0].n = 1, p.n = 1;
        s = score_from(&S, &p, 0, 1);
        report->peak_hoisted = p.c[0].peak;
    }
    if (s == KILN_OK) s = threshold_search(&S, &p, cfg, report->peak_hoisted, cfg->num_worker);
    size_t bound = 0;
    if (s == KILN_OK) { /* the greedy search's choice; the genetic rounds may only lower its peak */
        report->peak_greedy = p.c[cheapest_under(&p, slack_bound(&S, &p))].peak;
        s = genetic_search(&S, &p, cfg, cfg->num_worker);
    }
    if (s == KILN_OK) {
        bound = slack_bound(&S, &p);
        if (bound > report->peak_greedy) bound = report->peak_greedy;
        if (cfg->lb_memory > 0 && (size_t)cfg->lb_memory > bound) bound = (size_t)cfg->lb_memory;
        int32_t chosen = cheapest_under(&p, bound);
        s = copy_candidate(&best, &p.c[chosen >= 0 ? chosen : best_of(&S, &p)]);
    }
    if (s == KILN_OK) s = refine(&S, &best, bound);
    if (s == KILN_OK && best.s == KILN_OK && best.ops > 0) {
        int32_t *block = NULL;
        bool *endpoint = NULL;
        kiln_recompute_stats st;
        s = blocks_of(&S, &best, &block, &endpoint);
        if (s == KILN_OK) s = kiln_recompute_rewrite(work, block, endpoint, &out, &st, NULL);
        free(block), free(endpoint);
        if (s == KILN_OK && out) {
            report->peak_after = best.peak;
            report->recomputed_ops = st.recomputed_ops;
            report->extra_flops = st.extra_flops;
            report->checkpoints = best.n;
        }
    }
    if (s == KILN_OK && !out && hoisted && report->peak_hoisted < report->peak_before) {
        out = hoisted, hoisted = NULL;
        report->peak_after = report->peak_hoisted;
    }
    kiln_graph_free(hoisted);
    report->candidates = S.scored;
    pool_clear(&p);
    free(p.c), free(best.sp), free(S.bytes), free(S.last_reader);
    if (s != KILN_OK) {
        kiln_graph_free(out);
        return s;
    }
    if (out) {
        kiln_graph_free(*g);
        *g = out;
    }
    return KILN_OK;
}
