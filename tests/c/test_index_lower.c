/* NumPy-style indexing lowered to ops (src/ops/index_lower.c): shapes and values of views and
 * gathers, writes through them, and the errors NumPy raises. */
#include "check.h"
#include "core/internal.h"
#include "ops/index_lower.h"

#define ITEM_INT(v) ((kiln_index_item){KILN_INDEX_INT, (v), 0, 0, NULL})
#define ITEM_SLICE(a, b, c) ((kiln_index_item){KILN_INDEX_SLICE, (a), (b), (c), NULL})
#define ITEM_ALL ITEM_SLICE(KILN_INDEX_OPEN_LOW, KILN_INDEX_OPEN_HIGH, 1)
#define ITEM_NEW ((kiln_index_item){KILN_INDEX_NEWAXIS, 0, 0, 0, NULL})
#define ITEM_ELLIPSIS ((kiln_index_item){KILN_INDEX_ELLIPSIS, 0, 0, 0, NULL})
#define ITEM_TENSOR(t) ((kiln_index_item){KILN_INDEX_TENSOR, 0, 0, 0, (t)})

static int reads;
static void count_read(const kiln_tensor *t) { (void)t, reads++; }

/* x = arange(4*5*6) as (4, 5, 6) */
static kiln_tensor *arange3(void) {
    int64_t shape[3] = {4, 5, 6};
    kiln_tensor *x = tensor_f32(3, shape, NULL);
    for (int64_t i = 0; i < x->numel; i++) ((float *)x->data)[i] = (float)i;
    return x;
}

static kiln_tensor *ints(int64_t n, const int64_t *v) {
    kiln_tensor *t = NULL;
    CHECK_OK(kiln_tensor_empty(KILN_DTYPE_INT64, 1, &n, &t));
    memcpy(t->data, v, sizeof *v * (size_t)n);
    return t;
}

static bool shape_is(const kiln_tensor *t, int ndim, const int64_t *shape) {
    if (!t || t->meta.ndim != ndim) return false;
    for (int d = 0; d < ndim; d++)
        if (t->meta.shape[d] != shape[d]) return false;
    return true;
}

static void test_views(void) {
    kiln_tensor *x = arange3(), *y = NULL;
    /* x[1:3, None, ::2] -> (2, 1, 3, 6); y[1, 0, 2, 4] = x[2, 4, 4] */
    kiln_index_item k1[] = {ITEM_SLICE(1, 3, 1), ITEM_NEW, ITEM_SLICE(KILN_INDEX_OPEN_LOW, KILN_INDEX_OPEN_HIGH, 2)};
    CHECK_OK(kiln_index_get(x, 3, k1, NULL, &y));
    CHECK(shape_is(y, 4, (int64_t[]){2, 1, 3, 6}));
    CHECK(y && kiln_tensor_get_double(y, 1 * 18 + 2 * 6 + 4) == 2 * 30 + 4 * 6 + 4);
    kiln_tensor_release(y);
    /* x[-1, ..., ::-2] -> (5, 3); element [0, 0] = x[3, 0, 5] */
    kiln_index_item k2[] = {ITEM_INT(-1), ITEM_ELLIPSIS, ITEM_SLICE(KILN_INDEX_OPEN_HIGH, KILN_INDEX_OPEN_LOW, -2)};
    CHECK_OK(kiln_index_get(x, 3, k2, NULL, &y));
    CHECK(shape_is(y, 2, (int64_t[]){5, 3}));
    CHECK(y && kiln_tensor_get_double(y, 0) == 3 * 30 + 5);
    kiln_tensor_release(y);
    /* x[0, 1:3] = 7 */
    kiln_tensor *seven = tensor_f32(0, NULL, (float[]){7.0f});
    kiln_index_item k3[] = {ITEM_INT(0), ITEM_SLICE(1, 3, 1)};
    CHECK_OK(kiln_index_set(x, 2, k3, seven, NULL));
    CHECK(((float *)x->data)[6] == 7.0f && ((float *)x->data)[17] == 7.0f && ((float *)x->data)[18] == 18.0f);
    kiln_tensor_release(seven), kiln_tensor_release(x);
}

static void test_gathers(void) {
    kiln_tensor *x = arange3(), *y = NULL;
    kiln_tensor *i = ints(2, (int64_t[]){3, -4}), *j = ints(2, (int64_t[]){0, 5});
    /* x[i] -> (2, 5, 6) */
    kiln_index_item k1[] = {ITEM_TENSOR(i)};
    CHECK_OK(kiln_index_get(x, 1, k1, NULL, &y));
    CHECK(shape_is(y, 3, (int64_t[]){2, 5, 6}) && kiln_tensor_get_double(y, 30) == 0);
    kiln_tensor_release(y);
    /* x[i, :, j] (apart: the indexed axes first) -> (2, 5); [1, 2] = x[0, 2, 5] */
    kiln_index_item k2[] = {ITEM_TENSOR(i), ITEM_ALL, ITEM_TENSOR(j)};
    reads = 0;
    CHECK_OK(kiln_index_get(x, 3, k2, count_read, &y));
    CHECK(shape_is(y, 2, (int64_t[]){2, 5}) && kiln_tensor_get_double(y, 7) == 2 * 6 + 5);
    CHECK(reads == 2); /* the bounds of each index */
    kiln_tensor_release(y);
    /* a bool mask over the first two axes: its values are read */
    int64_t ms[2] = {4, 5};
    kiln_tensor *mask = NULL;
    CHECK_OK(kiln_tensor_zeros(KILN_DTYPE_BOOL, 2, ms, &mask));
    ((uint8_t *)mask->data)[7] = ((uint8_t *)mask->data)[19] = 1;
    kiln_index_item k3[] = {ITEM_TENSOR(mask)};
    reads = 0;
    CHECK_OK(kiln_index_get(x, 1, k3, count_read, &y));
    CHECK(shape_is(y, 2, (int64_t[]){2, 6}) && kiln_tensor_get_double(y, 6) == 19 * 6 && reads >= 1);
    kiln_tensor_release(y);
    /* x[i, j2] = -1 */
    kiln_tensor *minus = tensor_f32(0, NULL, (float[]){-1.0f}), *j2 = ints(2, (int64_t[]){0, 4});
    kiln_index_item k4[] = {ITEM_TENSOR(i), ITEM_TENSOR(j2)};
    CHECK_OK(kiln_index_set(x, 2, k4, minus, NULL));
    CHECK(((float *)x->data)[3 * 30 + 0 * 6] == -1.0f && ((float *)x->data)[0 * 30 + 4 * 6 + 3] == -1.0f);
    CHECK(((float *)x->data)[1 * 30] == 30.0f);
    kiln_tensor_release(minus), kiln_tensor_release(j2), kiln_tensor_release(mask), kiln_tensor_release(i), kiln_tensor_release(j);
    kiln_tensor_release(x);
}

static void test_errors(void) {
    kiln_tensor *x = arange3(), *y = NULL, *far = ints(1, (int64_t[]){9});
    kiln_index_item many[] = {ITEM_INT(0), ITEM_INT(0), ITEM_INT(0), ITEM_INT(0)};
    CHECK_STATUS(kiln_index_get(x, 4, many, NULL, &y), KILN_ERR_INDEX);
    CHECK(strstr(kiln_last_error(), "too many indices for a tensor of shape (4, 5, 6): 4 given"));
    kiln_index_item two[] = {ITEM_ELLIPSIS, ITEM_ELLIPSIS};
    CHECK_STATUS(kiln_index_get(x, 2, two, NULL, &y), KILN_ERR_INDEX);
    kiln_index_item out[] = {ITEM_ALL, ITEM_INT(5)};
    CHECK_STATUS(kiln_index_get(x, 2, out, NULL, &y), KILN_ERR_INDEX);
    CHECK(strstr(kiln_last_error(), "index 5 is out of bounds for axis 1 with size 5"));
    kiln_index_item pair[] = {ITEM_TENSOR(far), ITEM_TENSOR(far)};
    CHECK_STATUS(kiln_index_get(x, 2, pair, NULL, &y), KILN_ERR_INDEX);
    CHECK(y == NULL);
    kiln_tensor_release(far), kiln_tensor_release(x);
}

int main(void) {
    test_views();
    test_gathers();
    test_errors();
    CHECK_DONE();
}
