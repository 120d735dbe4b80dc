/* Writes a graph, its parameters and test cases as a kiln model file (docs/model_format.md).
 * Deterministic: the bytes depend only on the description (no times, no addresses, padding
 * zeroed). Value ids are renumbered in the file's order: inputs, captures, then node outputs. */
#include "../core/strbuf.h"
#include "model_format.h"
#include "symbolic.h"

#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

static inline uint64_t word_at(const uint8_t *p) {
    uint64_t x;
    memcpy(&x, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    x = __builtin_bswap64(x);
#endif
    return x;
}

uint64_t kiln_model_checksum(const uint8_t *b, size_t n) {
    uint64_t h[4] = {FNV_OFFSET, FNV_OFFSET ^ 1, FNV_OFFSET ^ 2, FNV_OFFSET ^ 3};
    size_t nw = n / 8, w = 0;
    for (; w < nw && w < KILN_MODEL_HEADER_BYTES / 8; w++) {
        uint64_t x = w == KILN_MODEL_AT_CHECKSUM / 8 ? 0 : word_at(b + 8 * w);
        h[w & 3] = (h[w & 3] ^ x) * FNV_PRIME;
    }
    for (; w + 4 <= nw; w += 4)
        for (int k = 0; k < 4; k++) h[k] = (h[k] ^ word_at(b + 8 * (w + (size_t)k))) * FNV_PRIME;
    for (; w < nw; w++) h[w & 3] = (h[w & 3] ^ word_at(b + 8 * w)) * FNV_PRIME;
    if (n % 8) {
        uint8_t tail[8] = {0};
        memcpy(tail, b + 8 * nw, n % 8);
        if (nw == KILN_MODEL_AT_CHECKSUM / 8) memset(tail, 0, sizeof tail);
        h[nw & 3] = (h[nw & 3] ^ word_at(tail)) * FNV_PRIME;
    }
    uint64_t r = (uint64_t)n;
    for (int k = 0; k < 4; k++) r = (r ^ h[k]) * FNV_PRIME;
    return r;
}

/* ---- a growing byte buffer ------------------------------------------------------------------ */

typedef struct {
    uint8_t *p;
    size_t n, cap;
    bool failed;
} bytes;

static void put(bytes *b, const void *src, size_t n) {
    if (b->failed) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n) cap *= 2;
        uint8_t *grown = kiln_realloc(b->p, cap);
        if (!grown) {
            b->failed = true;
            return;
        }
        b->p = grown, b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void put_u8(bytes *b, uint8_t v) { put(b, &v, 1); }
static void put_u32(bytes *b, uint32_t v) {
    uint8_t le[4];
    kiln_put_u32(le, v);
    put(b, le, 4);
}
static void put_u64(bytes *b, uint64_t v) {
    uint8_t le[8];
    kiln_put_u64(le, v);
    put(b, le, 8);
}
static void put_f64(bytes *b, double v) {
    uint64_t bits;
    memcpy(&bits, &v, 8);
    put_u64(b, bits);
}
static void put_str(bytes *b, const char *s) {
    size_t n = s ? strlen(s) : 0;
    put_u32(b, (uint32_t)n);
    put(b, s, n);
}
static void put_meta(bytes *b, const kiln_meta *m) {
    put_u8(b, (uint8_t)m->dtype);
    put_u8(b, (uint8_t)m->ndim);
    for (int d = 0; d < m->ndim; d++) put_u64(b, (uint64_t)m->shape[d]);
}

/* ---- the tensor table ------------------------------------------------------------------------- */

typedef struct {
    bytes meta, data;
    uint32_t ntensors;
    bytes table; /* the tensor records, written into meta once all are known */
} writer;

/* Appends t's values (contiguous, its dtype) to the data section; *index is its entry. */
static kiln_status add_tensor(writer *w, kiln_tensor *t, uint32_t *index) {
    kiln_tensor *c = NULL;
    KILN_TRY(kiln_to_contiguous(t, t->meta.dtype, &c));
    static const uint8_t zeros[KILN_MODEL_DATA_ALIGN];
    put(&w->data, zeros, (KILN_MODEL_DATA_ALIGN - w->data.n % KILN_MODEL_DATA_ALIGN) % KILN_MODEL_DATA_ALIGN);
    size_t nbytes = (size_t)c->numel * kiln_dtype_size(c->meta.dtype);
    put_meta(&w->table, &c->meta);
    put_u64(&w->table, (uint64_t)w->data.n);
    put_u64(&w->table, (uint64_t)nbytes);
    put(&w->data, c->data, nbytes);
    kiln_tensor_release(c);
    *index = w->ntensors++;
    return w->data.failed || w->table.failed ? kiln_error(KILN_ERR_MEMORY, "out of memory writing a model") : KILN_OK;
}

/* Every string of a file is UTF-8 text (the reader refuses any other). */
static kiln_status check_text(const char *s, const char *what, int32_t k) {
    if (!s || kiln_utf8_valid(s, strlen(s))) return KILN_OK;
    if (k < 0) return kiln_error(KILN_ERR_VALUE, "kiln_model_write: %s is not UTF-8 text", what);
    return kiln_error(KILN_ERR_VALUE, "kiln_model_write: %s %d is not UTF-8 text", what, (int)k);
}

/* ---- graphs ------------------------------------------------------------------------------------ */

/* Writes g; *ids (when not NULL) receives each value's id in the file (-1: left out), malloc'd. */
static kiln_status put_graph(writer *w, bytes *b, const kiln_graph *g, int depth, int32_t **ids) {
    if (depth > KILN_MODEL_MAX_DEPTH)
        return kiln_error(KILN_ERR_VALUE, "kiln_model_write: subgraphs nested more than %d deep", KILN_MODEL_MAX_DEPTH);
    if (g->nvalues > KILN_MODEL_MAX_VALUES)
        return kiln_error(KILN_ERR_VALUE, "kiln_model_write: a graph of %d values (at most %d)", g->nvalues,
                          KILN_MODEL_MAX_VALUES);
    int32_t *id = kiln_malloc(sizeof(int32_t) * (size_t)(g->nvalues ? g->nvalues : 1));
    bool *uses = kiln_calloc((size_t)(g->nvalues ? g->nvalues : 1), sizeof *uses); /* unread captures are left out */
    if (!id || !uses) {
        free(id), free(uses);
        return kiln_error(KILN_ERR_MEMORY, "out of memory writing a model");
    }
    int32_t next = 0, ncaptures = 0;
    kiln_status s = KILN_OK;
    for (int32_t v = 0; v < g->nvalues; v++) id[v] = -1;
    for (int32_t i = 0; i < g->nnodes; i++)
        for (int k = 0; k < g->nodes[i].nin; k++) uses[g->nodes[i].in[k]] = true;
    for (int32_t k = 0; k < g->noutputs; k++) uses[g->outputs[k]] = true;
    for (int32_t k = 0; k < g->ncaptures; k++) ncaptures += uses[g->captures[k]];
    put_u32(b, (uint32_t)g->ninputs);
    for (int32_t k = 0; k < g->ninputs; k++) {
        put_meta(b, &g->values[g->inputs[k]].meta);
        id[g->inputs[k]] = next++;
    }
    put_u32(b, (uint32_t)ncaptures);
    for (int32_t k = 0; k < g->ncaptures && s == KILN_OK; k++) {
        const kiln_value *v = &g->values[g->captures[k]];
        if (!uses[g->captures[k]]) continue;
        uint32_t t;
        s = add_tensor(w, v->bound, &t);
        put_u8(b, v->constant ? KILN_MODEL_CONSTANT : v->bound->requires_grad ? KILN_MODEL_PARAMETER : KILN_MODEL_CAPTURED);
        put_u32(b, t);
        id[g->captures[k]] = next++;
    }
    put_u32(b, (uint32_t)g->nlocs);
    for (int32_t k = 0; k < g->nlocs; k++) {
        if (s == KILN_OK) s = check_text(g->locs[k], "source location", k);
        put_str(b, g->locs[k]);
    }
    put_u32(b, (uint32_t)g->nsubgraphs);
    for (int32_t k = 0; k < g->nsubgraphs && s == KILN_OK; k++) s = put_graph(w, b, g->subgraphs[k], depth + 1, NULL);
    put_u32(b, (uint32_t)g->nnodes);
    for (int32_t i = 0; i < g->nnodes && s == KILN_OK; i++) {
        const kiln_node *n = &g->nodes[i];
        put_str(b, kiln_op_table[n->op].name);
        put_u32(b, (uint32_t)n->nin);
        for (int k = 0; k < n->nin; k++) put_u32(b, (uint32_t)id[n->in[k]]);
        put_u8(b, (uint8_t)n->attrs.ni);
        put_u8(b, (uint8_t)n->attrs.nf);
        for (int k = 0; k < n->attrs.ni; k++) put_u64(b, (uint64_t)n->attrs.i[k]);
        for (int k = 0; k < n->attrs.nf; k++) put_f64(b, n->attrs.f[k]);
        put_u32(b, (uint32_t)(n->loc >= 0 && n->loc < g->nlocs ? n->loc : -1));
        for (int k = 0; k < n->nout; k++) id[n->out[k]] = next++;
    }
    put_u32(b, (uint32_t)g->noutputs);
    for (int32_t k = 0; k < g->noutputs; k++) put_u32(b, (uint32_t)id[g->outputs[k]]);
    if (ids) *ids = id;
    else free(id);
    free(uses);
    if (s == KILN_OK && b->failed) s = kiln_error(KILN_ERR_MEMORY, "out of memory writing a model");
    return s;
}

static kiln_status check_names(const char *const *names, int32_t n, const char *what) {
    for (int32_t k = 0; names && k < n; k++) {
        size_t len = names[k] ? strlen(names[k]) : 0;
        if (len == 0 || len > KILN_MODEL_MAX_NAME)
            return kiln_error(KILN_ERR_VALUE, "kiln_model_write: %s name %d is empty or longer than %d bytes", what,
                              k, KILN_MODEL_MAX_NAME);
        if (!kiln_utf8_valid(names[k], len))
            return kiln_error(KILN_ERR_VALUE, "kiln_model_write: %s name %d is not UTF-8 text", what, k);
        for (int32_t j = 0; j < k; j++)
            if (strcmp(names[j], names[k]) == 0)
                return kiln_error(KILN_ERR_VALUE, "kiln_model_write: two %ss are named '%s'", what, names[k]);
    }
    return KILN_OK;
}

/* ---- the names section (version 2) ----------------------------------------------------------- */

typedef struct {
    int32_t id;
    const char *name;
} named;

static int by_id(const void *a, const void *b) {
    int32_t x = ((const named *)a)->id, y = ((const named *)b)->id;
    return (x > y) - (x < y);
}
static int by_name(const void *a, const void *b) { return strcmp(((const named *)a)->name, ((const named *)b)->name); }

/* Sorted by id, each name 1-4096 bytes and unique among them (else an error naming `what`). */
static kiln_status put_names(bytes *b, named *list, int32_t n, const char *what) {
    qsort(list, (size_t)n, sizeof *list, by_name);
    for (int32_t k = 0; k < n; k++) {
        size_t len = strlen(list[k].name);
        if (len == 0 || len > KILN_MODEL_MAX_NAME)
            return kiln_error(KILN_ERR_VALUE, "kiln_model_write: a %s name is empty or longer than %d bytes", what,
                              KILN_MODEL_MAX_NAME);
        if (!kiln_utf8_valid(list[k].name, len))
            return kiln_error(KILN_ERR_VALUE, "kiln_model_write: %s %d's name is not UTF-8 text", what, (int)list[k].id);
        if (k && strcmp(list[k - 1].name, list[k].name) == 0)
            return kiln_error(KILN_ERR_VALUE, "kiln_model_write: two %ss are named '%s'", what, list[k].name);
    }
    qsort(list, (size_t)n, sizeof *list, by_id);
    put_u32(b, (uint32_t)n);
    for (int32_t k = 0; k < n; k++) {
        put_u32(b, (uint32_t)list[k].id);
        put_str(b, list[k].name);
    }
    return KILN_OK;
}

/* The top-level graph's value names (ids in the file: id[v]), node names and priorities. */
static kiln_status put_names_section(bytes *b, const kiln_graph *g, const int32_t *id) {
    int32_t most = g->nvalues > g->nnodes ? g->nvalues : g->nnodes;
    named *list = kiln_malloc(sizeof *list * (size_t)(most ? most : 1));
    if (!list) return kiln_error(KILN_ERR_MEMORY, "out of memory writing a model");
    int32_t n = 0;
    for (int32_t v = 0; v < g->nvalues; v++) {
        const char *name = kiln_graph_value_name(g, v);
        if (name && id[v] >= 0) list[n++] = (named){id[v], name};
    }
    kiln_status s = put_names(b, list, n, "value");
    n = 0;
    for (int32_t i = 0; i < g->nnodes; i++)
        if (kiln_graph_node_name(g, i)) list[n++] = (named){i, kiln_graph_node_name(g, i)};
    if (s == KILN_OK) s = put_names(b, list, n, "node");
    free(list);
    bool any = false;
    for (int32_t i = 0; i < g->nnodes; i++) any |= kiln_graph_node_priority(g, i) != 0;
    put_u32(b, any ? (uint32_t)g->nnodes : 0);
    for (int32_t i = 0; i < g->nnodes && any; i++) put_u32(b, (uint32_t)kiln_graph_node_priority(g, i));
    return s;
}

static void put_io(bytes *b, const kiln_graph *g, const int32_t *values, int32_t n, const char *const *names,
                   const char *prefix) {
    put_u32(b, (uint32_t)n);
    for (int32_t k = 0; k < n; k++) {
        char name[32];
        snprintf(name, sizeof name, "%s%d", prefix, k);
        put_str(b, names ? names[k] : name);
        put_meta(b, &g->values[values[k]].meta);
    }
}

static kiln_status check_cases(const kiln_model_desc *d) {
    const kiln_graph *g = d->graph;
    int32_t per = g->ninputs + g->noutputs;
    if (d->ncases < 0 || (d->ncases && !d->cases)) return kiln_error(KILN_ERR_VALUE, "kiln_model_write: bad test cases");
    for (int32_t c = 0; c < d->ncases; c++)
        for (int32_t k = 0; k < per; k++) {
            const kiln_tensor *t = d->cases[(size_t)c * (size_t)per + (size_t)k];
            bool in = k < g->ninputs;
            const kiln_meta *want = &g->values[in ? g->inputs[k] : g->outputs[k - g->ninputs]].meta;
            if (!t || !kiln_meta_equal(&t->meta, want)) {
                char a[160], b[160];
                return kiln_error(KILN_ERR_VALUE, "kiln_model_write: test case %d %s %d is %s%s, the graph's is %s%s", c,
                                  in ? "input" : "output", in ? k : k - g->ninputs,
                                  t ? kiln_dtype_name(t->meta.dtype) : "missing", t ? kiln_shape_str(&t->meta, a, sizeof a) : "",
                                  kiln_dtype_name(want->dtype), kiln_shape_str(want, b, sizeof b));
            }
        }
    return KILN_OK;
}

kiln_status kiln_model_write(const kiln_model_desc *d, void **out, size_t *size) {
    *out = NULL;
    *size = 0;
    const kiln_graph *g = d->graph;
    KILN_TRY(kiln_graph_require_concrete(g, "model_write"));
    KILN_TRY(check_names(d->input_names, g->ninputs, "input"));
    KILN_TRY(check_names(d->output_names, g->noutputs, "output"));
    KILN_TRY(check_cases(d));
    if (d->name && (!*d->name || strlen(d->name) > KILN_MODEL_MAX_NAME))
        return kiln_error(KILN_ERR_VALUE, "kiln_model_write: the graph's name is empty or longer than %d bytes",
                          KILN_MODEL_MAX_NAME);
    KILN_TRY(check_text(d->name, "the graph's name", -1));
    KILN_TRY(check_text(d->metadata, "the metadata", -1));
    KILN_TRY(check_text(d->user_info, "the user info", -1));
    for (int32_t k = 0; d->input_names && d->output_names && k < g->ninputs; k++)
        for (int32_t j = 0; j < g->noutputs; j++)
            if (strcmp(d->input_names[k], d->output_names[j]) == 0)
                return kiln_error(KILN_ERR_VALUE, "kiln_model_write: an input and an output are both named '%s'",
                                  d->input_names[k]);
    writer w = {0};
    bytes *m = &w.meta;
    char producer[64];
    snprintf(producer, sizeof producer, "kiln %s", "0.1.0");
    put_str(m, producer);
    put_str(m, d->name ? d->name : KILN_MODEL_DEFAULT_NAME);
    put_str(m, d->metadata);
    put_str(m, d->user_info);
    put_io(m, g, g->inputs, g->ninputs, d->input_names, "input");
    put_io(m, g, g->outputs, g->noutputs, d->output_names, "output");
    bytes graph = {0};
    int32_t *ids = NULL;
    kiln_status s = put_graph(&w, &graph, g, 0, &ids);
    put_u32(&graph, (uint32_t)d->ncases);
    int32_t per = g->ninputs + g->noutputs;
    for (int32_t c = 0; c < d->ncases && s == KILN_OK; c++)
        for (int32_t k = 0; k < per && s == KILN_OK; k++) {
            uint32_t t;
            s = add_tensor(&w, d->cases[(size_t)c * (size_t)per + (size_t)k], &t);
            put_u32(&graph, t);
        }
    if (s == KILN_OK) s = put_names_section(&graph, g, ids);
    free(ids);
    /* meta: strings, io, the tensor table, then the graph and the cases */
    put_u32(m, w.ntensors);
    put(m, w.table.p, w.table.n);
    put(m, graph.p, graph.n);
    free(graph.p);
    free(w.table.p);
    if (s == KILN_OK && (m->failed || w.data.failed || graph.failed))
        s = kiln_error(KILN_ERR_MEMORY, "out of memory writing a model");
    size_t data_offset = KILN_MODEL_HEADER_BYTES + m->n;
    data_offset = (data_offset + KILN_MODEL_DATA_ALIGN - 1) / KILN_MODEL_DATA_ALIGN * KILN_MODEL_DATA_ALIGN;
    size_t data_size = (w.data.n + KILN_MODEL_DATA_ALIGN - 1) / KILN_MODEL_DATA_ALIGN * KILN_MODEL_DATA_ALIGN;
    size_t total = data_offset + data_size; /* a multiple of 64: the next graph of the file starts aligned */
    uint8_t *file = s == KILN_OK ? kiln_calloc(1, total) : NULL;
    if (s == KILN_OK && !file) s = KILN_ERR_MEMORY;
    if (s == KILN_OK) {
        memcpy(file, KILN_MODEL_MAGIC, 8);
        kiln_put_u32(file + KILN_MODEL_AT_VERSION, KILN_MODEL_VERSION);
        kiln_put_u32(file + KILN_MODEL_AT_FLAGS, 0);
        kiln_put_u64(file + KILN_MODEL_AT_FILE_SIZE, total);
        kiln_put_u64(file + KILN_MODEL_AT_META_OFFSET, KILN_MODEL_HEADER_BYTES);
        kiln_put_u64(file + KILN_MODEL_AT_META_SIZE, m->n);
        kiln_put_u64(file + KILN_MODEL_AT_DATA_OFFSET, data_offset);
        kiln_put_u64(file + KILN_MODEL_AT_DATA_SIZE, data_size);
        memcpy(file + KILN_MODEL_HEADER_BYTES, m->p, m->n);
        if (w.data.n) memcpy(file + data_offset, w.data.p, w.data.n);
        kiln_put_u64(file + KILN_MODEL_AT_CHECKSUM, kiln_model_checksum(file, total));
        *out = file;
        *size = total;
    }
    free(m->p);
    free(w.data.p);
    return s;
}
