/* NumPy-style indexing lowered to view and gather ops: x[key] and x[key] = value. The front end
 * parses its index object into a plain list of items; the lowering emits ops through kiln_apply,
 * so eager calls, traces and autograd all see the same ops. */
#ifndef KILN_INDEX_LOWER_H
#define KILN_INDEX_LOWER_H

#include "kiln/ops.h"

typedef enum kiln_index_kind {
    KILN_INDEX_INT,      /* an integer: start */
    KILN_INDEX_SLICE,    /* start:stop:step */
    KILN_INDEX_NEWAXIS,  /* None: a new axis of length 1 */
    KILN_INDEX_ELLIPSIS, /* ...: as many full slices as the other items leave */
    KILN_INDEX_TENSOR,   /* an integer tensor (gathered along its axis) or a bool mask (its axes) */
} kiln_index_kind;

/* An open end of a slice: start KILN_INDEX_OPEN_LOW / stop KILN_INDEX_OPEN_HIGH for a positive
 * step, the other way round for a negative one (Python's PySlice_Unpack leaves exactly these). */
#define KILN_INDEX_OPEN_LOW INT64_MIN
#define KILN_INDEX_OPEN_HIGH INT64_MAX

typedef struct kiln_index_item {
    kiln_index_kind kind;
    int64_t start, stop, step; /* SLICE (step != 0); INT: start */
    kiln_tensor *tensor;       /* TENSOR: borrowed */
} kiln_index_item;

/* Called with each tensor whose values the lowering reads (bool masks, the bounds of merged
 * indices): what is computed from them is fixed in a traced graph. May be NULL. */
typedef void (*kiln_value_read_fn)(const kiln_tensor *t);

/* x[items] as a new reference: a view (slice, reshape) for ints, slices, None and ..., then a
 * gather for index tensors (several are merged into one index over their axes; apart, the
 * indexed axes come first, as in NumPy). */
KILN_API kiln_status kiln_index_get(kiln_tensor *x, int n, const kiln_index_item *items, kiln_value_read_fn note_read,
                                    kiln_tensor **out);
/* x[items] = value, in place (value broadcasts to x[items]'s shape). */
KILN_API kiln_status kiln_index_set(kiln_tensor *x, int n, const kiln_index_item *items, kiln_tensor *value,
                                    kiln_value_read_fn note_read);

#endif
