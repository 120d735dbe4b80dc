/* The global random generator: SplitMix64 over a counter (see random.h). */
#include <math.h>
#include <stdatomic.h>

#include "internal.h"
#include "random.h"

static _Atomic uint64_t random_key = 0xE220A8397B1DCDAFull; /* as after kiln_manual_seed(0) */
static _Atomic uint64_t random_counter;

void kiln_manual_seed(uint64_t seed) {
    atomic_store(&random_key, kiln_random_mix(seed + 0x9E3779B97F4A7C15ull));
    atomic_store(&random_counter, 0);
}

void kiln_random_get_state(uint64_t *key, uint64_t *counter) {
    *key = atomic_load(&random_key);
    *counter = atomic_load(&random_counter);
}

void kiln_random_set_state(uint64_t key, uint64_t counter) {
    atomic_store(&random_key, key);
    atomic_store(&random_counter, counter);
}

kiln_random_stream kiln_random_reserve(uint64_t count) {
    kiln_random_stream s;
    s.key = atomic_load_explicit(&random_key, memory_order_relaxed);
    s.base = atomic_fetch_add_explicit(&random_counter, count, memory_order_relaxed);
    return s;
}

uint64_t kiln_random_next(void) {
    kiln_random_stream s = kiln_random_reserve(1);
    return kiln_random_bits(&s, 0);
}

double kiln_random_uniform(void) { return kiln_random_to_unit(kiln_random_next()); }

/* Box-Muller over two draws. */
double kiln_random_normal(void) {
    kiln_random_stream s = kiln_random_reserve(2);
    double u1 = 1.0 - kiln_random_to_unit(kiln_random_bits(&s, 0)); /* (0, 1] */
    double u2 = kiln_random_to_unit(kiln_random_bits(&s, 1));
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
