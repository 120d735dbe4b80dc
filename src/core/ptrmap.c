/* Open-addressing pointer map. */
#include "ptrmap.h"

static size_t slot_of(const void *key, int64_t cap) {
    return (size_t)((((uintptr_t)key >> 4) * 0x9E3779B97F4A7C15ull) & (uint64_t)(cap - 1));
}

int64_t kiln_ptrmap_get(const kiln_ptrmap *m, const void *key) {
    if (!m->cap) return -1;
    for (size_t i = slot_of(key, m->cap);; i = (i + 1) & (size_t)(m->cap - 1)) {
        if (!m->keys[i]) return -1;
        if (m->keys[i] == key) return m->vals[i];
    }
}

kiln_status kiln_ptrmap_put(kiln_ptrmap *m, const void *key, int64_t value) {
    if (2 * (m->count + 1) > m->cap) {
        kiln_ptrmap grown = {0};
        grown.cap = m->cap ? m->cap * 2 : 64;
        grown.keys = kiln_calloc((size_t)grown.cap, sizeof *grown.keys);
        grown.vals = kiln_malloc(sizeof *grown.vals * (size_t)grown.cap);
        if (!grown.keys || !grown.vals) {
            free(grown.keys), free(grown.vals);
            return kiln_error(KILN_ERR_MEMORY, "out of memory growing a map");
        }
        for (int64_t i = 0; i < m->cap; i++)
            if (m->keys[i]) kiln_ptrmap_put(&grown, m->keys[i], m->vals[i]);
        free(m->keys), free(m->vals);
        *m = grown;
    }
    size_t i = slot_of(key, m->cap);
    while (m->keys[i] && m->keys[i] != key) i = (i + 1) & (size_t)(m->cap - 1);
    if (!m->keys[i]) m->count++;
    m->keys[i] = key;
    m->vals[i] = value;
    return KILN_OK;
}

void kiln_ptrmap_free(kiln_ptrmap *m) {
    free(m->keys), free(m->vals);
    *m = (kiln_ptrmap){0};
}
