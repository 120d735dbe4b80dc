/* Generated C for fused elementwise groups (emit_c.c) and the driver that compiles it with the
 * system C compiler into cached shared objects (compiler.c). */
#ifndef KILN_CODEGEN_H
#define KILN_CODEGEN_H

#include "../core/internal.h"

#include "kiln/graph.h"

/* The generated entry point. ptrs[0] is the output, ptrs[1 + k] input k; the iteration has
 * `ndim` (>= 1) axes of sizes shape[], the last one the inner loop (a row kernel's rows);
 * strides[op * KILN_MAX_DIMS + d] is the byte stride of operand op along axis d. The inner
 * strides must fit what the function was generated for (0 for FIXED operands, the item size for
 * UNIT ones, any multiple of the item size for STRIDED ones). The output must not overlap an
 * input. */
typedef void (*kiln_fused_fn)(char *const *ptrs, int ndim, const int64_t *shape, const int64_t *strides);

/* How an operand moves along the kernel's inner axis (a row kernel's reduced axis). */
enum { KILN_INNER_FIXED = 0, KILN_INNER_UNIT = 1, KILN_INNER_STRIDED = 2 };

/* Whether the C emitter handles sub: fusable nodes (src/ir/fusion.h), inputs only (no captures), one output;
 * with row ops, every row op reads the group's space (kiln_codegen_space) and every other
 * value broadcasts to it, a reduction without keepdims only as the output. */
bool kiln_codegen_supports(const kiln_graph *sub);
/* Whether sub has row ops (its kernel walks rows of its space, reducing along them). */
bool kiln_codegen_has_rows(const kiln_graph *sub);
/* The iteration space of sub's kernel: its output's shape, or for row kernels the shape of the
 * rows its row ops read. */
void kiln_codegen_space(const kiln_graph *sub, int *ndim, int64_t *shape);
/* C source of sub's kernel. inner_kind[op] (op 0 = output, 1 + k = input k) says how the
 * operand moves along the inner axis (KILN_INNER_*; a row kernel's per-row operands are
 * FIXED). The function's name is written to symbol (kiln_fused_<16 hex digits>, a hash of the
 * code); every name the source defines derives from it and its prelude is guarded, so the
 * sources of several kernels concatenate into one translation unit. *source is malloc'd. */
kiln_status kiln_codegen_emit(const kiln_graph *sub, const int8_t *inner_kind, char **source, char symbol[48]);

/* Compiles `source` (or finds it in the memory or disk cache) and returns the address of
 * `symbol` in the loaded object. KILN_ERR_NOT_IMPLEMENTED when there is no usable C compiler
 * (one warning per process on stderr); KILN_ERR_RUNTIME when compiling fails (one warning). */
kiln_status kiln_codegen_load(const char *source, const char *symbol, void **fn);
/* The same for n kernels, those not loaded yet built by one compiler run into one object (cached
 * on disk under the key of their concatenation). */
kiln_status kiln_codegen_load_many(int n, const char *const *sources, const char *const *symbols, void **fns);
/* Only what is loaded or in the disk cache (no compiler run): true with every fns[k] set. */
bool kiln_codegen_load_cached(int n, const char *const *sources, const char *const *symbols, void **fns);

/* ---- background builds (background.c) ----
 * With background builds on (kiln_codegen_set_background; KILN_BACKGROUND_COMPILE=1 at start-up),
 * callers that can run interpreted hand their sources to one builder thread instead of running
 * the compiler themselves: kiln_codegen_load_later copies them and returns at once; when the
 * object is built each *targets[k] receives its function (an atomic release store; never
 * written when the build fails: the caller's interpreted path stays). kiln_codegen_forget(t):
 * target t is never written after it returns (its memory may go). kiln_codegen_wait: until no
 * build is queued or running. */
void kiln_codegen_set_background(bool on);
bool kiln_codegen_background(void);
kiln_status kiln_codegen_load_later(int n, const char *const *sources, const char *const *symbols, void **const *targets);
void kiln_codegen_forget(void **target);
void kiln_codegen_wait(void);

/* Whether a C compiler is there (probed once per process; one warning on stderr when not). */
bool kiln_codegen_available(void);
/* Only what is already loaded in this process: true with *fn set, else false (nothing built). */
bool kiln_codegen_find(const char *source, const char *symbol, void **fn);

/* A 64-bit hash of n bytes (not cryptographic: cache keys and names). */
uint64_t kiln_codegen_hash(const void *data, size_t n, uint64_t seed);

/* Counters for tests and benchmarks (totals of this process). */
typedef struct kiln_codegen_stats {
    int64_t compiles;    /* compiler runs (one object each, of one or more kernels) */
    int64_t disk_hits;   /* objects loaded from the disk cache */
    int64_t memory_hits; /* kernels found in an object already loaded */
    int64_t rebuilt;     /* corrupt or truncated cache entries replaced */
    double compile_seconds;
} kiln_codegen_stats;
void kiln_codegen_get_stats(kiln_codegen_stats *out);

#endif
