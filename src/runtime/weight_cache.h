/* The casts of captured tensors a compiled graph keeps from one call to the next (the plan's
 * weight_cast nodes, src/plan/weight_casts.c): under amp, the float32 master weights cast to bfloat16
 * or float16 once, not on every call. Each entry remembers the tensor it cast, that tensor's storage
 * and the storage's version; a call whose capture is the same tensor at the same version reuses the
 * result (bit for bit what the cast would compute again), any in-place write (an optimizer step,
 * set_data, assign, copy_, load_param_into_net) bumps the version and the next call casts again. A
 * storage whose writes may skip the version (handed to NumPy or DLPack writable, or wrapping another
 * owner's memory: kiln_tensor_version_complete) is cast on every call. */
#ifndef KILN_RUNTIME_WEIGHT_CACHE_H
#define KILN_RUNTIME_WEIGHT_CACHE_H

#include "../plan/plan.h"

typedef struct kiln_weight_cache kiln_weight_cache;

/* A cache for plan p's weight casts; *out NULL when the plan has none. */
kiln_status kiln_weight_cache_new(const kiln_plan *p, kiln_weight_cache **out);
void kiln_weight_cache_free(kiln_weight_cache *c);
/* Node `node` (a weight cast) of this call: its result in *out (a new reference: the entry's buffer,
 * made at the first call, or `buffer` when given: a backend's own tensor for it), cast from src only
 * when the buffer does not already hold src's cast at src's version. */
kiln_status kiln_weight_cache_run(kiln_weight_cache *c, int32_t node, kiln_tensor *src, kiln_tensor *buffer,
                                  kiln_tensor **out);
/* Totals of this process: calls of weight casts that reused the kept result, and those that cast. */
void kiln_weight_cache_counts(int64_t *hits, int64_t *misses);

#endif
