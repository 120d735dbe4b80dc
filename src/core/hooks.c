/* The hooks and thread state core and ops share with the tracer and autograd (hooks.h), and
 * grad mode. */
#include "hooks.h"

kiln_layer_hooks kiln_hooks;

_Thread_local kiln_tracer *kiln_trace_active;
_Thread_local bool kiln_trace_in_body;

_Thread_local bool kiln_grad_disabled;

bool kiln_grad_enabled(void) { return !kiln_grad_disabled; }

bool kiln_set_grad_enabled(bool enabled) {
    bool prev = !kiln_grad_disabled;
    kiln_grad_disabled = !enabled;
    return prev;
}
