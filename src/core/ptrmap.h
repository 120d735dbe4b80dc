/* A pointer -> int map (open addressing), for identity lookups of tensors and nodes. */
#ifndef KILN_PTRMAP_H
#define KILN_PTRMAP_H

#include "internal.h"

typedef struct kiln_ptrmap {
    const void **keys;
    int64_t *vals;
    int64_t cap; /* a power of two, at least twice the count */
    int64_t count;
} kiln_ptrmap;

/* -1 when absent. */
int64_t kiln_ptrmap_get(const kiln_ptrmap *m, const void *key);
kiln_status kiln_ptrmap_put(kiln_ptrmap *m, const void *key, int64_t value);
void kiln_ptrmap_free(kiln_ptrmap *m);

#endif
