/* The one place kiln allocates: kiln_malloc / kiln_calloc / kiln_realloc (plain blocks, freed
 * with free()) and kiln_alloc / kiln_free (64-byte aligned blocks for tensor data, large ones
 * cached), with the byte counters of kiln_memory_in_use and, for tests, fault injection: after
 * kiln_alloc_fail_nth(n, persist) the n-th allocation made through any of them fails (and, with
 * persist, every one after it), as the system's would (NULL, KILN_ERR_MEMORY), so the tests can
 * check that every failure is handled. */
#include "internal.h"
#include "profile.h"

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

/* ---- fault injection ------------------------------------------------------------------- */

static _Atomic bool fault_armed;    /* read by every allocation: off, it costs one relaxed load */
static _Atomic int64_t fault_count; /* allocations since kiln_alloc_fail_nth */
static _Atomic int64_t fault_nth;
static _Atomic bool fault_fired, fault_persist;

void kiln_alloc_fail_nth(int64_t n, bool persist) {
    atomic_store(&fault_armed, false);
    atomic_store(&fault_count, 0);
    atomic_store(&fault_nth, n);
    atomic_store(&fault_persist, persist);
    atomic_store(&fault_fired, false);
    atomic_store(&fault_armed, n > 0);
}

int64_t kiln_alloc_count(void) { return atomic_load(&fault_count); }
bool kiln_alloc_fault_fired(void) { return atomic_load(&fault_fired); }

/* Whether this allocation is the one to fail. */
static bool inject_failure(void) {
    if (!atomic_load_explicit(&fault_armed, memory_order_relaxed)) return false;
    int64_t k = atomic_fetch_add(&fault_count, 1) + 1, n = atomic_load(&fault_nth);
    if (k < n || (k > n && !atomic_load(&fault_persist))) return false;
    atomic_store(&fault_fired, true);
    return true;
}

static void *out_of_memory(size_t nbytes) {
    kiln_error(KILN_ERR_MEMORY, "out of memory allocating %zu bytes", nbytes);
    return NULL;
}

/* ---- plain blocks ---------------------------------------------------------------------- */

void *kiln_malloc(size_t nbytes) {
    void *p = inject_failure() ? NULL : malloc(nbytes ? nbytes : 1);
    return p ? p : out_of_memory(nbytes);
}

void *kiln_calloc(size_t count, size_t size) {
    size_t nbytes;
    if (__builtin_mul_overflow(count, size, &nbytes)) return out_of_memory(SIZE_MAX);
    void *p = inject_failure() ? NULL : calloc(count ? count : 1, size ? size : 1);
    return p ? p : out_of_memory(nbytes);
}

void *kiln_realloc(void *p, size_t nbytes) {
    void *q = inject_failure() ? NULL : realloc(p, nbytes ? nbytes : 1);
    return q ? q : out_of_memory(nbytes); /* p is still valid (and still the caller's) */
}

/* Bytes of physical memory (a request beyond it cannot be held: it fails as out of memory
 * instead of reaching the system allocator, which may abort on absurd sizes under sanitizers). */
static size_t physical_memory(void) {
    static _Atomic size_t cached;
    size_t v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (!v) {
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        v = pages > 0 && page > 0 && (size_t)pages <= SIZE_MAX / (size_t)page ? (size_t)pages * (size_t)page
                                                                              : (size_t)1 << 40;
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return v;
}

static void *system_aligned_alloc(size_t nbytes) {
    if (nbytes > physical_memory()) return NULL;
    return inject_failure() ? NULL : aligned_alloc(KILN_ALIGN, nbytes);
}

/* ---- aligned blocks for tensor data ----------------------------------------------------- */

/* Large blocks are cached after free and reused for the next request of the same rounded
 * size: fresh large allocations come from mmap and pay a page fault per 4 KiB on first touch,
 * which costs as much as the kernels that fill them. Small blocks go straight to malloc. */
#define CACHE_MIN_BYTES ((size_t)1 << 20)
#define CACHE_ROUND ((size_t)1 << 16)
#define CACHE_SLOTS 64
#define CACHE_MAX_BYTES ((size_t)4 << 30)

typedef struct {
    void *ptr;
    size_t bytes;
} cached_block;

static struct {
    pthread_mutex_t lock;
    cached_block slots[CACHE_SLOTS];
    int count;
    size_t total;
} block_cache = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Each large block carries its rounded size in a header of KILN_ALIGN bytes. */
static size_t large_round(size_t nbytes) { return (nbytes + KILN_ALIGN + CACHE_ROUND - 1) / CACHE_ROUND * CACHE_ROUND; }

static _Atomic size_t bytes_in_use, bytes_peak;

static void count_alloc(size_t bytes) {
    size_t now = atomic_fetch_add_explicit(&bytes_in_use, bytes, memory_order_relaxed) + bytes;
    size_t peak = atomic_load_explicit(&bytes_peak, memory_order_relaxed);
    while (now > peak && !atomic_compare_exchange_weak_explicit(&bytes_peak, &peak, now, memory_order_relaxed,
                                                                memory_order_relaxed)) {
    }
    if (kiln_profiling()) kiln_profile_alloc((int64_t)bytes, (int64_t)now, (int64_t)(now > peak ? now : peak));
}

size_t kiln_memory_in_use(void) { return atomic_load_explicit(&bytes_in_use, memory_order_relaxed); }
size_t kiln_memory_peak(void) { return atomic_load_explicit(&bytes_peak, memory_order_relaxed); }
void kiln_memory_reset_peak(void) { atomic_store_explicit(&bytes_peak, kiln_memory_in_use(), memory_order_relaxed); }

void *kiln_alloc(size_t nbytes) {
    if (nbytes >= CACHE_MIN_BYTES) {
        size_t bytes = large_round(nbytes);
        void *block = NULL;
        pthread_mutex_lock(&block_cache.lock);
        for (int k = block_cache.count - 1; k >= 0; k--)
            if (block_cache.slots[k].bytes == bytes) {
                block = block_cache.slots[k].ptr;
                block_cache.total -= bytes;
                block_cache.slots[k] = block_cache.slots[--block_cache.count];
                break;
            }
        pthread_mutex_unlock(&block_cache.lock);
        if (!block) block = system_aligned_alloc(bytes);
        if (!block) {
            kiln_error(KILN_ERR_MEMORY, "out of memory allocating %zu bytes", nbytes);
            return NULL;
        }
        *(size_t *)block = bytes;
        count_alloc(bytes);
        return (char *)block + KILN_ALIGN;
    }
    size_t rounded = ((nbytes + KILN_ALIGN - 1) / KILN_ALIGN) * KILN_ALIGN + KILN_ALIGN;
    char *p = system_aligned_alloc(rounded);
    if (!p) {
        kiln_error(KILN_ERR_MEMORY, "out of memory allocating %zu bytes", nbytes);
        return NULL;
    }
    *(size_t *)p = 0; /* small: not cached */
    *(size_t *)(p + sizeof(size_t)) = rounded;
    count_alloc(rounded);
    return p + KILN_ALIGN;
}

void kiln_free(void *p) {
    if (!p) return;
    char *block = (char *)p - KILN_ALIGN;
    size_t bytes = *(size_t *)block;
    size_t freed = bytes ? bytes : *(size_t *)(block + sizeof(size_t));
    size_t left = atomic_fetch_sub_explicit(&bytes_in_use, freed, memory_order_relaxed) - freed;
    if (kiln_profiling()) kiln_profile_alloc(-(int64_t)freed, (int64_t)left, (int64_t)kiln_memory_peak());
    if (bytes) {
        pthread_mutex_lock(&block_cache.lock);
        if (block_cache.count < CACHE_SLOTS && block_cache.total + bytes <= CACHE_MAX_BYTES) {
            block_cache.slots[block_cache.count++] = (cached_block){block, bytes};
            block_cache.total += bytes;
            block = NULL;
        }
        pthread_mutex_unlock(&block_cache.lock);
    }
    free(block);
}

void kiln_alloc_trim(void) {
    pthread_mutex_lock(&block_cache.lock);
    for (int k = 0; k < block_cache.count; k++) free(block_cache.slots[k].ptr);
    block_cache.count = 0;
    block_cache.total = 0;
    pthread_mutex_unlock(&block_cache.lock);
}
