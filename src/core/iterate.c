/* The strided N-d loop under elementwise kernels and copies. */
#include "internal.h"

#include <omp.h>

typedef struct {
    int nops, ndim; /* ndim >= 1 after merging; axis ndim-1 is the inner loop */
    int64_t shape[KILN_MAX_DIMS];
    int64_t bstrides[4][KILN_MAX_DIMS]; /* byte strides per operand */
} loop_plan;

#define MAX_OPS 4

/* Drops size-1 axes and merges axes that are contiguous for every operand. */
static void plan_loop(loop_plan *p, int nops, const size_t *itemsize,
                      const int64_t (*strides)[KILN_MAX_DIMS], int ndim, const int64_t *shape) {
    p->nops = nops;
    int nd = 0;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 1) continue;
        if (nd > 0) {
            bool merge = true;
            for (int k = 0; k < nops; k++)
                if (p->bstrides[k][nd - 1] != strides[k][d] * shape[d] * (int64_t)itemsize[k]) merge = false;
            if (merge) {
                p->shape[nd - 1] *= shape[d];
                for (int k = 0; k < nops; k++) p->bstrides[k][nd - 1] = strides[k][d] * (int64_t)itemsize[k];
                continue;
            }
        }
        p->shape[nd] = shape[d];
        for (int k = 0; k < nops; k++) p->bstrides[k][nd] = strides[k][d] * (int64_t)itemsize[k];
        nd++;
    }
    if (nd == 0) {
        p->shape[0] = 1;
        for (int k = 0; k < nops; k++) p->bstrides[k][0] = 0;
        nd = 1;
    }
    p->ndim = nd;
}

/* Runs rows [row_begin, row_end) of the plan; a row is one pass of the inner axis. */
static void run_rows(const loop_plan *p, char *const *base, int64_t row_begin, int64_t row_end,
                     int64_t col_begin, int64_t col_end, kiln_inner_fn fn, void *ctx) {
    int outer = p->ndim - 1;
    int64_t idx[KILN_MAX_DIMS];
    char *ptrs[MAX_OPS];
    int64_t inner_strides[MAX_OPS];
    for (int k = 0; k < p->nops; k++) inner_strides[k] = p->bstrides[k][outer];
    for (int64_t row = row_begin; row < row_end; row++) {
        int64_t r = row;
        for (int d = outer - 1; d >= 0; d--) {
            idx[d] = r % p->shape[d];
            r /= p->shape[d];
        }
        for (int k = 0; k < p->nops; k++) {
            char *q = base[k] + col_begin * inner_strides[k];
            for (int d = 0; d < outer; d++) q += idx[d] * p->bstrides[k][d];
            ptrs[k] = q;
        }
        fn(ctx, col_end - col_begin, ptrs, inner_strides);
    }
}

void kiln_iterate(int nops, char *const *base, const size_t *itemsize,
                  const int64_t (*strides)[KILN_MAX_DIMS], int ndim, const int64_t *shape,
                  kiln_inner_fn fn, void *ctx) {
    KILN_ASSERT(nops <= MAX_OPS);
    int64_t total = kiln_shape_numel(ndim, shape);
    if (total == 0) return;
    loop_plan p;
    plan_loop(&p, nops, itemsize, strides, ndim, shape);
    int64_t inner = p.shape[p.ndim - 1];
    int64_t rows = total / inner;
    int threads = total >= KILN_PARALLEL_MIN ? omp_get_max_threads() : 1;
    if (threads <= 1) {
        run_rows(&p, base, 0, rows, 0, inner, fn, ctx);
        return;
    }
    if (rows >= threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int t = 0; t < threads; t++)
            run_rows(&p, base, rows * t / threads, rows * (t + 1) / threads, 0, inner, fn, ctx);
    } else {
        /* few long rows: split the inner axis into chunks aligned to 64 elements */
#pragma omp parallel for schedule(static) num_threads(threads) collapse(2)
        for (int64_t row = 0; row < rows; row++)
            for (int t = 0; t < threads; t++) {
                int64_t b = (inner * t / threads) & ~(int64_t)63, e = t == threads - 1 ? inner : (inner * (t + 1) / threads) & ~(int64_t)63;
                if (e > b) run_rows(&p, base, row, row + 1, b, e, fn, ctx);
            }
    }
}

int kiln_num_threads(void) { return omp_get_max_threads(); }

kiln_status kiln_set_num_threads(int64_t n) {
    if (n < 1 || n > KILN_MAX_THREADS)
        return kiln_error(KILN_ERR_VALUE, "set_num_threads: the count must be between 1 and %d, got %lld",
                          KILN_MAX_THREADS, (long long)n);
    omp_set_num_threads((int)n);
    return KILN_OK;
}
