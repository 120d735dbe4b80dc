/* dtype facts and NumPy-like promotion. */
#include "internal.h"

static const size_t dtype_sizes[] = {1, 1, 4, 8, 2, 2, 4, 8};
static const char *const dtype_names[] = {"bool",    "int8",     "int32",   "int64",
                                          "float16", "bfloat16", "float32", "float64"};
_Static_assert(sizeof dtype_sizes / sizeof dtype_sizes[0] == KILN_DTYPE_COUNT, "dtype_sizes");
_Static_assert(sizeof dtype_names / sizeof dtype_names[0] == KILN_DTYPE_COUNT, "dtype_names");

size_t kiln_dtype_size(kiln_dtype dtype) {
    return (unsigned)dtype < KILN_DTYPE_COUNT ? dtype_sizes[dtype] : 0;
}

const char *kiln_dtype_name(kiln_dtype dtype) {
    return (unsigned)dtype < KILN_DTYPE_COUNT ? dtype_names[dtype] : "invalid";
}

bool kiln_dtype_is_float(kiln_dtype dtype) { return dtype >= KILN_DTYPE_FLOAT16; }

kiln_dtype kiln_dtype_promote(kiln_dtype a, kiln_dtype b) {
    if (a == b) return a;
    bool fa = kiln_dtype_is_float(a), fb = kiln_dtype_is_float(b);
    if (fa != fb) return fa ? a : b; /* any float wins over ints and bool (as in PyTorch) */
    /* float16 with bfloat16 has no exact common 16-bit type */
    if ((a == KILN_DTYPE_FLOAT16 && b == KILN_DTYPE_BFLOAT16) ||
        (a == KILN_DTYPE_BFLOAT16 && b == KILN_DTYPE_FLOAT16))
        return KILN_DTYPE_FLOAT32;
    return a > b ? a : b; /* the enum is ordered by kind and width */
}
