/* Gradient bucketing (DDP's buckets, MindSpore's AllReduce fusion): all_reduce nodes with a fusion
 * id > 0 (data-parallel training emits one per gradient, kiln.nn.grad_reduce) are joined into
 * all_reduce_bucket nodes of at most kiln_comm_fusion_bytes() bytes, one dtype, reduction, group
 * and fusion id per bucket, filled in the order the graph makes the tensors (backward makes the
 * last parameters' gradients first, so DDP's reverse parameter order); each all_reduce's users then
 * read a view of its bucket's result. One collective per bucket instead of one per gradient, and
 * no copy back out of the bucket.
 *
 * A bucket goes right after the last node making one of its tensors, so it can start while earlier
 * gradients are still being computed. all_reduces move only within a segment of the graph free
 * of other effects and in-place writes (so the order of the graph's other collectives and writes
 * is kept), and a bucket takes only all_reduces whose results nothing reads before its place.
 * Every rank, running the same graph, makes the same buckets. A bucket of one tensor stays a
 * plain all_reduce where it was. Graphs with symbolic sizes are left alone. */
#include "../comm/comm.h"
#include "passes_internal.h"

typedef struct member {
    int32_t node, producer; /* the all_reduce; the node making its input (-1: a graph input) */
} member;

static bool candidate(const kiln_graph *g, const kiln_node *n) {
    if (n->op != KILN_OP_ALL_REDUCE || n->attrs.ni <= KILN_A_ALL_REDUCE_FUSION || n->recompute) return false;
    int64_t op = n->attrs.i[KILN_A_ALL_REDUCE_OP];
    const kiln_meta *m = &g->values[n->in[0]].meta;
    return n->attrs.i[KILN_A_ALL_REDUCE_FUSION] > 0 && (op == KILN_COMM_SUM || op == KILN_COMM_MEAN) &&
           kiln_dtype_is_float(m->dtype);
}

/* Whether node n breaks a run: an effect (another collective, a print) or an in-place write. */
static bool breaks_run(const kiln_node *n) {
    return kiln_node_has_effects(n) || (kiln_op_table[n->op].flags & (KILN_OPF_MUTATES | KILN_OPF_WRITES_ANY));
}

static int32_t producer(const kiln_graph *g, int32_t v) {
    return g->values[v].kind == KILN_VALUE_NODE ? g->values[v].node : -1;
}

/* Same bucket key: fusion id, reduction, group, dtype. */
static bool same_key(const kiln_graph *g, const member *a, const member *b) {
    const kiln_node *x = &g->nodes[a->node], *y = &g->nodes[b->node];
    for (int k = 0; k <= KILN_A_ALL_REDUCE_FUSION; k++)
        if (x->attrs.i[k] != y->attrs.i[k]) return false;
    return g->values[x->in[0]].meta.dtype == g->values[y->in[0]].meta.dtype;
}

static int64_t bytes_of(const kiln_graph *g, const member *m) {
    const kiln_meta *meta = &g->values[g->nodes[m->node].in[0]].meta;
    int64_t n = 1;
    for (int d = 0; d < meta->ndim; d++) n *= meta->shape[d];
    return n * (int64_t)kiln_dtype_size(meta->dtype);
}

/* The first-produced first; ties (graph inputs) in node order. */
static int by_producer(const void *pa, const void *pb) {
    const member *a = pa, *b = pb;
    if (a->producer != b->producer) return a->producer < b->producer ? -1 : 1;
    return a->node < b->node ? -1 : 1;
}

/* Emits one bucket (members m[0..n)) into the rewritten graph: all_reduce_bucket (overlap:
 * all_reduce_start, its value in *flat_out, the views waiting for finish_bucket), and for each
 * member a reshaped slice of it standing for the member's result. */
static kiln_status emit_views(kiln_rewriter *rw, const member *m, int n, int32_t flat);

static kiln_status emit_bucket(kiln_rewriter *rw, const member *m, int n, bool overlap, int32_t *flat_out) {
    const kiln_graph *g = rw->src;
    const kiln_node *first = &g->nodes[m[0].node];
    if (n == 1) return kiln_rewriter_copy_node(rw, m[0].node);
    int32_t *ins = kiln_malloc(sizeof(int32_t) * (size_t)n);
    if (!ins) return kiln_error(KILN_ERR_MEMORY, "out of memory bucketing all-reduces");
    for (int k = 0; k < n; k++) ins[k] = rw->map[g->nodes[m[k].node].in[0]];
    kiln_attrs ba;
    kiln_attrs_clear(&ba);
    kiln_attrs_push_int(&ba, first->attrs.i[KILN_A_ALL_REDUCE_OP]);
    kiln_attrs_push_int(&ba, first->attrs.i[KILN_A_ALL_REDUCE_GROUP]);
    int32_t flat;
    kiln_status s = kiln_graph_add_node(rw->dst, overlap ? KILN_OP_ALL_REDUCE_START : KILN_OP_ALL_REDUCE_BUCKET, n, ins,
                                        &ba, first->loc, &flat);
    free(ins);
    if (s != KILN_OK || overlap) {
        *flat_out = flat;
        return s;
    }
    return emit_views(rw, m, n, flat);
}

/* The wait of an overlapped bucket (started as *flat), then its views. */
static kiln_status finish_bucket(kiln_rewriter *rw, const member *m, int n, int32_t flat) {
    int32_t done;
    kiln_attrs none;
    kiln_attrs_clear(&none);
    kiln_status s = kiln_graph_add_node(rw->dst, KILN_OP_ALL_REDUCE_WAIT, 1, &flat, &none,
                                        rw->src->nodes[m[0].node].loc, &done);
    return s == KILN_OK ? emit_views(rw, m, n, done) : s;
}

static kiln_status emit_views(kiln_rewriter *rw, const member *m, int n, int32_t flat) {
    const kiln_graph *g = rw->src;
    kiln_status s = KILN_OK;
    int64_t at = 0;
    for (int k = 0; k < n && s == KILN_OK; k++) {
        const kiln_node *ar = &g->nodes[m[k].node];
        const kiln_meta *meta = &g->values[ar->in[0]].meta;
        int64_t numel = 1;
        for (int d = 0; d < meta->ndim; d++) numel *= meta->shape[d];
        kiln_attrs sa, ra;
        kiln_attrs_clear(&sa);
        kiln_attrs_clear(&ra);
        for (int d = 0; d < 24; d++) kiln_attrs_push_int(&sa, d == 0 ? at : d == 8 ? 1 : d == 16 ? numel : 0);
        for (int d = 0; d < meta->ndim; d++) kiln_attrs_push_int(&ra, meta->shape[d]);
        int32_t part, shaped;
        s = kiln_graph_add_node(rw->dst, KILN_OP_SLICE, 1, &flat, &sa, ar->loc, &part);
        if (s == KILN_OK) s = kiln_graph_add_node(rw->dst, KILN_OP_RESHAPE, 1, &part, &ra, ar->loc, &shaped);
        if (s == KILN_OK) rw->map[ar->out[0]] = shaped;
        at += numel;
    }
    return s;
}

KILN_PASS(bucket_all_reduce) {
    (void)opt;
    *out = NULL;
    if (kiln_graph_is_symbolic(in)) return KILN_OK;
    int32_t nn = in->nnodes, nm = 0;
    for (int32_t i = 0; i < nn; i++) nm += candidate(in, &in->nodes[i]);
    if (nm < 2) return KILN_OK;
    /* per node: the first node of its segment (nodes between two that break runs); per value: the
     * first node reading it; per member: its bucket's emit position, or -1 while it has none */
    int32_t *seg_lo = kiln_malloc(sizeof(int32_t) * (size_t)nn);
    int32_t *first_use = kiln_malloc(sizeof(int32_t) * (size_t)(in->nvalues ? in->nvalues : 1));
    member *m = kiln_malloc(sizeof(member) * (size_t)nm), *bucket = kiln_malloc(sizeof(member) * (size_t)nm);
    /* per member: the member leading its bucket (-1: none yet); per leader: where its bucket goes
     * (before that node) and how many members it has */
    int32_t *leader = kiln_malloc(sizeof(int32_t) * (size_t)nm), *at = kiln_malloc(sizeof(int32_t) * (size_t)nm);
    int32_t *size = kiln_calloc((size_t)nm, sizeof(int32_t));
    /* overlap: per leader, where its wait goes (before the first read of a result) and its start's value */
    int32_t *wait_at = kiln_malloc(sizeof(int32_t) * (size_t)nm), *flat = kiln_malloc(sizeof(int32_t) * (size_t)nm);
    bool overlap = kiln_comm_overlap();
    bool *skip = kiln_calloc((size_t)nn, sizeof(bool));
    kiln_status s = KILN_OK;
    if (!seg_lo || !first_use || !m || !bucket || !leader || !at || !size || !skip || !wait_at || !flat) {
        s = kiln_error(KILN_ERR_MEMORY, "out of memory bucketing all-reduces");
        goto done;
    }
    for (int32_t v = 0; v < in->nvalues; v++) first_use[v] = INT32_MAX;
    for (int32_t i = nn - 1; i >= 0; i--)
        for (int k = 0; k < in->nodes[i].nin; k++) first_use[in->nodes[i].in[k]] = i;
    nm = 0;
    for (int32_t i = 0, lo = 0; i < nn; i++) {
        const kiln_node *n = &in->nodes[i];
        seg_lo[i] = lo;
        if (candidate(in, n)) m[nm++] = (member){i, producer(in, n->in[0])};
        else if (breaks_run(n)) lo = i + 1;
    }
    /* in the order backward makes the tensors (the first-produced first); each bucket, from the
     * first member left, takes the next members of its segment and key while they fit, as long as
     * no member's result is read before the bucket's place: right after the last node making one
     * of its tensors (or the segment's start) */
    qsort(m, (size_t)nm, sizeof *m, by_producer);
    for (int k = 0; k < nm; k++) leader[k] = -1;
    int64_t limit = kiln_comm_fusion_bytes();
    int nbuckets = 0;
    for (int k = 0; k < nm; k++) {
        if (leader[k] >= 0) continue;
        int32_t lo = seg_lo[m[k].node], place = lo, read = INT32_MAX; /* read: the first read of a result */
        int nb = 0;
        int64_t bytes = 0;
        for (int j = k; j < nm; j++) {
            if (leader[j] >= 0 || seg_lo[m[j].node] != lo || !same_key(in, &m[k], &m[j])) continue;
            int32_t p = m[j].producer + 1 > place ? m[j].producer + 1 : place;
            int32_t r = first_use[in->nodes[m[j].node].out[0]] < read ? first_use[in->nodes[m[j].node].out[0]] : read;
            if (r < p) continue; /* a result would be read before the bucket */
            int64_t b = bytes_of(in, &m[j]);
            if (nb > 0 && bytes + b > limit) break; /* the next bucket starts here */
            leader[j] = k;
            place = p, read = r, bytes += b;
            nb++;
        }
        at[k] = place, size[k] = nb, wait_at[k] = read < nn ? read : nn;
        if (nb > 1) nbuckets++;
    }
    if (!nbuckets) goto done;
    kiln_rewriter rw;
    if ((s = kiln_rewriter_begin(&rw, in)) != KILN_OK) goto done;
    for (int j = 0; j < nm; j++) /* the members of buckets of two or more leave their place */
        skip[m[j].node] = size[leader[j]] > 1;
    for (int32_t i = 0; i <= nn && s == KILN_OK; i++) {
        /* before node i: the buckets placed here (started, with overlap), then the waits due */
        for (int pass = 0; pass < (overlap ? 2 : 1); pass++)
            for (int k = 0; k < nm && s == KILN_OK; k++) {
                if (size[k] < 2 || (pass == 0 ? at[k] : wait_at[k]) != i) continue;
                int nb = 0;
                for (int j = k; j < nm; j++)
                    if (leader[j] == k) bucket[nb++] = m[j];
                s = pass == 0 ? emit_bucket(&rw, bucket, nb, overlap, &flat[k]) : finish_bucket(&rw, bucket, nb, flat[k]);
            }
        if (i < nn && !skip[i] && s == KILN_OK) s = kiln_rewriter_copy_node(&rw, i);
    }
    if (s == KILN_OK) s = kiln_rewriter_finish(&rw, out);
    else kiln_rewriter_abort(&rw);
done:
    free(seg_lo), free(first_use), free(m), free(bucket), free(leader), free(at), free(size), free(skip), free(wait_at),
        free(flat);
    return s;
}
