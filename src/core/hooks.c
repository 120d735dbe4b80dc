/* The hooks and thread state core and ops share with the tracer and autograd (hooks.h), and
 * grad mode. */
#include "hooks.h"

kiln_layer_hooks kiln_hooks;

_Thread_local kiln_thread_state kiln_thread;

bool kiln_grad_enabled(void) { return !kiln_thread.grad_disabled; }

bool kiln_set_grad_enabled(bool enabled) {
    bool prev = !kiln_thread.grad_disabled;
    kiln_thread.grad_disabled = !enabled;
    return prev;
}
