/* kiln_plan_build: order, memory plan, fused groups and nested plans of a graph (see plan.h). */
#include "plan.h"

#include <stdatomic.h>

#include "../ir/control.h"
#include "../ir/symbolic.h"

#include "kiln/sublinear.h"

static bool is_alias_op(kiln_op op) { return kiln_op_table[op].flags & (KILN_OPF_VIEW | KILN_OPF_MUTATES); }

static size_t meta_bytes(const kiln_meta *m) {
    return (size_t)kiln_meta_numel(m) * kiln_dtype_size(m->dtype);
}

/* ---- order ----------------------------------------------------------------------------- */

/* Depth-first post-order from each segment's sinks, so a value is computed just before its
 * consumers. Nodes that write inputs in place or draw random numbers bound segments: their
 * order against everything else is kept as traced (readers of a buffer before its update; the
 * generator's stream). */
static kiln_status order_dfs(const kiln_graph *g, int32_t *order) {
    int32_t n = g->nnodes, pos = 0;
    int64_t edges = 0; /* a node's inputs are pushed once (when it is first expanded): this bounds the stack */
    for (int32_t i = 0; i < n; i++) edges += g->nodes[i].nin;
    bool *done = kiln_calloc((size_t)(n ? n : 1), sizeof *done);
    int32_t *stack = kiln_malloc(sizeof(int32_t) * (size_t)(edges + n + 1));
    if (!done || !stack) {
        free(done), free(stack);
        return kiln_error(KILN_ERR_MEMORY, "out of memory ordering a graph");
    }
    int32_t seg_begin = 0;
    for (int32_t i = 0; i <= n; i++) {
        bool barrier = i == n || kiln_op_has_side_effects(g->nodes[i].op);
        if (!barrier) continue;
        /* visit the segment [seg_begin, i) from its last nodes backwards as roots */
        for (int32_t r = i - 1; r >= seg_begin; r--) {
            if (done[r]) continue;
            int32_t depth = 0;
            stack[depth++] = r;
            while (depth > 0) {
                int32_t cur = stack[depth - 1];
                if (done[cur]) {
                    depth--;
                    continue;
                }
                bool pushed = false;
                const kiln_node *nd = &g->nodes[cur];
                for (int k = nd->nin - 1; k >= 0; k--) { /* first input computed first */
                    const kiln_value *v = &g->values[nd->in[k]];
                    if (v->kind == KILN_VALUE_NODE && v->node >= seg_begin && !done[v->node]) {
                        stack[depth++] = v->node;
                        pushed = true;
                    }
                }
                if (!pushed) {
                    done[cur] = true;
                    depth--;
                    order[pos++] = cur;
                }
            }
        }
        if (i < n) {
            done[i] = true;
            order[pos++] = i;
        }
        seg_begin = i + 1;
    }
    free(done), free(stack);
    KILN_ASSERT(pos == n);
    return KILN_OK;
}

/* ---- memory ----------------------------------------------------------------------------- */

typedef struct {
    int64_t offset, size;
} block;

typedef struct {
    block *free_blocks;
    int nfree, cap;
    int64_t top;
} arena_plan;

static int64_t align_up(int64_t v) { return (v + KILN_ALIGN - 1) / KILN_ALIGN * KILN_ALIGN; }

static kiln_status arena_take(arena_plan *a, int64_t size, int64_t *offset) {
    size = align_up(size ? size : 1);
    int best = -1;
    for (int k = 0; k < a->nfree; k++)
        if (a->free_blocks[k].size >= size && (best < 0 || a->free_blocks[k].size < a->free_blocks[best].size))
            best = k;
    if (best >= 0) {
        *offset = a->free_blocks[best].offset;
        a->free_blocks[best].offset += size;
        a->free_blocks[best].size -= size;
        if (a->free_blocks[best].size == 0) a->free_blocks[best] = a->free_blocks[--a->nfree];
        return KILN_OK;
    }
    /* grow: a free block at the top can be extended */
    for (int k = 0; k < a->nfree; k++)
        if (a->free_blocks[k].offset + a->free_blocks[k].size == a->top) {
            *offset = a->free_blocks[k].offset;
            a->top = *offset + size;
            a->free_blocks[k] = a->free_blocks[--a->nfree];
            return KILN_OK;
        }
    *offset = a->top;
    a->top += size;
    return KILN_OK;
}

static kiln_status arena_give(arena_plan *a, int64_t offset, int64_t size) {
    size = align_up(size ? size : 1);
    /* merge with neighbours */
    for (int k = 0; k < a->nfree; k++) {
        block *b = &a->free_blocks[k];
        if (b->offset + b->size == offset) {
            offset = b->offset, size += b->size;
            a->free_blocks[k--] = a->free_blocks[--a->nfree];
        } else if (offset + size == b->offset) {
            size += b->size;
            a->free_blocks[k--] = a->free_blocks[--a->nfree];
        }
    }
    if (a->nfree == a->cap) {
        int ncap = a->cap ? a->cap * 2 : 32;
        block *grown = kiln_realloc(a->free_blocks, sizeof *grown * (size_t)ncap);
        if (!grown) return kiln_error(KILN_ERR_MEMORY, "out of memory planning memory");
        a->free_blocks = grown;
        a->cap = ncap;
    }
    a->free_blocks[a->nfree++] = (block){offset, size};
    return KILN_OK;
}

/* Gradient buckets laid out in place (ops.def's JOINS_INPUTS: all_reduce_bucket, all_reduce_start):
 * when every input of such a node is a buffer of its own made by this plan (not a graph input, a
 * view, an alias or a result), of the output's dtype, distinct, read by nothing after the node,
 * the inputs are placed one after the other in the output's block, which is taken when the first
 * of them is made and lives to the output's last use; the kernel then finds them there and works
 * in place. region[v]: the output whose block input v lies in (-1: none), at byte region_at[v].
 * KILN_BUCKET_IN_PLACE=0 in the environment (read per plan) leaves every bucket to pack. */
static void plan_joined_inputs(const kiln_plan *e, const bool *output_root, const int32_t *step_of, int32_t *region,
                               int64_t *region_at) {
    const kiln_graph *g = e->g;
    for (int32_t v = 0; v < g->nvalues; v++) region[v] = -1;
    const char *env = getenv("KILN_BUCKET_IN_PLACE");
    if (env && strcmp(env, "0") == 0) return;
    for (int32_t i = 0; i < e->norder; i++) {
        const kiln_node *nd = &g->nodes[e->order[i]];
        if (!(kiln_op_table[nd->op].flags & KILN_OPF_JOINS_INPUTS) || nd->nout != 1) continue;
        int32_t y = nd->out[0];
        if (output_root[y] || e->root[y] != y) continue;
        bool ok = nd->nin > 0;
        for (int k = 0; k < nd->nin && ok; k++) {
            int32_t v = nd->in[k];
            const kiln_value *val = &g->values[v];
            ok = val->kind == KILN_VALUE_NODE && e->root[v] == v && !output_root[v] && region[v] < 0 &&
                 !is_alias_op(g->nodes[val->node].op) && !kiln_op_is_control(g->nodes[val->node].op) &&
                 e->last_use[v] == i && step_of[val->node] < i &&
                 val->meta.dtype == g->values[y].meta.dtype && kiln_meta_numel(&val->meta) > 0;
            for (int j = 0; j < k && ok; j++) ok = nd->in[j] != v;
        }
        if (!ok) continue;
        int64_t at = 0;
        for (int k = 0; k < nd->nin; k++) {
            region[nd->in[k]] = y, region_at[nd->in[k]] = at;
            at += (int64_t)meta_bytes(&g->values[nd->in[k]].meta);
        }
    }
}

bool kiln_plan_joins_in_place(const kiln_plan *p, int32_t node) {
    const kiln_node *nd = &p->g->nodes[node];
    if (!(kiln_op_table[nd->op].flags & KILN_OPF_JOINS_INPUTS) || nd->nout != 1 || p->offset[nd->out[0]] < 0)
        return false;
    int64_t at = p->offset[nd->out[0]];
    for (int k = 0; k < nd->nin; k++) {
        if (p->offset[nd->in[k]] != at || p->root[nd->in[k]] != nd->in[k]) return false;
        at += (int64_t)meta_bytes(&p->g->values[nd->in[k]].meta);
    }
    return nd->nin > 0;
}

/* Appends root r to the buffers given back after step i. */
static kiln_status note_freed(kiln_plan *e, int32_t i, int32_t r) {
    int32_t n = 0;
    while (e->freed_after[i] && e->freed_after[i][n] >= 0) n++;
    int32_t *grown = kiln_realloc(e->freed_after[i], sizeof(int32_t) * (size_t)(n + 2));
    if (!grown) return kiln_error(KILN_ERR_MEMORY, "out of memory planning memory");
    grown[n] = r;
    grown[n + 1] = -1;
    e->freed_after[i] = grown;
    return KILN_OK;
}

static kiln_status plan_memory(kiln_plan *e) {
    const kiln_graph *g = e->g;
    int32_t nv = g->nvalues;
    bool *output_root = kiln_calloc((size_t)(nv ? nv : 1), sizeof(bool));
    int32_t *end = kiln_malloc(sizeof(int32_t) * (size_t)(nv ? nv : 1)); /* last_use, then -1 moved / -2 given back */
    int32_t *region = kiln_malloc(sizeof(int32_t) * (size_t)(nv ? nv : 1));
    int64_t *region_at = kiln_malloc(sizeof(int64_t) * (size_t)(nv ? nv : 1));
    int32_t *step_of = kiln_malloc(sizeof(int32_t) * (size_t)(g->nnodes ? g->nnodes : 1));
    arena_plan a = {0};
    kiln_status s = KILN_OK;
    if (!output_root || !end || !region || !region_at || !step_of) {
        s = kiln_error(KILN_ERR_MEMORY, "out of memory planning memory");
        goto done;
    }
    for (int32_t v = 0; v < nv; v++) {
        const kiln_value *val = &g->values[v];
        e->root[v] = v;
        if (val->kind == KILN_VALUE_NODE && is_alias_op(g->nodes[val->node].op) && val->index == 0)
            e->root[v] = e->root[g->nodes[val->node].in[0]]; /* values are numbered in trace order */
        e->last_use[v] = -1;
        e->offset[v] = -1;
    }
    for (int32_t k = 0; k < g->noutputs; k++) output_root[e->root[g->outputs[k]]] = true;
    if ((s = kiln_plan_weight_casts(e, output_root)) != KILN_OK) goto done;
    for (int32_t i = 0; i < e->norder; i++) {
        const kiln_node *nd = &g->nodes[e->order[i]];
        for (int k = 0; k < nd->nin; k++) {
            int32_t r = e->root[nd->in[k]];
            if (e->last_use[r] < i) e->last_use[r] = i;
        }
        for (int k = 0; k < nd->nout; k++) {
            int32_t r = e->root[nd->out[k]];
            if (e->last_use[r] < i) e->last_use[r] = i;
        }
    }
    for (int32_t v = 0; v < nv; v++)
        if (output_root[v] || g->values[v].kind != KILN_VALUE_NODE) e->last_use[v] = e->norder;
    memcpy(end, e->last_use, sizeof(int32_t) * (size_t)nv);
    for (int32_t i = 0; i < e->norder; i++) step_of[e->order[i]] = i;
    plan_joined_inputs(e, output_root, step_of, region, region_at);
    for (int32_t v = 0; v < nv; v++)
        if (region[v] >= 0) end[v] = -1; /* the block is its bucket's, given back with it */
    /* walk the order, handing out and taking back blocks */
    for (int32_t i = 0; i < e->norder && s == KILN_OK; i++) {
        const kiln_node *nd = &g->nodes[e->order[i]];
        /* an alias op (view, in-place write) takes no block, but what it reads last still goes back:
         * an optimizer's update is the last reader of its gradient */
        for (int k = 0; k < nd->nout && s == KILN_OK && !is_alias_op(nd->op); k++) {
            int32_t v = nd->out[k];
            if (output_root[v] || kiln_plan_is_weight_cast(e, e->order[i])) continue; /* a buffer of its own */
            int64_t size = (int64_t)meta_bytes(&g->values[v].meta);
            if (region[v] >= 0) { /* into its bucket's block, taken by the first input made */
                int32_t y = region[v];
                if (e->offset[y] < 0) s = arena_take(&a, (int64_t)meta_bytes(&g->values[y].meta), &e->offset[y]);
                e->offset[v] = e->offset[y] + region_at[v];
                continue;
            }
            /* in place: an elementwise input whose buffer dies here, same dtype and shape */
            if (kiln_op_table[nd->op].fusion == KILN_FUSE_ELEMENTWISE && nd->op != KILN_OP_CAST) {
                for (int j = 0; j < nd->nin; j++) {
                    int32_t in = nd->in[j];
                    bool other_view = false; /* a view of the buffer read alongside would see writes */
                    for (int j2 = 0; j2 < nd->nin; j2++)
                        other_view |= nd->in[j2] != in && e->root[nd->in[j2]] == in;
                    if (e->root[in] == in && e->offset[in] >= 0 && end[in] == i && !other_view &&
                        kiln_meta_equal(&g->values[in].meta, &g->values[v].meta)) {
                        e->offset[v] = e->offset[in];
                        end[in] = -1; /* the block now belongs to v */
                        break;
                    }
                }
            }
            if (e->offset[v] < 0) s = arena_take(&a, size, &e->offset[v]);
        }
        /* buffers whose last use was this step go back */
        for (int k = 0; k < nd->nin && s == KILN_OK; k++) {
            int32_t r = e->root[nd->in[k]];
            if (end[r] == i && e->offset[r] >= 0) {
                s = arena_give(&a, e->offset[r], (int64_t)meta_bytes(&g->values[r].meta));
                end[r] = -2; /* given back */
                if (s == KILN_OK) s = note_freed(e, i, r);
            }
        }
        for (int k = 0; k < nd->nout && s == KILN_OK; k++) { /* produced and never used */
            int32_t r = nd->out[k];
            if (e->root[r] == r && end[r] == i && e->offset[r] >= 0) {
                s = arena_give(&a, e->offset[r], (int64_t)meta_bytes(&g->values[r].meta));
                end[r] = -2;
                if (s == KILN_OK) s = note_freed(e, i, r);
            }
        }
    }
    e->arena_bytes = (size_t)a.top;
    for (int32_t k = 0; k < g->noutputs; k++)
        if (e->root[g->outputs[k]] == g->outputs[k] && g->values[g->outputs[k]].kind == KILN_VALUE_NODE)
            e->output_bytes += meta_bytes(&g->values[g->outputs[k]].meta);
done:
    free(output_root), free(end), free(region), free(region_at), free(step_of), free(a.free_blocks);
    return s;
}

/* Per step, the values whose run-time tensors can be dropped after it (for views and per-call
 * buffers), and the planned buffers to poison in debug mode. */
static kiln_status plan_releases(kiln_plan *e) {
    const kiln_graph *g = e->g;
    int32_t nv = g->nvalues;
    int32_t *last = kiln_malloc(sizeof(int32_t) * (size_t)(nv ? nv : 1));
    int32_t *count = kiln_calloc((size_t)(e->norder ? e->norder : 1), sizeof(int32_t));
    if (!last || !count) {
        free(last), free(count);
        return kiln_error(KILN_ERR_MEMORY, "out of memory planning a graph");
    }
    for (int32_t v = 0; v < nv; v++) last[v] = -1;
    for (int32_t i = 0; i < e->norder; i++) {
        const kiln_node *nd = &g->nodes[e->order[i]];
        for (int k = 0; k < nd->nin; k++) last[nd->in[k]] = i;
        for (int k = 0; k < nd->nout; k++)
            if (last[nd->out[k]] < i) last[nd->out[k]] = i;
    }
    for (int32_t k = 0; k < g->noutputs; k++) last[g->outputs[k]] = -1; /* kept to the end */
    for (int32_t v = 0; v < nv; v++)
        if (g->values[v].kind == KILN_VALUE_NODE && last[v] >= 0) count[last[v]]++;
    kiln_status s = KILN_OK;
    for (int32_t i = 0; i < e->norder && s == KILN_OK; i++) {
        e->dead_after[i] = kiln_malloc(sizeof(int32_t) * (size_t)(count[i] + 1));
        if (!e->dead_after[i]) s = kiln_error(KILN_ERR_MEMORY, "out of memory planning a graph");
        else e->dead_after[i][0] = -1;
        count[i] = 0;
    }
    for (int32_t v = 0; v < nv && s == KILN_OK; v++)
        if (g->values[v].kind == KILN_VALUE_NODE && last[v] >= 0) {
            int32_t i = last[v];
            e->dead_after[i][count[i]++] = v;
            e->dead_after[i][count[i]] = -1;
        }
    free(last), free(count);
    return s;
}

/* The graph outputs a kernel can write straight into a caller's buffer (kiln_executable_run_into):
 * values that own their buffer (no view, not an input or capture) and are returned once. */
static void plan_direct_outputs(kiln_plan *e) {
    const kiln_graph *g = e->g;
    for (int32_t v = 0; v < g->nvalues; v++) e->direct_output[v] = -1;
    for (int32_t k = 0; k < g->noutputs; k++) {
        int32_t v = g->outputs[k];
        const kiln_value *val = &g->values[v];
        if (val->kind != KILN_VALUE_NODE || e->root[v] != v || is_alias_op(g->nodes[val->node].op)) continue;
        e->direct_output[v] = e->direct_output[v] == -1 ? k : -2; /* returned twice: copied */
    }
    for (int32_t v = 0; v < g->nvalues; v++)
        if (e->direct_output[v] == -2) e->direct_output[v] = -1;
}

/* ---- fused groups and control-flow bodies ------------------------------------------------- */

/* A fused node names one of the graph's subgraphs (backends make its kernel from it). */
static kiln_status check_fused(const kiln_plan *p, int32_t i) {
    const kiln_graph *g = p->g;
    const kiln_node *nd = &g->nodes[i];
    kiln_graph *sub;
    if (kiln_graph_body(g, nd, 0, &sub) != KILN_OK) return kiln_error_context(KILN_ERR_VALUE, "graph: fused node %d", i);
    return KILN_OK;
}

/* The nested plans of control-flow node i: its subgraphs, and a while's iteration composed. */
static kiln_status plan_bodies(kiln_plan *p, int32_t i, const kiln_compile_options *opt) {
    const kiln_graph *g = p->g;
    const kiln_node *n = &g->nodes[i];
    kiln_plan **bodies = &p->bodies[(int64_t)i * KILN_PLAN_BODIES];
    int slots[4], ns = kiln_control_slots(n->op, slots);
    kiln_graph *sub[4];
    for (int k = 0; k < ns; k++) {
        if (kiln_graph_body(g, n, k, &sub[k]) != KILN_OK) return kiln_error_context(KILN_ERR_VALUE, "graph: node %d", i);
        KILN_TRY(kiln_plan_build(sub[k], opt, &bodies[k]));
    }
    if (n->op != KILN_OP_WHILE || kiln_loop_nres(n->op, &n->attrs) > 0) /* (storing: steps write rows) */
        return KILN_OK;
    kiln_graph *step = NULL;
    KILN_TRY(kiln_plan_compose_loop_step(sub[0], sub[1], n->nout, &step));
    kiln_status s = kiln_plan_build(step, opt, &bodies[KILN_PLAN_STEP]);
    kiln_graph_free(step);
    return s;
}

/* ---- the peak of a candidate graph (the sublinear-memory search) ---------------------------- */

kiln_status kiln_plan_arena_bytes(const kiln_graph *g, kiln_exec_order order, size_t *peak) {
    int32_t nv = g->nvalues, nn = g->nnodes;
    kiln_plan e = {0};
    e.g = (kiln_graph *)g; /* read only: plan_memory and order_dfs never write the graph */
    e.norder = nn;
    e.order = kiln_malloc(sizeof(int32_t) * (size_t)(nn ? nn : 1));
    e.root = kiln_malloc(sizeof(int32_t) * (size_t)(nv ? nv : 1));
    e.last_use = kiln_malloc(sizeof(int32_t) * (size_t)(nv ? nv : 1));
    e.offset = kiln_malloc(sizeof(int64_t) * (size_t)(nv ? nv : 1));
    e.freed_after = kiln_calloc((size_t)(nn ? nn : 1), sizeof(int32_t *));
    kiln_status s = e.order && e.root && e.last_use && e.offset && e.freed_after
                        ? KILN_OK
                        : kiln_error(KILN_ERR_MEMORY, "out of memory planning a graph");
    if (s == KILN_OK && order == KILN_ORDER_DFS) s = order_dfs(g, e.order);
    else
        for (int32_t i = 0; i < nn; i++) e.order[i] = i;
    if (s == KILN_OK) s = plan_memory(&e);
    if (s == KILN_OK) *peak = e.arena_bytes;
    for (int32_t i = 0; e.freed_after && i < nn; i++) free(e.freed_after[i]);
    free(e.order), free(e.root), free(e.last_use), free(e.offset), free(e.freed_after), free(e.weight_cast);
    return s;
}

/* ---- building ----------------------------------------------------------------------------- */

static _Atomic int64_t plans_built, plans_bound;

void kiln_plan_counts(int64_t *built, int64_t *bound) {
    *built = atomic_load(&plans_built);
    *bound = atomic_load(&plans_bound);
}

/* The arrays of a plan of e->g (set). */
static kiln_status plan_alloc(kiln_plan *e, const kiln_compile_options *opt) {
    const kiln_graph *g = e->g;
    int32_t nv = g->nvalues, nn = g->nnodes;
    bool control = false;
    for (int32_t i = 0; i < nn; i++) control |= kiln_op_is_control(g->nodes[i].op);
    e->norder = nn;
    e->order = kiln_malloc(sizeof(int32_t) * (size_t)(nn ? nn : 1));
    e->root = kiln_malloc(sizeof(int32_t) * (size_t)(nv ? nv : 1));
    e->last_use = kiln_malloc(sizeof(int32_t) * (size_t)(nv ? nv : 1));
    e->offset = kiln_malloc(sizeof(int64_t) * (size_t)(nv ? nv : 1));
    e->dead_after = kiln_calloc((size_t)(nn ? nn : 1), sizeof(int32_t *));
    e->freed_after = kiln_calloc((size_t)(nn ? nn : 1), sizeof(int32_t *));
    e->bodies = control ? kiln_calloc((size_t)nn * KILN_PLAN_BODIES, sizeof(kiln_plan *)) : NULL;
    e->direct_output = kiln_malloc(sizeof(int32_t) * (size_t)(nv ? nv : 1));
    e->poison = opt && opt->poison_freed;
    if (!e->order || !e->root || !e->last_use || !e->offset || !e->dead_after || !e->freed_after ||
        (control && !e->bodies) || !e->direct_output)
        return kiln_error(KILN_ERR_MEMORY, "out of memory planning a graph");
    return KILN_OK;
}

/* The buffers of e at its graph's sizes, in its order: offsets, what goes after each step, the
 * outputs written directly. */
static kiln_status plan_buffers(kiln_plan *e) {
    KILN_TRY(plan_memory(e));
    KILN_TRY(plan_releases(e));
    plan_direct_outputs(e);
    return KILN_OK;
}

static kiln_status plan_build(const kiln_graph *g, const kiln_compile_options *opt, bool symbolic, kiln_plan **out) {
    KILN_TRY(kiln_graph_verify(g));
    if (!symbolic) KILN_TRY(kiln_graph_require_concrete(g, "plan"));
    kiln_plan *e = kiln_calloc(1, sizeof *e);
    if (!e) return kiln_error(KILN_ERR_MEMORY, "out of memory planning a graph");
    kiln_status s = kiln_graph_clone(g, &e->g);
    if (s != KILN_OK) {
        free(e);
        return s;
    }
    e->symbolic = kiln_graph_is_symbolic(g);
    if (e->symbolic)
        for (int32_t i = 0; i < g->nnodes && s == KILN_OK; i++)
            if (kiln_op_is_control(g->nodes[i].op))
                s = kiln_error(KILN_ERR_VALUE, "plan: %s in a graph with symbolic sizes is not supported",
                               kiln_op_table[g->nodes[i].op].name);
    if (s == KILN_OK) s = plan_alloc(e, opt);
    if (s != KILN_OK) {
        kiln_plan_free(e);
        return s;
    }
    atomic_fetch_add(&plans_built, 1);
    int32_t nn = g->nnodes;
    if (opt && opt->order == KILN_ORDER_DFS) {
        s = order_dfs(e->g, e->order);
    } else {
        for (int32_t i = 0; i < nn; i++) e->order[i] = i; /* the traced order is breadth-first enough */
    }
    for (int32_t i = 0; i < nn && s == KILN_OK; i++)
        if (kiln_op_is_control(e->g->nodes[i].op)) s = plan_bodies(e, i, opt);
    for (int32_t i = 0; i < nn && s == KILN_OK; i++)
        if (e->g->nodes[i].op == KILN_OP_FUSED) s = check_fused(e, i);
    if (s == KILN_OK) s = plan_buffers(e);
    if (s != KILN_OK) {
        kiln_plan_free(e);
        return s;
    }
    *out = e;
    return KILN_OK;
}

kiln_status kiln_plan_build(const kiln_graph *g, const kiln_compile_options *opt, kiln_plan **out) {
    return plan_build(g, opt, false, out);
}

kiln_status kiln_plan_build_symbolic(const kiln_graph *g, const kiln_compile_options *opt, kiln_plan **out) {
    return plan_build(g, opt, true, out);
}

kiln_status kiln_plan_bind(const kiln_plan *p, const int64_t *bindings, kiln_plan **out) {
    if (!p->symbolic) return kiln_error(KILN_ERR_VALUE, "plan: binding symbols of a plan without symbolic sizes");
    kiln_plan *e = kiln_calloc(1, sizeof *e);
    if (!e) return kiln_error(KILN_ERR_MEMORY, "out of memory planning a graph");
    kiln_status s = kiln_graph_instantiate(p->g, bindings, &e->g);
    if (s != KILN_OK) {
        free(e);
        return s;
    }
    s = plan_alloc(e, NULL);
    e->poison = p->poison;
    if (s == KILN_OK) memcpy(e->order, p->order, sizeof(int32_t) * (size_t)p->norder);
    if (s == KILN_OK) s = plan_buffers(e);
    if (s != KILN_OK) {
        kiln_plan_free(e);
        return kiln_error_context(s, "plan: binding a symbolic plan");
    }
    atomic_fetch_add(&plans_bound, 1);
    *out = e;
    return KILN_OK;
}

void kiln_plan_free(kiln_plan *p) {
    if (!p) return;
    int32_t nn = p->g ? p->g->nnodes : 0;
    for (int32_t i = 0; i < nn; i++) {
        if (p->dead_after) free(p->dead_after[i]);
        if (p->freed_after) free(p->freed_after[i]);
        for (int k = 0; p->bodies && k < KILN_PLAN_BODIES; k++) kiln_plan_free(p->bodies[(int64_t)i * KILN_PLAN_BODIES + k]);
    }
    kiln_graph_free(p->g);
    free(p->order), free(p->root), free(p->last_use), free(p->offset), free(p->dead_after), free(p->freed_after);
    free(p->bodies), free(p->direct_output), free(p->weight_cast);
    free(p);
}
