/* The weight casts a compiled graph keeps between calls (weight_cache.h). */
#include "weight_cache.h"

#include <stdatomic.h>

typedef struct {
    kiln_tensor *src;             /* the tensor last cast (a reference: its storage cannot be reused) */
    const kiln_storage *storage;  /* its storage then */
    int64_t version;              /* and that storage's version */
    kiln_tensor *buf;             /* the result (a reference), or NULL before the first call */
    bool valid;                   /* buf holds the cast of src at version */
} cache_entry;

struct kiln_weight_cache {
    const kiln_plan *p;
    cache_entry *entry; /* per node (weight casts only are used) */
};

static _Atomic int64_t cache_hits, cache_misses;

void kiln_weight_cache_counts(int64_t *hits, int64_t *misses) {
    *hits = atomic_load(&cache_hits);
    *misses = atomic_load(&cache_misses);
}

kiln_status kiln_weight_cache_new(const kiln_plan *p, kiln_weight_cache **out) {
    *out = NULL;
    if (!p->weight_cast) return KILN_OK;
    bool any = false;
    for (int32_t i = 0; i < p->g->nnodes; i++) any |= p->weight_cast[i];
    if (!any) return KILN_OK;
    kiln_weight_cache *c = kiln_calloc(1, sizeof *c);
    if (c) c->entry = kiln_calloc((size_t)p->g->nnodes, sizeof *c->entry);
    if (!c || !c->entry) {
        free(c);
        return kiln_error(KILN_ERR_MEMORY, "out of memory compiling a graph");
    }
    c->p = p;
    *out = c;
    return KILN_OK;
}

void kiln_weight_cache_free(kiln_weight_cache *c) {
    if (!c) return;
    for (int32_t i = 0; i < c->p->g->nnodes; i++) {
        kiln_tensor_release(c->entry[i].src);
        kiln_tensor_release(c->entry[i].buf);
    }
    free(c->entry);
    free(c);
}

kiln_status kiln_weight_cache_run(kiln_weight_cache *c, int32_t node, kiln_tensor *src, kiln_tensor *buffer,
                                  kiln_tensor **out) {
    cache_entry *e = &c->entry[node];
    const kiln_node *nd = &c->p->g->nodes[node];
    if (buffer && e->buf != buffer) { /* a backend's own buffer: what the entry held is not in it */
        kiln_tensor_retain(buffer);
        kiln_tensor_release(e->buf);
        e->buf = buffer;
        e->valid = false;
    }
    if (!e->buf) {
        KILN_TRY(kiln_tensor_empty_like_meta(&c->p->g->values[nd->out[0]].meta, &e->buf));
        e->valid = false;
    }
    kiln_tensor_keep_widened(e->buf); /* the fallback's products widen it once per version, not per call */
    bool complete = kiln_tensor_version_complete(src);
    if (e->valid && complete && e->src == src && kiln_tensor_same_version(src, e->storage, e->version)) {
        atomic_fetch_add_explicit(&cache_hits, 1, memory_order_relaxed);
    } else {
        e->valid = false;
        int64_t version = kiln_tensor_version(src); /* read before casting: a write during it is a new version */
        kiln_tensor *ins[1] = {src}, *outs[KILN_MAX_OUTPUTS] = {e->buf};
        KILN_TRY(kiln_op_table[nd->op].kernel(ins, 1, &nd->attrs, outs));
        kiln_tensor_bump_version(e->buf); /* new contents: a float32 copy kept of the old is stale */
        atomic_fetch_add_explicit(&cache_misses, 1, memory_order_relaxed);
        if (complete) {
            if (e->src != src) {
                kiln_tensor_retain(src);
                kiln_tensor_release(e->src);
                e->src = src;
            }
            e->storage = src->storage;
            e->version = version;
            e->valid = true;
        }
    }
    kiln_tensor_retain(e->buf);
    *out = e->buf;
    return KILN_OK;
}
