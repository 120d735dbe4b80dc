/* Timings for the linalg ops through kiln_apply: 1024^2 float32 matmul against cblas_sgemm
 * called directly, a tiny matmul, and a 3x3 128->128 conv on 1x128x256x256 float32 (forward,
 * backward_input, backward_weight). Prints the best of a few runs.
 * Build: gcc -O2 bench/c/bench_linalg.c -Iinclude -Isrc/ops -Isrc -Lbuild -lkiln -lopenblas */
#include <cblas.h>
#include <stdio.h>
#include <time.h>

#include "core/internal.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static kiln_tensor *filled(int nd, const int64_t *shape) {
    kiln_tensor *t = NULL;
    if (kiln_tensor_empty(KILN_DTYPE_FLOAT32, nd, shape, &t) != KILN_OK) exit(1);
    float *p = t->data;
    for (int64_t i = 0; i < t->numel; i++) p[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    return t;
}

static double best_apply(kiln_op op, int nin, kiln_tensor **ins, const kiln_attrs *at, int reps) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        kiln_tensor *y = NULL;
        double t0 = now();
        if (kiln_apply(op, nin, ins, at, &y) != KILN_OK) {
            fprintf(stderr, "%s\n", kiln_last_error());
            exit(1);
        }
        double t = now() - t0;
        if (r && t < best) best = t; /* the first run creates primitives */
        kiln_tensor_release(y);
    }
    return best;
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 5;
    int64_t s[2] = {1024, 1024};
    kiln_tensor *a = filled(2, s), *b = filled(2, s), *c = filled(2, s), *ins[3] = {a, b, NULL};
    double blas = 1e30, mm = 1e30;
    for (int r = 0; r < 4 * reps + 1; r++) { /* interleaved, best of each */
        double t0 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1024, 1024, 1024, 1, a->data, 1024, b->data, 1024, 0,
                    c->data, 1024);
        double t1 = now();
        kiln_tensor *y = NULL;
        if (kiln_apply(KILN_OP_MATMUL, 2, ins, NULL, &y) != KILN_OK) exit(1);
        double t2 = now();
        kiln_tensor_release(y);
        if (r && t1 - t0 < blas) blas = t1 - t0;
        if (r && t2 - t1 < mm) mm = t2 - t1;
    }
    printf("matmul 1024^2 f32: kiln %.2f ms, cblas_sgemm %.2f ms, ratio %.3f\n", mm * 1e3, blas * 1e3, blas / mm);
    int64_t s23[2] = {2, 3}, s32[2] = {3, 2};
    kiln_tensor *sa = filled(2, s23), *sb = filled(2, s32), *sins[2] = {sa, sb};
    double t0 = now();
    for (int r = 0; r < 100000; r++) {
        kiln_tensor *y;
        kiln_apply(KILN_OP_MATMUL, 2, sins, NULL, &y);
        kiln_tensor_release(y);
    }
    printf("matmul 2x3 @ 3x2 through kiln_apply: %.0f ns per call\n", (now() - t0) * 1e4);

    int64_t xs[4] = {1, 128, 256, 256}, ws[4] = {128, 128, 3, 3}, bs[1] = {128};
    kiln_tensor *x = filled(4, xs), *w = filled(4, ws), *bias = filled(1, bs), *gy = filled(4, xs);
    kiln_attrs at;
    kiln_attrs_clear(&at);
    int64_t conv[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    for (int k = 0; k < 9; k++) kiln_attrs_push_int(&at, conv[k]);
    kiln_tensor *cins[3] = {x, w, bias};
    double fwd = best_apply(KILN_OP_CONV2D, 3, cins, &at, reps);
    for (int k = 0; k < 4; k++) kiln_attrs_push_int(&at, xs[k]);
    kiln_tensor *bins[2] = {gy, w};
    double bi = best_apply(KILN_OP_CONV2D_BACKWARD_INPUT, 2, bins, &at, reps);
    at.ni = 9;
    for (int k = 0; k < 4; k++) kiln_attrs_push_int(&at, ws[k]);
    kiln_tensor *wins[2] = {x, gy};
    double bw = best_apply(KILN_OP_CONV2D_BACKWARD_WEIGHT, 2, wins, &at, reps);
    printf("conv2d 3x3 128->128 1x128x256x256 f32: forward %.1f ms, backward_input %.1f ms, backward_weight %.1f ms, "
           "forward+backward %.1f ms\n", fwd * 1e3, bi * 1e3, bw * 1e3, (fwd + bi + bw) * 1e3);

    int64_t ps[4] = {8, 64, 112, 112}, pys[4] = {8, 64, 56, 56};
    kiln_tensor *px = filled(4, ps), *pgy = filled(4, pys);
    kiln_attrs pa;
    kiln_attrs_clear(&pa);
    int64_t pool[12] = {3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 0, 1};
    for (int k = 0; k < 12; k++) kiln_attrs_push_int(&pa, pool[k]);
    double mp = best_apply(KILN_OP_MAX_POOL2D, 1, &px, &pa, 2 * reps + 1);
    kiln_tensor *pins[2] = {pgy, px};
    double mpb = best_apply(KILN_OP_MAX_POOL2D_BACKWARD, 2, pins, &pa, 2 * reps + 1);
    double ap = best_apply(KILN_OP_AVG_POOL2D, 1, &px, &pa, 2 * reps + 1);
    for (int k = 0; k < 4; k++) kiln_attrs_push_int(&pa, ps[k]);
    double apb = best_apply(KILN_OP_AVG_POOL2D_BACKWARD, 1, &pgy, &pa, 2 * reps + 1);
    printf("pool 3x3/2 pad 1 on 8x64x112x112 f32: max %.2f ms, max backward %.2f ms, avg %.2f ms, avg backward %.2f ms\n",
           mp * 1e3, mpb * 1e3, ap * 1e3, apb * 1e3);
    return 0;
}
