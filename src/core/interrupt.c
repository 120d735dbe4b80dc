/* Interrupt requests: a flag set from a signal handler (kiln_interrupt is async-signal-safe: one
 * lock-free atomic store) and read by the executors between kernels and loop iterations
 * (kiln_check_interrupt, internal.h). Whoever handles the interrupt clears it. */
#include <pthread.h>

#include "internal.h"

_Atomic int kiln_interrupt_flag;
static _Atomic uint64_t only_thread; /* 0: every thread's runs stop */

_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "kiln_interrupt must be async-signal-safe");
_Static_assert(sizeof(pthread_t) <= sizeof(uint64_t), "thread ids fit 64 bits");
_Static_assert(sizeof kiln_interrupt_flag == sizeof(int), "generated code reads the flag as a volatile int");

void kiln_interrupt(void) { atomic_store(&kiln_interrupt_flag, 1); }

bool kiln_interrupt_requested(void) { return atomic_load(&kiln_interrupt_flag) != 0; }

void kiln_interrupt_clear(void) { atomic_store(&kiln_interrupt_flag, 0); }

void kiln_interrupt_only_thread(uint64_t id) { atomic_store(&only_thread, id); }

kiln_status kiln_interrupt_status(void) {
    if (!atomic_load(&kiln_interrupt_flag)) return KILN_OK;
    uint64_t only = atomic_load(&only_thread);
    if (only != 0 && only != (uint64_t)pthread_self()) return KILN_OK;
    return kiln_error(KILN_ERR_INTERRUPTED, "interrupted");
}
