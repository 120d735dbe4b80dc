/* The cost model of fused attention against the unfused ops, in sgemm-peak flops (flop
 * equivalents). Per score element (one query row against one key) it counts:
 *   - the products, each 2 K flops (K its inner size) divided by a GEMM efficiency
 *     1 / (1 + TILE / M + TILE / N + TILE / K) for its block shape (the fused kernel's blocks are
 *     at most 64 x 256, the unfused ops' matrices whole per head), and CALL flops per GEMM call
 *     (per block pair for the fused kernel, per head for the unfused ops);
 *   - the exponential and the row bookkeeping (EXP_FLOPS; the fused backward recomputes them);
 *   - the unfused ops' passes over the materialized score matrix (matmul, scale, mask, softmax,
 *     matmul forward; ten more backward), each byte costing by where the whole matrix fits: the
 *     threads' L2 caches, the last-level cache, or memory;
 *   - the fused kernel's parallel split (forward: a task per head and query block; backward: one
 *     per kv head), an idle share when the tasks do not fill the threads;
 *   - causal attention: the fused kernel computes only the key blocks a query block sees.
 * The constants were fitted to bench/bench_flash.py's quiet run on this project's 2-core AVX2 EPYC
 * (docs/dev/benchmarks.md, "Attention core": fused / unfused 1.06-1.10 forward and 1.18-1.29
 * forward + backward at 8 heads x 256 keys, 0.91-1.01 and 1.03-1.13 at 32 heads x 512 keys, 0.94-0.97
 * forward at 8 heads x 1024 keys, head dim 128) and to the unfused forward at 4 x 2048 tokens running
 * at about half the sgemm peak (issue 33). The CPU enters by its thread count and its L2 and
 * last-level cache sizes. */
#include "attention_cost.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TILE 8.0          /* GEMM packing and edge overhead, per row / column / depth */
#define CALL 20000.0      /* one GEMM call's fixed cost */
#define EXP_FLOPS 20.0    /* exp, row maximum and sum per score */
#define L2_BYTE 0.2       /* a byte of the score matrix read or written: in the L2 caches, */
#define LLC_BYTE 4.5      /* in the last-level cache (shared with the other cores' work), */
#define DRAM_BYTE 20.0    /* from memory */
#define REFERENCE_SLOWDOWN 20.0 /* float64: the fused op runs its reference loops */
#define MARGIN 0.98       /* fused only when estimated this much cheaper: the ops as written win ties */
#define FUSED_BR 64
#define FUSED_BC 256

static double eff(double m, double n, double k) {
    if (m < 1 || n < 1 || k < 1) return 1.0;
    return 1.0 / (1.0 + TILE / m + TILE / n + TILE / k);
}

static double dmin(double a, double b) { return a < b ? a : b; }

/* The L2 cache (per core) and last-level cache sizes in bytes, 0 where unknown */
static double cache_bytes(int level) {
    long b = -1;
#ifdef _SC_LEVEL3_CACHE_SIZE
    b = sysconf(level == 2 ? _SC_LEVEL2_CACHE_SIZE : _SC_LEVEL3_CACHE_SIZE);
#endif
    return b > 0 ? (double)b : 0.0;
}

/* The share of busy threads when `tasks` equal tasks run on `threads` */
static double fill(double tasks, double threads) {
    if (tasks <= 0 || threads <= 1) return 1.0;
    double rounds = (double)(int64_t)((tasks + threads - 1) / threads);
    return tasks / (rounds * threads);
}

void kiln_attention_choose(const kiln_attention_case *c, kiln_attention_choice *out) {
    memset(out, 0, sizeof *out);
    double Lq = (double)c->Lq, Lk = (double)c->Lk, D = (double)c->D, Dv = (double)c->Dv, heads = (double)c->heads;
    double n = heads * Lq * Lk, threads = (double)omp_get_max_threads();
    double bc = dmin(FUSED_BC, Lk), br = dmin(FUSED_BR, Lq);
    /* the unfused ops: where the score matrix lives */
    double l2 = cache_bytes(2) * threads, llc = cache_bytes(3);
    if (llc <= 0) llc = 16.0 * (1 << 20);
    if (l2 <= 0) l2 = llc / 16;
    double elem = (double)kiln_dtype_size(c->dtype), s_bytes = n * elem;
    double per_byte = s_bytes <= l2 ? L2_BYTE : s_bytes <= llc ? LLC_BYTE : DRAM_BYTE;
    const char *where = s_bytes <= l2 ? "the L2 caches" : s_bytes <= llc ? "the last-level cache" : "memory";
    double fwd_passes = 6 + ((c->masked || c->causal) ? 2 : 0) + (c->dropout ? 3 : 0);
    double per_head = Lq * Lk > 0 ? CALL / (Lq * Lk) : 0;
    double u = 2 * D / eff(Lq, Lk, D) + 2 * Dv / eff(Lq, Dv, Lk) + 2 * per_head + EXP_FLOPS +
               fwd_passes * elem * per_byte;
    if (c->backward)
        u += 2 * Dv / eff(Lq, Lk, Dv) + 2 * Dv / eff(Lk, Dv, Lq) + 2 * D / eff(Lq, D, Lk) + 2 * D / eff(Lk, D, Lq) +
             4 * per_head + 10 * elem * per_byte;
    /* the fused kernel: the share of scores it computes, and its threads' fill */
    double seen = 1.0;
    if (c->causal && c->Lq > 0 && c->Lk > 0) {
        double total = 0;
        for (int64_t i0 = 0; i0 < c->Lq; i0 += FUSED_BR) {
            int64_t rows = c->Lq - i0 < FUSED_BR ? c->Lq - i0 : FUSED_BR;
            total += (double)rows * dmin(Lk, (double)(i0 + rows));
        }
        seen = total / (Lq * Lk);
    }
    double per_block = br * bc > 0 ? CALL / (br * bc) : 0;
    double qblocks = (double)((c->Lq + FUSED_BR - 1) / FUSED_BR);
    double f = (2 * D / eff(br, bc, D) + 2 * Dv / eff(br, Dv, bc) + 2 * per_block + EXP_FLOPS + 4) /
               fill(heads * qblocks, threads);
    if (c->backward) /* one task per kv head: taken as one per query head (the group shares it) */
        f += (2 * D / eff(br, bc, D) + 2 * Dv / eff(bc, Dv, br) + 2 * Dv / eff(br, bc, Dv) + 2 * D / eff(br, D, bc) +
              2 * D / eff(bc, D, br) + 5 * per_block + EXP_FLOPS + 3) /
             fill(heads, threads);
    f *= seen;
    if (c->dtype == KILN_DTYPE_FLOAT64) f *= REFERENCE_SLOWDOWN;
    out->fused_cost = f * n / 2, out->unfused_cost = u * n / 2;
    const char *force = getenv("KILN_ATTENTION");
    if (c->dropout) {
        out->fused = false;
        snprintf(out->why, sizeof out->why, "dropout on the probabilities: the fused kernel has none");
    } else if (force && (strcmp(force, "fused") == 0 || strcmp(force, "unfused") == 0)) {
        out->fused = force[0] == 'f';
        snprintf(out->why, sizeof out->why, "KILN_ATTENTION=%s", force);
    } else {
        out->fused = out->fused_cost < MARGIN * out->unfused_cost;
        snprintf(out->why, sizeof out->why, "estimated fused %.3g vs unfused %.3g multiply-adds, the scores in %s%s%s",
                 out->fused_cost, out->unfused_cost, where, c->causal ? "; causal: fused skips masked key blocks" : "",
                 c->dtype == KILN_DTYPE_FLOAT64 ? "; float64: the fused op runs reference loops" : "");
    }
}
