/* Counter-based random streams behind rand, randn and dropout.
 *
 * Draw k of the global generator is a hash (SplitMix64) of (key, k); kiln_manual_seed sets the
 * key and rewinds the counter. A bulk op reserves a block of counters once and gives element i
 * the draw at base + i, so its values do not depend on how many threads fill it. */
#ifndef KILN_CORE_RANDOM_H
#define KILN_CORE_RANDOM_H

#include <stdint.h>

typedef struct kiln_random_stream {
    uint64_t key, base;
} kiln_random_stream;

/* Reserves `count` consecutive draws of the global generator. */
kiln_random_stream kiln_random_reserve(uint64_t count);

static inline uint64_t kiln_random_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Draw i of a reserved block: 64 random bits. */
static inline uint64_t kiln_random_bits(const kiln_random_stream *s, uint64_t i) {
    return kiln_random_mix(s->key + (s->base + i + 1) * 0x9E3779B97F4A7C15ull);
}

/* Uniform in [0, 1) from the top 53 bits. */
static inline double kiln_random_to_unit(uint64_t bits) { return (double)(bits >> 11) * 0x1.0p-53; }

#endif
