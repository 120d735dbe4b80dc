/* The kernel-by-kernel executor ("kbk"): a graph compiled into a node order and a static
 * memory plan, run by calling each node's kernel directly (no inference, no autograd, no
 * dispatch at run time).
 *
 * Memory plan (ggml-alloc's rules): every intermediate that owns its buffer gets a block of one
 * arena, freed after the last use of the buffer (through any view of it); an elementwise node
 * writes in place into an input buffer that dies with it when shapes and dtypes match; buffers
 * that graph outputs live in are never planned (they are allocated per call and handed out). */
#include <pthread.h>

#include "../codegen/fused.h"
#include "../core/internal.h"
#include "../ir/control.h"
#include "plan.h"
#include "../ir/layout.h"

#include "kiln/graph.h"

typedef struct {
    int64_t offset, size;
} block;

struct kiln_executable {
    kiln_graph *g;
    int32_t *order, norder;
    int32_t *root;         /* per value: the value whose buffer it lives in (itself unless a view/alias) */
    int32_t *root_end;     /* per root: the step after which its buffer is dead (norder: never) */
    int64_t *offset;       /* per value: arena offset of its buffer, -1 when not planned */
    kiln_tensor **planned; /* per value: its tensor over the arena (planned roots only) */
    kiln_tensor **slot;    /* per value: the tensor of the current run */
    int32_t **dead_after;  /* per step: values whose run-time tensors can go after it (-1 terminated) */
    int32_t **freed_after; /* per step: planned buffers given back after it (-1 terminated) */
    kiln_fused_kernel **fused; /* per node: the kernel of a fused group */
    kiln_control_node **control; /* per node: the compiled subgraphs of an if / while */
    int32_t *direct_output; /* per value: the graph output a run_into call computes it into directly, or -1 */
    char *arena;
    size_t arena_bytes, output_bytes;
    bool poison;
    pthread_mutex_t lock;  /* one run at a time: the arena and slots are shared */
};

static bool is_alias_op(kiln_op op) { return kiln_op_table[op].flags & (KILN_OPF_VIEW | KILN_OPF_MUTATES); }

static size_t meta_bytes(const kiln_meta *m) {
    return (size_t)kiln_meta_numel(m) * kiln_dtype_size(m->dtype);
}

#define FUSED_MAX_INPUTS 32 /* layouts passed to fused kernels (the fusion pass makes no more inputs) */

/* A fused node's kernel, generated for the layouts its inputs have when the graph runs. */
static kiln_status prepare_fused(const kiln_graph *g, int32_t i, kiln_fused_kernel **out) {
    const kiln_node *nd = &g->nodes[i];
    int64_t strides[FUSED_MAX_INPUTS][KILN_MAX_DIMS];
    const int64_t *hints[FUSED_MAX_INPUTS];
    for (int k = 0; k < nd->nin && k < FUSED_MAX_INPUTS; k++)
        hints[k] = kiln_graph_value_strides(g, nd->in[k], strides[k]) ? strides[k] : NULL;
    return kiln_fused_prepare_strided(g->subgraphs[nd->attrs.i[0]], nd->nin <= FUSED_MAX_INPUTS ? hints : NULL, out);
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
    bool *done = calloc((size_t)(n ? n : 1), sizeof *done);
    int32_t *stack = malloc(sizeof(int32_t) * (size_t)(edges + n + 1));
    if (!done || !stack) {
        free(done), free(stack);
        return kiln_error(KILN_ERR_MEMORY, "out of memory ordering a graph");
    }
    int32_t seg_begin = 0;
    for (int32_t i = 0; i <= n; i++) {
        bool barrier = i == n || (kiln_op_table[g->nodes[i].op].flags &
                                  (KILN_OPF_MUTATES | KILN_OPF_RANDOM | KILN_OPF_WRITES_ANY | KILN_OPF_EFFECT));
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

/* ---- planning ---------------------------------------------------------------------------- */

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
        block *grown = realloc(a->free_blocks, sizeof *grown * (size_t)ncap);
        if (!grown) return kiln_error(KILN_ERR_MEMORY, "out of memory planning memory");
        a->free_blocks = grown;
        a->cap = ncap;
    }
    a->free_blocks[a->nfree++] = (block){offset, size};
    return KILN_OK;
}

static bool same_meta(const kiln_meta *a, const kiln_meta *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}

/* Appends root r to the buffers given back after step i. */
static kiln_status note_freed(kiln_executable *e, int32_t i, int32_t r) {
    int32_t n = 0;
    while (e->freed_after[i] && e->freed_after[i][n] >= 0) n++;
    int32_t *grown = realloc(e->freed_after[i], sizeof(int32_t) * (size_t)(n + 2));
    if (!grown) return kiln_error(KILN_ERR_MEMORY, "out of memory planning memory");
    grown[n] = r;
    grown[n + 1] = -1;
    e->freed_after[i] = grown;
    return KILN_OK;
}

static kiln_status plan(kiln_executable *e) {
    const kiln_graph *g = e->g;
    int32_t nv = g->nvalues;
    bool *output_root = calloc((size_t)(nv ? nv : 1), sizeof(bool));
    arena_plan a = {0};
    kiln_status s = KILN_OK;
    if (!output_root) {
        s = kiln_error(KILN_ERR_MEMORY, "out of memory planning memory");
        goto done;
    }
    for (int32_t v = 0; v < nv; v++) {
        const kiln_value *val = &g->values[v];
        e->root[v] = v;
        if (val->kind == KILN_VALUE_NODE && is_alias_op(g->nodes[val->node].op) && val->index == 0)
            e->root[v] = e->root[g->nodes[val->node].in[0]]; /* values are numbered in trace order */
        e->root_end[v] = -1;
        e->offset[v] = -1;
    }
    for (int32_t k = 0; k < g->noutputs; k++) output_root[e->root[g->outputs[k]]] = true;
    for (int32_t i = 0; i < e->norder; i++) {
        const kiln_node *nd = &g->nodes[e->order[i]];
        for (int k = 0; k < nd->nin; k++) {
            int32_t r = e->root[nd->in[k]];
            if (e->root_end[r] < i) e->root_end[r] = i;
        }
        for (int k = 0; k < nd->nout; k++) {
            int32_t r = e->root[nd->out[k]];
            if (e->root_end[r] < i) e->root_end[r] = i;
        }
    }
    for (int32_t v = 0; v < nv; v++)
        if (output_root[v] || g->values[v].kind != KILN_VALUE_NODE) e->root_end[v] = e->norder;
    /* walk the order, handing out and taking back blocks */
    for (int32_t i = 0; i < e->norder && s == KILN_OK; i++) {
        const kiln_node *nd = &g->nodes[e->order[i]];
        if (is_alias_op(nd->op)) continue;
        for (int k = 0; k < nd->nout && s == KILN_OK; k++) {
            int32_t v = nd->out[k];
            if (output_root[v]) continue;
            int64_t size = (int64_t)meta_bytes(&g->values[v].meta);
            /* in place: an elementwise input whose buffer dies here, same dtype and shape */
            if (kiln_op_table[nd->op].fusion == KILN_FUSE_ELEMENTWISE && nd->op != KILN_OP_CAST) {
                for (int j = 0; j < nd->nin; j++) {
                    int32_t in = nd->in[j];
                    bool other_view = false; /* a view of the buffer read alongside would see writes */
                    for (int j2 = 0; j2 < nd->nin; j2++)
                        other_view |= nd->in[j2] != in && e->root[nd->in[j2]] == in;
                    if (e->root[in] == in && e->offset[in] >= 0 && e->root_end[in] == i && !other_view &&
                        same_meta(&g->values[in].meta, &g->values[v].meta)) {
                        e->offset[v] = e->offset[in];
                        e->root_end[in] = -1; /* the block now belongs to v */
                        break;
                    }
                }
            }
            if (e->offset[v] < 0) s = arena_take(&a, size, &e->offset[v]);
        }
        /* buffers whose last use was this step go back */
        for (int k = 0; k < nd->nin && s == KILN_OK; k++) {
            int32_t r = e->root[nd->in[k]];
            if (e->root_end[r] == i && e->offset[r] >= 0) {
                s = arena_give(&a, e->offset[r], (int64_t)meta_bytes(&g->values[r].meta));
                e->root_end[r] = -2; /* given back */
                if (s == KILN_OK) s = note_freed(e, i, r);
            }
        }
        for (int k = 0; k < nd->nout && s == KILN_OK; k++) { /* produced and never used */
            int32_t r = nd->out[k];
            if (e->root[r] == r && e->root_end[r] == i && e->offset[r] >= 0) {
                s = arena_give(&a, e->offset[r], (int64_t)meta_bytes(&g->values[r].meta));
                e->root_end[r] = -2;
                if (s == KILN_OK) s = note_freed(e, i, r);
            }
        }
    }
    e->arena_bytes = (size_t)a.top;
    for (int32_t k = 0; k < g->noutputs; k++)
        if (e->root[g->outputs[k]] == g->outputs[k] && g->values[g->outputs[k]].kind == KILN_VALUE_NODE)
            e->output_bytes += meta_bytes(&g->values[g->outputs[k]].meta);
done:
    free(output_root), free(a.free_blocks);
    return s;
}

/* Per step, the values whose run-time tensors can be dropped after it (for views and per-call
 * buffers), and the planned buffers to poison in debug mode. */
static kiln_status plan_releases(kiln_executable *e) {
    const kiln_graph *g = e->g;
    int32_t nv = g->nvalues;
    int32_t *last = malloc(sizeof(int32_t) * (size_t)(nv ? nv : 1));
    int32_t *count = calloc((size_t)(e->norder ? e->norder : 1), sizeof(int32_t));
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
        e->dead_after[i] = malloc(sizeof(int32_t) * (size_t)(count[i] + 1));
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
static void plan_direct_outputs(kiln_executable *e) {
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

kiln_status kiln_compile(const kiln_graph *g, const kiln_compile_options *opt, kiln_executable **out) {
    KILN_TRY(kiln_graph_verify(g));
    kiln_executable *e = calloc(1, sizeof *e);
    if (!e) return kiln_error(KILN_ERR_MEMORY, "out of memory compiling a graph");
    pthread_mutex_init(&e->lock, NULL);
    kiln_status s = kiln_graph_clone(g, &e->g);
    if (s != KILN_OK) {
        free(e);
        return s;
    }
    int32_t nv = g->nvalues, nn = g->nnodes;
    e->norder = nn;
    e->order = malloc(sizeof(int32_t) * (size_t)(nn ? nn : 1));
    e->root = malloc(sizeof(int32_t) * (size_t)(nv ? nv : 1));
    e->root_end = malloc(sizeof(int32_t) * (size_t)(nv ? nv : 1));
    e->offset = malloc(sizeof(int64_t) * (size_t)(nv ? nv : 1));
    e->planned = calloc((size_t)(nv ? nv : 1), sizeof(kiln_tensor *));
    e->slot = calloc((size_t)(nv ? nv : 1), sizeof(kiln_tensor *));
    e->dead_after = calloc((size_t)(nn ? nn : 1), sizeof(int32_t *));
    e->freed_after = calloc((size_t)(nn ? nn : 1), sizeof(int32_t *));
    e->fused = calloc((size_t)(nn ? nn : 1), sizeof(kiln_fused_kernel *));
    e->control = calloc((size_t)(nn ? nn : 1), sizeof(kiln_control_node *));
    e->direct_output = malloc(sizeof(int32_t) * (size_t)(nv ? nv : 1));
    e->poison = opt && opt->poison_freed;
    if (!e->order || !e->root || !e->root_end || !e->offset || !e->planned || !e->slot || !e->dead_after ||
        !e->freed_after || !e->fused || !e->control || !e->direct_output) {
        kiln_executable_free(e);
        return kiln_error(KILN_ERR_MEMORY, "out of memory compiling a graph");
    }
    if (opt && opt->order == KILN_ORDER_DFS) {
        s = order_dfs(e->g, e->order);
    } else {
        for (int32_t i = 0; i < nn; i++) e->order[i] = i; /* the traced order is breadth-first enough */
    }
    for (int32_t i = 0; i < nn && s == KILN_OK; i++)
        if (kiln_op_is_control(e->g->nodes[i].op)) s = kiln_control_prepare(e->g, &e->g->nodes[i], opt, &e->control[i]);
    for (int32_t i = 0; i < nn && s == KILN_OK; i++) {
        const kiln_node *nd = &e->g->nodes[i];
        if (nd->op != KILN_OP_FUSED) continue;
        if (nd->attrs.i[0] < 0 || nd->attrs.i[0] >= e->g->nsubgraphs)
            s = kiln_error(KILN_ERR_VALUE, "graph: fused node %d names subgraph %lld, which does not exist", i,
                           (long long)nd->attrs.i[0]);
        else
            s = prepare_fused(e->g, i, &e->fused[i]);
    }
    for (int32_t i = 0; i < nn && s == KILN_OK; i++)
        if (e->fused[i]) { /* the graph's groups build together now, as part of compiling */
            kiln_fused_build_waiting();
            break;
        }
    if (s == KILN_OK) s = plan(e);
    if (s == KILN_OK) s = plan_releases(e);
    if (s == KILN_OK) plan_direct_outputs(e);
    if (s == KILN_OK && e->arena_bytes) {
        e->arena = kiln_alloc(e->arena_bytes);
        if (!e->arena) s = KILN_ERR_MEMORY;
    }
    for (int32_t v = 0; v < nv && s == KILN_OK; v++) {
        if (e->offset[v] < 0) continue;
        const kiln_meta *m = &e->g->values[v].meta;
        s = kiln_tensor_wrap(m->dtype, m->ndim, m->shape, NULL, e->arena + e->offset[v], NULL, NULL, &e->planned[v]);
    }
    if (s != KILN_OK) {
        kiln_executable_free(e);
        return s;
    }
    *out = e;
    return KILN_OK;
}

void kiln_executable_free(kiln_executable *e) {
    if (!e) return;
    int32_t nv = e->g ? e->g->nvalues : 0;
    for (int32_t v = 0; v < nv; v++) {
        if (e->planned) kiln_tensor_release(e->planned[v]);
        if (e->slot) kiln_tensor_release(e->slot[v]);
    }
    for (int32_t i = 0; e->dead_after && i < e->norder; i++) free(e->dead_after[i]);
    for (int32_t i = 0; e->freed_after && i < e->norder; i++) free(e->freed_after[i]);
    free(e->freed_after);
    for (int32_t i = 0; e->fused && i < e->norder; i++) kiln_fused_free(e->fused[i]);
    free(e->fused);
    for (int32_t i = 0; e->control && i < e->norder; i++) kiln_control_free(e->control[i]);
    free(e->control);
    if (e->arena) kiln_free(e->arena);
    kiln_graph_free(e->g);
    free(e->order), free(e->root), free(e->root_end), free(e->offset), free(e->planned), free(e->slot);
    free(e->dead_after), free(e->direct_output);
    pthread_mutex_destroy(&e->lock);
    free(e);
}

int kiln_executable_num_outputs(const kiln_executable *e) { return e->g->noutputs; }
size_t kiln_executable_arena_bytes(const kiln_executable *e) { return e->arena_bytes; }
size_t kiln_executable_output_bytes(const kiln_executable *e) { return e->output_bytes; }

char *kiln_executable_order_string(const kiln_executable *e) {
    size_t len = 1;
    for (int32_t i = 0; i < e->norder; i++) len += strlen(kiln_op_table[e->g->nodes[e->order[i]].op].name) + 1;
    char *s = malloc(len);
    if (!s) return NULL;
    s[0] = '\0';
    for (int32_t i = 0; i < e->norder; i++) {
        if (i) strcat(s, " ");
        strcat(s, kiln_op_table[e->g->nodes[e->order[i]].op].name);
    }
    return s;
}

/* ---- running ------------------------------------------------------------------------------ */

static void poison(kiln_tensor *t) {
    if (kiln_dtype_is_float(t->meta.dtype)) memset(t->data, 0xff, (size_t)t->numel * kiln_dtype_size(t->meta.dtype));
}

/* Node values' slots hold references; inputs' and captures' borrow (the caller and the graph hold them). */
static void clear_slots(kiln_executable *e) {
    for (int32_t v = 0; v < e->g->nvalues; v++) {
        if (e->g->values[v].kind == KILN_VALUE_NODE) kiln_tensor_release(e->slot[v]);
        e->slot[v] = NULL;
    }
}

/* outputs receive new references; or, when `into` is given, the results are written into into[]. */
static kiln_status run_locked(kiln_executable *e, int nin, kiln_tensor *const *inputs, int nout,
                              kiln_tensor **outputs, kiln_tensor *const *into) {
    const kiln_graph *g = e->g;
    if (nin != g->ninputs || nout != g->noutputs)
        return kiln_error(KILN_ERR_VALUE, "graph: expected %d inputs and %d outputs, got %d and %d", g->ninputs,
                          g->noutputs, nin, nout);
    for (int k = 0; k < nin; k++) {
        const kiln_meta *want = &g->values[g->inputs[k]].meta;
        if (!same_meta(want, &inputs[k]->meta)) {
            char a[160], b[160];
            return kiln_error(KILN_ERR_VALUE, "graph: input %d is %s %s, the graph was compiled for %s %s", k,
                              kiln_dtype_name(inputs[k]->meta.dtype), kiln_shape_str(&inputs[k]->meta, a, sizeof a),
                              kiln_dtype_name(want->dtype), kiln_shape_str(want, b, sizeof b));
        }
    }
    for (int k = 0; k < nin; k++) e->slot[g->inputs[k]] = inputs[k];
    for (int32_t c = 0; c < g->ncaptures; c++) e->slot[g->captures[c]] = g->values[g->captures[c]].bound;
    kiln_status s = KILN_OK;
    kiln_tensor *small_in[8], **ins = small_in;
    int cap_in = 8;
    for (int32_t i = 0; i < e->norder && s == KILN_OK; i++) {
        const kiln_node *nd = &g->nodes[e->order[i]];
        const kiln_op_info *info = &kiln_op_table[nd->op];
        if (nd->nin > cap_in) {
            kiln_tensor **grown = malloc(sizeof *grown * (size_t)nd->nin);
            if (!grown) {
                s = kiln_error(KILN_ERR_MEMORY, "out of memory running a graph");
                break;
            }
            if (ins != small_in) free(ins);
            ins = grown;
            cap_in = nd->nin;
        }
        for (int k = 0; k < nd->nin; k++) ins[k] = e->slot[nd->in[k]];
        kiln_tensor *outs[KILN_MAX_OUTPUTS] = {0};
        if (!(info->flags & (KILN_OPF_VIEW | KILN_OPF_MUTATES))) {
            for (int k = 0; k < nd->nout && s == KILN_OK; k++) {
                int32_t v = nd->out[k];
                if (e->planned[v]) {
                    kiln_tensor_retain(e->planned[v]);
                    outs[k] = e->planned[v];
                } else if (into && e->direct_output[v] >= 0) {
                    outs[k] = into[e->direct_output[v]];
                    kiln_tensor_retain(outs[k]);
                } else {
                    s = kiln_tensor_empty_like_meta(&g->values[v].meta, &outs[k]);
                }
            }
        }
        if (s == KILN_OK) {
            kiln_fused_kernel *fk = e->fused[e->order[i]];
            kiln_control_node *cf = e->control[e->order[i]];
            s = fk ? kiln_fused_run(fk, nd->nin, ins, outs[0])
                   : cf ? kiln_control_run(cf, nd->nin, ins, nd->nout, outs) : info->kernel(ins, nd->nin, &nd->attrs, outs);
        }
        if (s == KILN_OK && (info->flags & KILN_OPF_MUTATES)) kiln_tensor_bump_version(ins[0]);
        if (s != KILN_OK) {
            kiln_release_all(outs, nd->nout);
            if (nd->loc >= 0) kiln_error_context(s, "%s (%s)", info->name, g->locs[nd->loc]);
            else kiln_error_context(s, "%s", info->name);
            break;
        }
        for (int k = 0; k < nd->nout; k++) e->slot[nd->out[k]] = outs[k];
        for (const int32_t *d = e->dead_after[i]; *d >= 0; d++) {
            kiln_tensor_release(e->slot[*d]);
            e->slot[*d] = NULL;
        }
        if (e->poison && e->freed_after[i])
            for (const int32_t *f = e->freed_after[i]; *f >= 0; f++) poison(e->planned[*f]);
    }
    if (ins != small_in) free(ins);
    for (int k = 0; k < nout && s == KILN_OK && into; k++)
        if (e->slot[g->outputs[k]] != into[k]) s = kiln_copy_into(into[k], e->slot[g->outputs[k]]);
    for (int k = 0; k < nout && s == KILN_OK && !into; k++) {
        s = kiln_output_hand_out(&g->values[e->root[g->outputs[k]]], e->slot[g->outputs[k]], &outputs[k]);
        if (s != KILN_OK) kiln_release_all(outputs, k);
    }
    clear_slots(e);
    return s;
}

kiln_status kiln_executable_run(kiln_executable *e, int nin, kiln_tensor *const *inputs, int nout,
                                kiln_tensor **outputs) {
    pthread_mutex_lock(&e->lock);
    kiln_status s = run_locked(e, nin, inputs, nout, outputs, NULL);
    pthread_mutex_unlock(&e->lock);
    return s;
}

kiln_status kiln_executable_run_into(kiln_executable *e, int nin, kiln_tensor *const *inputs, int nout,
                                     kiln_tensor *const *into) {
    for (int k = 0; k < nout && k < e->g->noutputs; k++)
        if (!same_meta(&e->g->values[e->g->outputs[k]].meta, &into[k]->meta) || !kiln_tensor_is_contiguous(into[k]))
            return kiln_error(KILN_ERR_VALUE, "graph: output buffer %d does not match the graph's output", k);
    pthread_mutex_lock(&e->lock);
    kiln_status s = run_locked(e, nin, inputs, nout, NULL, into);
    pthread_mutex_unlock(&e->lock);
    return s;
}

/* ---- the plan, for the sink backend (src/runtime/sink.c) ------------------------------------ */

kiln_status kiln_output_hand_out(const kiln_value *root, kiln_tensor *t, kiln_tensor **out) {
    if (!(root->kind == KILN_VALUE_CAPTURED && root->constant)) {
        kiln_tensor_retain(t);
        *out = t;
        return KILN_OK;
    }
    /* a view of a compile-time constant: the caller gets its own copy, never the graph's */
    kiln_tensor *copy = NULL;
    kiln_status s = kiln_tensor_empty(t->meta.dtype, t->meta.ndim, t->meta.shape, &copy);
    if (s == KILN_OK) s = kiln_copy_into(copy, t);
    if (s != KILN_OK) {
        kiln_tensor_release(copy);
        return s;
    }
    *out = copy;
    return KILN_OK;
}

void kiln_executable_get_plan(const kiln_executable *e, kiln_exec_plan *out) {
    out->g = e->g;
    out->order = e->order;
    out->norder = e->norder;
    out->planned = e->planned;
    out->fused = e->fused;
    out->freed_after = e->freed_after;
}
