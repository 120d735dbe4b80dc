/* Reads kiln model files (docs/model_format.md). Every file is hostile: each count, length,
 * offset, dtype, shape, op and attribute is range-checked before it is used, counts are bounded
 * by the bytes left to hold them before anything is allocated for them, and errors are
 * KILN_ERR_VALUE messages starting "kiln file" that name what is wrong. The graph is rebuilt
 * through kiln_graph_add_* (which infer and check every node, as for the text parser) and
 * verified. Parameters stay in the model's one aligned copy of the file's bytes: a file is read, never
 * mapped, so rewriting, truncating or deleting it after the load changes nothing the model computes. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/strbuf.h"
#include "model_format.h"

/* The model's copy of the file's bytes, shared by the model and every tensor viewing it. */
typedef struct blob {
    _Atomic int64_t refs;
    uint8_t *base;
    size_t size;
} blob;

static void blob_release(void *ctx) {
    blob *b = ctx;
    if (atomic_fetch_sub(&b->refs, 1) != 1) return;
    kiln_free(b->base);
    free(b);
}

struct kiln_model {
    kiln_graph *graph;
    int32_t version, index, ngraphs;
    char *name;
    char **graph_names; /* ngraphs: the file's graphs */
    int32_t nin, nout;
    char **names; /* nin input names, then nout output names */
    kiln_meta *metas;
    char *producer, *metadata, *user_info;
    uint32_t ntensors;
    kiln_tensor **tensors;
    int32_t ncases;
    uint32_t *cases; /* ncases * (nin + nout) tensor indices */
    size_t data_bytes, param_bytes;
    bool *is_param;
    blob *blob;
};

/* ---- a bounds-checked cursor over the metadata section -------------------------------------- */

typedef struct {
    const uint8_t *p;
    size_t n, pos;
    size_t base; /* file offset of p[0], for messages */
} cursor;

static kiln_status bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static kiln_status bad(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kiln_error(KILN_ERR_VALUE, "kiln file: %s", msg);
}

static size_t left(const cursor *c) { return c->n - c->pos; }

static kiln_status need(const cursor *c, size_t n, const char *what) {
    if (left(c) < n)
        return bad("truncated metadata: %s at offset %zu needs %zu bytes, %zu are left", what, c->base + c->pos, n,
                   left(c));
    return KILN_OK;
}

static kiln_status rd_u8(cursor *c, const char *what, uint8_t *v) {
    KILN_TRY(need(c, 1, what));
    *v = c->p[c->pos++];
    return KILN_OK;
}
static kiln_status rd_u32(cursor *c, const char *what, uint32_t *v) {
    KILN_TRY(need(c, 4, what));
    *v = kiln_get_u32(c->p + c->pos);
    c->pos += 4;
    return KILN_OK;
}
static kiln_status rd_u64(cursor *c, const char *what, uint64_t *v) {
    KILN_TRY(need(c, 8, what));
    *v = kiln_get_u64(c->p + c->pos);
    c->pos += 8;
    return KILN_OK;
}

/* A count of items of at least `item` bytes each: no more than the bytes left can hold, nor max. */
static kiln_status rd_count(cursor *c, const char *what, size_t item, uint32_t max, uint32_t *n) {
    size_t at = c->base + c->pos;
    KILN_TRY(rd_u32(c, what, n));
    if (*n > max) return bad("%s at offset %zu is %u, at most %u are allowed", what, at, *n, max);
    if (item && *n > left(c) / item)
        return bad("%s at offset %zu is %u, but only %zu bytes are left for them (at least %zu each)", what, at, *n,
                   left(c), item);
    return KILN_OK;
}

/* A length-prefixed UTF-8 string without NUL bytes (malloc'd, NUL-terminated). */
static kiln_status rd_str(cursor *c, const char *what, uint32_t max, char **out) {
    *out = NULL;
    uint32_t n;
    KILN_TRY(rd_count(c, what, 1, max, &n));
    if (memchr(c->p + c->pos, 0, n)) return bad("%s at offset %zu holds a NUL byte", what, c->base + c->pos);
    if (!kiln_utf8_valid((const char *)c->p + c->pos, n))
        return bad("%s at offset %zu is not UTF-8 text", what, c->base + c->pos);
    char *s = kiln_malloc((size_t)n + 1);
    if (!s) return KILN_ERR_MEMORY;
    memcpy(s, c->p + c->pos, n);
    s[n] = '\0';
    c->pos += n;
    *out = s;
    return KILN_OK;
}

static kiln_status rd_meta(cursor *c, const char *what, kiln_meta *m) {
    uint8_t dtype, ndim;
    size_t at = c->base + c->pos;
    KILN_TRY(rd_u8(c, what, &dtype));
    KILN_TRY(rd_u8(c, what, &ndim));
    if (dtype >= KILN_DTYPE_COUNT) return bad("%s at offset %zu has unknown dtype %u", what, at, dtype);
    if (ndim > KILN_MAX_DIMS) return bad("%s at offset %zu has %u dimensions (at most %d)", what, at, ndim, KILN_MAX_DIMS);
    m->dtype = (kiln_dtype)dtype;
    m->ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        uint64_t v;
        KILN_TRY(rd_u64(c, what, &v));
        m->shape[d] = (int64_t)v;
    }
    int64_t numel;
    if (kiln_shape_numel_checked(m->ndim, m->shape, &numel) != KILN_OK)
        return kiln_error_context(KILN_ERR_VALUE, "kiln file: %s at offset %zu", what, at);
    return KILN_OK;
}

static void describe(const kiln_meta *m, char *buf, size_t size) {
    char shape[160];
    snprintf(buf, size, "%s%s", kiln_dtype_name(m->dtype), kiln_shape_str(m, shape, sizeof shape));
}

/* ---- sections ---------------------------------------------------------------------------------- */

static kiln_status read_tensors(cursor *c, kiln_model *m, const uint8_t *data, size_t data_size) {
    KILN_TRY(rd_count(c, "the tensor count", 18, UINT32_MAX, &m->ntensors));
    m->tensors = kiln_calloc(m->ntensors ? m->ntensors : 1, sizeof *m->tensors);
    m->is_param = kiln_calloc(m->ntensors ? m->ntensors : 1, sizeof *m->is_param);
    if (!m->tensors || !m->is_param) return KILN_ERR_MEMORY;
    for (uint32_t k = 0; k < m->ntensors; k++) {
        char what[48];
        snprintf(what, sizeof what, "tensor %u", k);
        kiln_meta meta;
        uint64_t offset, nbytes;
        KILN_TRY(rd_meta(c, what, &meta));
        KILN_TRY(rd_u64(c, what, &offset));
        KILN_TRY(rd_u64(c, what, &nbytes));
        uint64_t want = (uint64_t)kiln_meta_numel(&meta) * kiln_dtype_size(meta.dtype);
        if (nbytes != want) return bad("%s says it holds %llu bytes, its shape needs %llu", what,
                                       (unsigned long long)nbytes, (unsigned long long)want);
        if (offset % KILN_MODEL_DATA_ALIGN)
            return bad("%s starts at data offset %llu, not a multiple of %d", what, (unsigned long long)offset,
                       KILN_MODEL_DATA_ALIGN);
        if (offset > data_size || nbytes > data_size - offset)
            return bad("%s (%llu bytes at data offset %llu) runs past the data section (%zu bytes)", what,
                       (unsigned long long)nbytes, (unsigned long long)offset, data_size);
        atomic_fetch_add(&m->blob->refs, 1);
        kiln_status s = kiln_tensor_wrap(meta.dtype, meta.ndim, meta.shape, NULL, (void *)(data + offset),
                                         blob_release, m->blob, &m->tensors[k]);
        if (s != KILN_OK) {
            atomic_fetch_sub(&m->blob->refs, 1);
            return s;
        }
        kiln_tensor_set_read_only(m->tensors[k]);
    }
    return KILN_OK;
}

static kiln_status read_io(cursor *c, kiln_model *m, int32_t first, uint32_t n, const char *what) {
    for (uint32_t k = 0; k < n; k++) {
        char label[48];
        snprintf(label, sizeof label, "%s %u", what, k);
        char **name = &m->names[first + (int32_t)k];
        KILN_TRY(rd_str(c, label, KILN_MODEL_MAX_NAME, name));
        if (!**name) return bad("%s has an empty name", label);
        for (int32_t j = 0; j < first + (int32_t)k; j++)
            if (strcmp(m->names[j], *name) == 0) return bad("two inputs or outputs are named '%s'", *name);
        KILN_TRY(rd_meta(c, label, &m->metas[first + (int32_t)k]));
    }
    return KILN_OK;
}

static kiln_status read_graph(cursor *c, kiln_model *m, int depth, kiln_graph *g);

static kiln_status read_node(cursor *c, kiln_graph *g, int32_t index) {
    char what[64];
    snprintf(what, sizeof what, "node %d", index);
    char *name = NULL;
    KILN_TRY(rd_str(c, what, 63, &name));
    kiln_op op = kiln_op_from_name(name);
    if (op == KILN_OP_COUNT) {
        kiln_status s = bad("%s has unknown op '%s'", what, name);
        free(name);
        return s;
    }
    free(name);
    snprintf(what, sizeof what, "node %d (%s)", index, kiln_op_table[op].name);
    uint32_t nin;
    KILN_TRY(rd_count(c, what, 4, KILN_MODEL_MAX_VALUES, &nin));
    int32_t *in = kiln_malloc(sizeof(int32_t) * (nin ? nin : 1));
    if (!in) return KILN_ERR_MEMORY;
    kiln_status s = KILN_OK;
    for (uint32_t k = 0; k < nin && s == KILN_OK; k++) {
        uint32_t v = 0;
        s = rd_u32(c, what, &v);
        if (s == KILN_OK && v >= (uint32_t)g->nvalues)
            s = bad("%s input %u names value %u before it is defined (%d values so far)", what, k, v, g->nvalues);
        in[k] = (int32_t)v;
    }
    kiln_attrs a;
    kiln_attrs_clear(&a);
    uint8_t ni = 0, nf = 0;
    if (s == KILN_OK) s = rd_u8(c, what, &ni);
    if (s == KILN_OK) s = rd_u8(c, what, &nf);
    if (s == KILN_OK && (ni > KILN_MAX_ATTR_INTS || nf > KILN_MAX_ATTR_FLOATS))
        s = bad("%s has %u int and %u float attributes (at most %d and %d)", what, ni, nf, KILN_MAX_ATTR_INTS,
                KILN_MAX_ATTR_FLOATS);
    for (int k = 0; k < ni && s == KILN_OK; k++) {
        uint64_t v;
        s = rd_u64(c, what, &v);
        if (s == KILN_OK) kiln_attrs_push_int(&a, (int64_t)v);
    }
    for (int k = 0; k < nf && s == KILN_OK; k++) {
        uint64_t v;
        double d;
        s = rd_u64(c, what, &v);
        memcpy(&d, &v, 8);
        if (s == KILN_OK) kiln_attrs_push_float(&a, d);
    }
    uint32_t loc = 0;
    if (s == KILN_OK) s = rd_u32(c, what, &loc);
    if (s == KILN_OK && loc != UINT32_MAX && loc >= (uint32_t)g->nlocs)
        s = bad("%s names source location %u of %d", what, loc, g->nlocs);
    int nout = s == KILN_OK ? kiln_op_nout(op, &a) : 0;
    if (s == KILN_OK && (nout < 0 || nout > KILN_MAX_OUTPUTS))
        s = bad("%s would have %d outputs (at most %d)", what, nout, KILN_MAX_OUTPUTS);
    if (s == KILN_OK) {
        s = kiln_graph_add_node(g, op, (int)nin, in, &a, loc == UINT32_MAX ? -1 : (int32_t)loc, NULL);
        if (s != KILN_OK && s != KILN_ERR_MEMORY) s = kiln_error_context(KILN_ERR_VALUE, "kiln file: %s", what);
    }
    free(in);
    return s;
}

/* Every capture is read by an op or is an output: the writer leaves unread ones out, so a file
 * with one would not be what writing its graph again gives. */
static kiln_status check_captures_read(const kiln_graph *g) {
    bool *read = kiln_calloc((size_t)(g->nvalues ? g->nvalues : 1), sizeof *read);
    if (!read) return KILN_ERR_MEMORY;
    for (int32_t i = 0; i < g->nnodes; i++)
        for (int k = 0; k < g->nodes[i].nin; k++) read[g->nodes[i].in[k]] = true;
    for (int32_t k = 0; k < g->noutputs; k++) read[g->outputs[k]] = true;
    int32_t unread = -1;
    for (int32_t k = 0; k < g->ncaptures && unread < 0; k++)
        if (!read[g->captures[k]]) unread = k;
    free(read);
    return unread < 0 ? KILN_OK : bad("capture %d is never read", (int)unread);
}

static kiln_status read_body(cursor *c, kiln_model *m, int depth, kiln_graph *g) {
    uint32_t n;
    KILN_TRY(rd_count(c, "the graph input count", 2, KILN_MODEL_MAX_VALUES, &n));
    for (uint32_t k = 0; k < n; k++) {
        kiln_meta meta;
        int32_t v;
        KILN_TRY(rd_meta(c, "a graph input", &meta));
        KILN_TRY(kiln_graph_add_input(g, &meta, &v));
    }
    KILN_TRY(rd_count(c, "the capture count", 5, KILN_MODEL_MAX_VALUES, &n));
    for (uint32_t k = 0; k < n; k++) {
        uint8_t kind;
        uint32_t t;
        int32_t v;
        KILN_TRY(rd_u8(c, "a capture", &kind));
        KILN_TRY(rd_u32(c, "a capture", &t));
        if (kind > KILN_MODEL_PARAMETER) return bad("capture %u has unknown kind %u", k, kind);
        if (t >= m->ntensors) return bad("capture %u names tensor %u of %u", k, t, m->ntensors);
        KILN_TRY(kiln_graph_add_capture(g, m->tensors[t], false, &v));
        g->values[v].constant = kind == KILN_MODEL_CONSTANT;
        m->is_param[t] = true;
    }
    KILN_TRY(rd_count(c, "the source location count", 4, KILN_MODEL_MAX_VALUES, &n));
    for (uint32_t k = 0; k < n; k++) {
        char *loc;
        int32_t id;
        KILN_TRY(rd_str(c, "a source location", 4096, &loc));
        kiln_status s = kiln_graph_add_loc(g, loc, &id);
        free(loc);
        KILN_TRY(s);
        if (id != (int32_t)k) return bad("source location %u repeats location %d", k, id);
    }
    KILN_TRY(rd_count(c, "the subgraph count", 24, KILN_MODEL_MAX_VALUES, &n));
    for (uint32_t k = 0; k < n; k++) {
        if (depth >= KILN_MODEL_MAX_DEPTH) return bad("subgraphs nested more than %d deep", KILN_MODEL_MAX_DEPTH);
        kiln_graph *sub;
        int32_t idx;
        KILN_TRY(kiln_graph_new(&sub));
        kiln_status s = read_graph(c, m, depth + 1, sub);
        if (s == KILN_OK) s = kiln_graph_add_subgraph(g, sub, &idx);
        if (s != KILN_OK) {
            kiln_graph_free(sub);
            return s;
        }
    }
    KILN_TRY(rd_count(c, "the node count", 14, KILN_MODEL_MAX_VALUES, &n));
    for (uint32_t k = 0; k < n; k++) {
        KILN_TRY(read_node(c, g, (int32_t)k));
        if (g->nvalues > KILN_MODEL_MAX_VALUES) return bad("a graph holds more than %d values", KILN_MODEL_MAX_VALUES);
    }
    KILN_TRY(rd_count(c, "the graph output count", 4, KILN_MODEL_MAX_VALUES, &n));
    int32_t *outs = kiln_malloc(sizeof(int32_t) * (n ? n : 1));
    if (!outs) return KILN_ERR_MEMORY;
    kiln_status s = KILN_OK;
    for (uint32_t k = 0; k < n && s == KILN_OK; k++) {
        uint32_t v = 0;
        s = rd_u32(c, "a graph output", &v);
        if (s == KILN_OK && v >= (uint32_t)g->nvalues) s = bad("graph output %u names unknown value %u", k, v);
        outs[k] = (int32_t)v;
    }
    if (s == KILN_OK) s = kiln_graph_set_outputs(g, (int)n, outs);
    free(outs);
    return s == KILN_OK ? check_captures_read(g) : s;
}

static kiln_status read_graph(cursor *c, kiln_model *m, int depth, kiln_graph *g) {
    kiln_status s = read_body(c, m, depth, g);
    if (s == KILN_OK) {
        s = kiln_graph_verify(g);
        if (s != KILN_OK && s != KILN_ERR_MEMORY) s = kiln_error_context(KILN_ERR_VALUE, "kiln file: graph");
    }
    return s;
}

static kiln_status read_cases(cursor *c, kiln_model *m) {
    uint32_t n, per = (uint32_t)(m->nin + m->nout);
    KILN_TRY(rd_count(c, "the test case count", per ? 4 * (size_t)per : 0, per ? UINT32_MAX : 1u << 20, &n));
    m->cases = kiln_malloc(sizeof(uint32_t) * ((size_t)n * per + 1));
    if (!m->cases) return KILN_ERR_MEMORY;
    m->ncases = (int32_t)n;
    for (uint32_t k = 0; k < n * per; k++) {
        uint32_t t;
        KILN_TRY(rd_u32(c, "a test case", &t));
        if (t >= m->ntensors) return bad("test case %u names tensor %u of %u", k / per, t, m->ntensors);
        const kiln_meta *want = &m->metas[k % per], *got = &m->tensors[t]->meta;
        if (!kiln_meta_equal(want, got)) {
            char a[192], b[192];
            describe(got, a, sizeof a), describe(want, b, sizeof b);
            return bad("test case %u %s %u is %s, the model's is %s", k / per, k % per < (uint32_t)m->nin ? "input" : "output",
                       k % per < (uint32_t)m->nin ? k % per : k % per - (uint32_t)m->nin, a, b);
        }
        m->cases[k] = t;
    }
    return KILN_OK;
}

/* ---- the names section (version 2) ------------------------------------------------------------ */

static int by_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* A list of (u32 id, str name): ids strictly increasing and below `limit`, names 1-4096 bytes and
 * unique; set on g with `set`. */
static kiln_status read_name_list(cursor *c, kiln_graph *g, const char *what, int32_t limit,
                                  kiln_status (*set)(kiln_graph *, int32_t, const char *),
                                  const char *(*get)(const kiln_graph *, int32_t)) {
    char label[64];
    snprintf(label, sizeof label, "the %s name count", what);
    uint32_t n;
    KILN_TRY(rd_count(c, label, 9, (uint32_t)limit, &n));
    int64_t prev = -1;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t id;
        char *name = NULL;
        snprintf(label, sizeof label, "%s name %u", what, k);
        KILN_TRY(rd_u32(c, label, &id));
        if ((int64_t)id <= prev || id >= (uint32_t)limit)
            return bad("%s names %s %u: not after %lld and below %d", label, what, id, (long long)prev, (int)limit);
        prev = id;
        KILN_TRY(rd_str(c, label, KILN_MODEL_MAX_NAME, &name));
        kiln_status s = *name ? set(g, (int32_t)id, name) : bad("%s is empty", label);
        free(name);
        KILN_TRY(s);
    }
    /* unique: sorted copies of the pointers, neighbours compared */
    const char **sorted = kiln_malloc(sizeof *sorted * (n ? n : 1));
    if (!sorted) return KILN_ERR_MEMORY;
    uint32_t m = 0;
    for (int32_t id = 0; id < limit && m < n; id++)
        if (get(g, id)) sorted[m++] = get(g, id);
    qsort(sorted, m, sizeof *sorted, by_str);
    kiln_status s = KILN_OK;
    for (uint32_t k = 1; k < m && s == KILN_OK; k++)
        if (strcmp(sorted[k - 1], sorted[k]) == 0) s = bad("two %ss are named '%s'", what, sorted[k]);
    free(sorted);
    return s;
}

static kiln_status read_names(cursor *c, kiln_graph *g) {
    KILN_TRY(read_name_list(c, g, "value", g->nvalues, kiln_graph_set_value_name, kiln_graph_value_name));
    KILN_TRY(read_name_list(c, g, "node", g->nnodes, kiln_graph_set_node_name, kiln_graph_node_name));
    uint32_t n;
    KILN_TRY(rd_count(c, "the priority count", 4, (uint32_t)g->nnodes, &n));
    if (n != 0 && n != (uint32_t)g->nnodes)
        return bad("%u priorities for %d nodes (none or one per node)", n, g->nnodes);
    bool any = false;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t p;
        KILN_TRY(rd_u32(c, "a priority", &p));
        if (p > INT32_MAX) return bad("node %u has priority %u (at most %d)", k, p, INT32_MAX);
        KILN_TRY(kiln_graph_set_node_priority(g, (int32_t)k, (int32_t)p));
        any |= p != 0;
    }
    if (n && !any) return bad("a priority list of zeros (none is written as no list)");
    return KILN_OK;
}

/* The graph's inputs and outputs are those the io lists describe. */
static kiln_status check_io(const kiln_model *m) {
    const kiln_graph *g = m->graph;
    if (g->ninputs != m->nin || g->noutputs != m->nout)
        return bad("the model lists %d inputs and %d outputs, its graph has %d and %d", m->nin, m->nout, g->ninputs,
                   g->noutputs);
    for (int32_t k = 0; k < m->nin + m->nout; k++) {
        const kiln_meta *got = &g->values[k < m->nin ? g->inputs[k] : g->outputs[k - m->nin]].meta;
        if (!kiln_meta_equal(got, &m->metas[k])) {
            char a[192], b[192];
            describe(&m->metas[k], a, sizeof a), describe(got, b, sizeof b);
            return bad("%s '%s' is listed as %s, the graph's is %s", k < m->nin ? "input" : "output", m->names[k], a, b);
        }
    }
    return KILN_OK;
}

/* The header of the record at b (avail bytes from it to the end of the file). Version 1: one
 * record, the whole file. Version 2: records of a multiple of 64 bytes, one after the other. */
static kiln_status read_header(const uint8_t *b, size_t avail, bool first, bool check_sum, uint32_t *version,
                               size_t *record, size_t *meta_size, size_t *data_offset, size_t *data_size) {
    if (avail < KILN_MODEL_HEADER_BYTES)
        return bad("truncated: %zu bytes, the header alone is %d", avail, KILN_MODEL_HEADER_BYTES);
    if (memcmp(b, KILN_MODEL_MAGIC, 8) != 0) return bad("not a kiln model (wrong magic bytes)");
    *version = kiln_get_u32(b + KILN_MODEL_AT_VERSION);
    if (*version != 1 && *version != KILN_MODEL_VERSION)
        return bad("format version %u; this kiln reads versions 1 and %d", *version, KILN_MODEL_VERSION);
    if (*version == 1 && !first) return bad("a version 1 model after another graph (version 1 files hold one)");
    uint32_t flags = kiln_get_u32(b + KILN_MODEL_AT_FLAGS);
    if (flags) return bad("unknown header flags 0x%x", flags);
    uint64_t size = kiln_get_u64(b + KILN_MODEL_AT_FILE_SIZE);
    if (*version == 1 && size != avail)
        return bad("%s: the header says %llu bytes, there are %zu", size > avail ? "truncated" : "trailing bytes",
                   (unsigned long long)size, avail);
    if (*version != 1 && size > avail)
        return bad("truncated: the header says %llu bytes, %zu are left", (unsigned long long)size, avail);
    if (*version != 1 && (size % KILN_MODEL_DATA_ALIGN || size < KILN_MODEL_HEADER_BYTES))
        return bad("a graph's record of %llu bytes (a multiple of %d is written)", (unsigned long long)size,
                   KILN_MODEL_DATA_ALIGN);
    uint64_t mo = kiln_get_u64(b + KILN_MODEL_AT_META_OFFSET), ms = kiln_get_u64(b + KILN_MODEL_AT_META_SIZE);
    uint64_t dof = kiln_get_u64(b + KILN_MODEL_AT_DATA_OFFSET), ds = kiln_get_u64(b + KILN_MODEL_AT_DATA_SIZE);
    if (mo != KILN_MODEL_HEADER_BYTES) return bad("the metadata starts at %llu, not right after the header", (unsigned long long)mo);
    if (ms > size - mo) return bad("the metadata (%llu bytes) runs past the end of the file", (unsigned long long)ms);
    if (dof % KILN_MODEL_DATA_ALIGN || dof < mo + ms || dof > size)
        return bad("the data section's offset %llu is misaligned or overlaps the metadata", (unsigned long long)dof);
    if (ds != size - dof) return bad("the data section says %llu bytes, %llu follow its offset", (unsigned long long)ds,
                                     (unsigned long long)(size - dof));
    if (check_sum) {
        uint64_t want = kiln_get_u64(b + KILN_MODEL_AT_CHECKSUM), got = kiln_model_checksum(b, (size_t)size);
        if (want != got)
            return bad("checksum mismatch (stored %016llx, computed %016llx): the file is corrupt",
                       (unsigned long long)want, (unsigned long long)got);
    }
    *record = (size_t)size, *meta_size = (size_t)ms, *data_offset = (size_t)dof, *data_size = (size_t)ds;
    return KILN_OK;
}

/* The record's graph name (version 2: the string after the producer; version 1: "graph"). */
static kiln_status read_graph_name(const uint8_t *b, size_t meta_size, size_t at, uint32_t version, char **name) {
    if (version == 1) {
        *name = kiln_strdup(KILN_MODEL_DEFAULT_NAME);
        return *name ? KILN_OK : KILN_ERR_MEMORY;
    }
    cursor c = {b + KILN_MODEL_HEADER_BYTES, meta_size, 0, at + KILN_MODEL_HEADER_BYTES};
    char *producer = NULL;
    KILN_TRY(rd_str(&c, "the producer", KILN_MODEL_MAX_STRING, &producer));
    free(producer);
    KILN_TRY(rd_str(&c, "the graph's name", KILN_MODEL_MAX_NAME, name));
    if (!**name) return bad("graph at offset %zu has an empty name", at);
    return KILN_OK;
}

/* Walks the file's records (each header and checksum checked, names unique) and finds the one at
 * `index`, or named `name`: *at and *size are its offset and size. */
static kiln_status scan(kiln_model *m, bool check_sum, int32_t index, const char *name, size_t *at, size_t *size) {
    const uint8_t *b = m->blob->base;
    size_t total = m->blob->size, off = 0;
    int32_t found = -1;
    while (off < total || off == 0) {
        uint32_t version;
        size_t record, ms, dof, ds;
        kiln_status s = read_header(b + off, total - off, off == 0, check_sum, &version, &record, &ms, &dof, &ds);
        if (s != KILN_OK) return off ? kiln_error_context(s, "kiln file: graph %d at offset %zu", m->ngraphs, off) : s;
        char **grown = kiln_realloc(m->graph_names, sizeof *grown * ((size_t)m->ngraphs + 1));
        if (!grown) return KILN_ERR_MEMORY;
        m->graph_names = grown;
        m->graph_names[m->ngraphs++] = NULL;
        KILN_TRY(read_graph_name(b + off, ms, off, version, &m->graph_names[m->ngraphs - 1]));
        const char *this = m->graph_names[m->ngraphs - 1];
        for (int32_t k = 0; k + 1 < m->ngraphs; k++)
            if (strcmp(m->graph_names[k], this) == 0) return bad("two graphs are named '%s'", this);
        if (found < 0 && (name ? strcmp(name, this) == 0 : m->ngraphs - 1 == index)) {
            found = m->ngraphs - 1;
            *at = off, *size = record;
        }
        off += record;
    }
    if (found < 0) {
        if (name) return bad("no graph named '%s' (the file holds %d)", name, m->ngraphs);
        return bad("no graph %d (the file holds %d)", (int)index, m->ngraphs);
    }
    m->index = found;
    return KILN_OK;
}

static kiln_status parse(kiln_model *m, bool check_sum, int32_t index, const char *name) {
    size_t at = 0, rs = 0, ms = 0, dof = 0, ds = 0;
    KILN_TRY(scan(m, check_sum, index, name, &at, &rs));
    const uint8_t *b = m->blob->base + at;
    uint32_t version;
    KILN_TRY(read_header(b, rs, at == 0, false, &version, &rs, &ms, &dof, &ds));
    m->version = (int32_t)version;
    m->data_bytes = ds;
    cursor c = {b + KILN_MODEL_HEADER_BYTES, ms, 0, at + KILN_MODEL_HEADER_BYTES};
    KILN_TRY(rd_str(&c, "the producer", KILN_MODEL_MAX_STRING, &m->producer));
    if (version == 1) {
        m->name = kiln_strdup(KILN_MODEL_DEFAULT_NAME);
        if (!m->name) return KILN_ERR_MEMORY;
    } else {
        KILN_TRY(rd_str(&c, "the graph's name", KILN_MODEL_MAX_NAME, &m->name));
    }
    KILN_TRY(rd_str(&c, "the metadata", KILN_MODEL_MAX_STRING, &m->metadata));
    KILN_TRY(rd_str(&c, "the user info", KILN_MODEL_MAX_STRING, &m->user_info));
    uint32_t nin, nout;
    KILN_TRY(rd_count(&c, "the input count", 6, KILN_MODEL_MAX_VALUES, &nin));
    /* names and metas of inputs and outputs: grown as read, so the count is bounded by the file */
    m->names = kiln_calloc((size_t)nin + 1, sizeof *m->names);
    m->metas = kiln_calloc((size_t)nin + 1, sizeof *m->metas);
    if (!m->names || !m->metas) return KILN_ERR_MEMORY;
    m->nin = (int32_t)nin;
    KILN_TRY(read_io(&c, m, 0, nin, "input"));
    KILN_TRY(rd_count(&c, "the output count", 6, KILN_MODEL_MAX_VALUES, &nout));
    char **names = kiln_realloc(m->names, sizeof *names * ((size_t)nin + nout + 1));
    if (!names) return KILN_ERR_MEMORY;
    m->names = names;
    memset(m->names + nin, 0, sizeof *names * ((size_t)nout + 1));
    kiln_meta *metas = kiln_realloc(m->metas, sizeof *metas * ((size_t)nin + nout + 1));
    if (!metas) return KILN_ERR_MEMORY;
    m->metas = metas;
    m->nout = (int32_t)nout;
    KILN_TRY(read_io(&c, m, (int32_t)nin, nout, "output"));
    KILN_TRY(read_tensors(&c, m, b + dof, ds));
    KILN_TRY(kiln_graph_new(&m->graph));
    KILN_TRY(read_graph(&c, m, 0, m->graph));
    KILN_TRY(check_io(m));
    KILN_TRY(read_cases(&c, m));
    if (version != 1) KILN_TRY(read_names(&c, m->graph));
    if (left(&c)) return bad("%zu unread bytes at the end of the metadata", left(&c));
    for (uint32_t k = 0; k < m->ntensors; k++)
        if (m->is_param[k]) m->param_bytes += (size_t)m->tensors[k]->numel * kiln_dtype_size(m->tensors[k]->meta.dtype);
    return KILN_OK;
}

/* Takes the blob (one reference). */
/* A file's symbolic sizes that outgrow the algebra's capacity (KILN_ERR_LIMIT) make the file
 * invalid like any other bad content: the loader fails with KILN_ERR_VALUE. */
static kiln_status invalid_if_limit(kiln_status s) {
    return s == KILN_ERR_LIMIT ? kiln_error_context(KILN_ERR_VALUE, "model file") : s;
}

static kiln_status load_blob_checked(blob *bl, bool check_sum, int32_t index, const char *name, kiln_model **out);

static kiln_status load_blob(blob *bl, bool check_sum, int32_t index, const char *name, kiln_model **out) {
    return invalid_if_limit(load_blob_checked(bl, check_sum, index, name, out));
}

static kiln_status load_blob_checked(blob *bl, bool check_sum, int32_t index, const char *name, kiln_model **out) {
    *out = NULL;
    kiln_model *m = kiln_calloc(1, sizeof *m);
    if (!m) {
        blob_release(bl);
        return KILN_ERR_MEMORY;
    }
    m->blob = bl;
    kiln_status s = parse(m, check_sum, index, name);
    if (s != KILN_OK) {
        kiln_model_free(m);
        return s;
    }
    *out = m;
    return KILN_OK;
}

static blob *new_blob(uint8_t *base, size_t size) {
    blob *b = kiln_malloc(sizeof *b);
    if (!b) return NULL;
    atomic_init(&b->refs, 1);
    b->base = base, b->size = size;
    return b;
}

static kiln_status load_bytes(const void *data, size_t size, bool check_sum, int32_t index, const char *name,
                              kiln_model **out) {
    *out = NULL;
    uint8_t *copy = kiln_alloc(size ? size : 1);
    if (!copy) return KILN_ERR_MEMORY;
    if (size) memcpy(copy, data, size);
    blob *b = new_blob(copy, size);
    if (!b) {
        kiln_free(copy);
        return KILN_ERR_MEMORY;
    }
    return load_blob(b, check_sum, index, name, out);
}

kiln_status kiln_model_load_bytes(const void *data, size_t size, bool check_sum, int32_t index, kiln_model **out) {
    return load_bytes(data, size, check_sum, index, NULL, out);
}

kiln_status kiln_model_load_memory(const void *data, size_t size, kiln_model **out) {
    return load_bytes(data, size, true, 0, NULL, out);
}

kiln_status kiln_model_load_memory_graph(const void *data, size_t size, int32_t index, const char *name,
                                         kiln_model **out) {
    return load_bytes(data, size, true, index, name, out);
}

kiln_status kiln_model_load(const char *path, kiln_model **out) { return kiln_model_load_graph(path, 0, NULL, out); }

/* The file's bytes, read into memory (kiln_alloc'd, *size of them). A mapping would let a later
 * writer of the file change a loaded model's parameters, and a shorter file kill the process
 * (SIGBUS) on its next read; a copy is the model's alone. A file that changes while it is read
 * fails the checksum check. */
static kiln_status read_file(const char *path, uint8_t **out, size_t *size) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kiln_error(KILN_ERR_RUNTIME, "kiln file %s: can't open it: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return kiln_error(KILN_ERR_RUNTIME, "kiln file %s: not a regular file", path);
    }
    size_t n = (size_t)st.st_size;
    if (n < KILN_MODEL_HEADER_BYTES) {
        close(fd);
        return kiln_error(KILN_ERR_VALUE, "kiln file %s: truncated: %zu bytes, the header alone is %d", path, n,
                          KILN_MODEL_HEADER_BYTES);
    }
    uint8_t *p = kiln_alloc(n);
    if (!p) {
        close(fd);
        return KILN_ERR_MEMORY;
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, p + got, n - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break; /* shortened since fstat: the header's sizes no longer fit what was read */
        got += (size_t)r;
    }
    int err = errno;
    close(fd);
    if (got < n && got < KILN_MODEL_HEADER_BYTES) {
        kiln_free(p);
        if (got == 0 && err) return kiln_error(KILN_ERR_RUNTIME, "kiln file %s: can't read it: %s", path, strerror(err));
        return kiln_error(KILN_ERR_VALUE, "kiln file %s: truncated while it was read: %zu bytes", path, got);
    }
    *out = p, *size = got;
    return KILN_OK;
}

kiln_status kiln_model_load_graph(const char *path, int32_t index, const char *name, kiln_model **out) {
    *out = NULL;
    uint8_t *p;
    size_t size = 0;
    KILN_TRY(read_file(path, &p, &size));
    blob *b = new_blob(p, size);
    if (!b) {
        kiln_free(p);
        return KILN_ERR_MEMORY;
    }
    kiln_status s = load_blob(b, true, index, name, out);
    if (s != KILN_OK && s != KILN_ERR_MEMORY) return kiln_error_context(s, "%s", path);
    return s;
}

void kiln_model_free(kiln_model *m) {
    if (!m) return;
    kiln_graph_free(m->graph);
    for (int32_t k = 0; m->names && k < m->nin + m->nout; k++) free(m->names[k]);
    free(m->names), free(m->metas);
    free(m->producer), free(m->metadata), free(m->user_info), free(m->name);
    for (int32_t k = 0; m->graph_names && k < m->ngraphs; k++) free(m->graph_names[k]);
    free(m->graph_names);
    for (uint32_t k = 0; m->tensors && k < m->ntensors; k++) kiln_tensor_release(m->tensors[k]);
    free(m->tensors), free(m->is_param), free(m->cases);
    if (m->blob) blob_release(m->blob);
    free(m);
}

const kiln_graph *kiln_model_graph(const kiln_model *m) { return m->graph; }
int32_t kiln_model_num_inputs(const kiln_model *m) { return m->nin; }
int32_t kiln_model_num_outputs(const kiln_model *m) { return m->nout; }
const char *kiln_model_input_name(const kiln_model *m, int32_t k) { return k >= 0 && k < m->nin ? m->names[k] : NULL; }
const char *kiln_model_output_name(const kiln_model *m, int32_t k) {
    return k >= 0 && k < m->nout ? m->names[m->nin + k] : NULL;
}
const kiln_meta *kiln_model_input_meta(const kiln_model *m, int32_t k) {
    return k >= 0 && k < m->nin ? &m->metas[k] : NULL;
}
const kiln_meta *kiln_model_output_meta(const kiln_model *m, int32_t k) {
    return k >= 0 && k < m->nout ? &m->metas[m->nin + k] : NULL;
}
int32_t kiln_model_input_index(const kiln_model *m, const char *name) {
    for (int32_t k = 0; k < m->nin; k++)
        if (strcmp(m->names[k], name) == 0) return k;
    return -1;
}
int32_t kiln_model_version(const kiln_model *m) { return m->version; }
const char *kiln_model_name(const kiln_model *m) { return m->name; }
int32_t kiln_model_index(const kiln_model *m) { return m->index; }
int32_t kiln_model_num_graphs(const kiln_model *m) { return m->ngraphs; }
const char *kiln_model_graph_name(const kiln_model *m, int32_t k) {
    return k >= 0 && k < m->ngraphs ? m->graph_names[k] : NULL;
}
const char *kiln_model_producer(const kiln_model *m) { return m->producer; }
const char *kiln_model_metadata(const kiln_model *m) { return m->metadata; }
const char *kiln_model_user_info(const kiln_model *m) { return m->user_info; }
size_t kiln_model_data_bytes(const kiln_model *m) { return m->data_bytes; }
size_t kiln_model_param_bytes(const kiln_model *m) { return m->param_bytes; }
int32_t kiln_model_num_cases(const kiln_model *m) { return m->ncases; }
kiln_tensor *kiln_model_case_input(const kiln_model *m, int32_t c, int32_t k) {
    if (c < 0 || c >= m->ncases || k < 0 || k >= m->nin) return NULL;
    return m->tensors[m->cases[(size_t)c * (size_t)(m->nin + m->nout) + (size_t)k]];
}
kiln_tensor *kiln_model_case_output(const kiln_model *m, int32_t c, int32_t k) {
    if (c < 0 || c >= m->ncases || k < 0 || k >= m->nout) return NULL;
    return m->tensors[m->cases[(size_t)c * (size_t)(m->nin + m->nout) + (size_t)(m->nin + k)]];
}
