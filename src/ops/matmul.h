/* Matrix products with an epilogue: the kernels of matmul and linear, for the ops that fold
 * elementwise work into them (matmul_epilogue). */
#ifndef KILN_MATMUL_H
#define KILN_MATMUL_H

#include "../core/internal.h"

/* Called on each block of the product once it is computed (from any of the OpenMP threads, on
 * disjoint blocks): rows [row0, row0 + rows) x columns [col0, col0 + cols) of the output viewed
 * as (numel / N, N), N its last matrix dimension (1 for a vector result). */
typedef struct kiln_mm_epilogue {
    void (*fn)(void *ctx, int64_t row0, int64_t rows, int64_t col0, int64_t cols);
    void *ctx;
} kiln_mm_epilogue;

/* out (allocated with matmul's / linear's inferred meta) = a @ b, or x @ w.T + bias (bias may
 * be NULL); then `epi` (may be NULL) on every block. */
kiln_status kiln_matmul_into(kiln_tensor *a, kiln_tensor *b, kiln_tensor *out, const kiln_mm_epilogue *epi);
kiln_status kiln_linear_into(kiln_tensor *x, kiln_tensor *w, kiln_tensor *bias, kiln_tensor *out,
                             const kiln_mm_epilogue *epi);

/* Whether a float product of m1 rows and one of m2 rows (each n columns, k deep) sum every element
 * with the same kernel, so that the rows of the one are bitwise the rows of the other (the
 * hoist_loop_projections pass: one GEMM over every step's rows for one per step). */
bool kiln_matmul_rows_same_sums(int64_t m1, int64_t m2, int64_t n, int64_t k);

/* OpenBLAS single-threaded, as kiln's kernels call it (each spreads its GEMMs over its own OpenMP
 * threads). Call on the caller's thread, outside parallel regions, before calling cblas_*gemm in
 * a kernel's own parallel region. */
void kiln_mm_single_threaded_blas(void);

#endif
