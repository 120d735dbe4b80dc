/* kiln._C.apply_control: one control-flow node over bodies traced by nested Tracers (used by
 * kiln.ops.cond and kiln.ops.while_loop while a trace records). Arguments are borrowed; the
 * result is a new tuple. */
#include "pykiln.h"

#include "core/internal.h"
#include "ir/control.h"
#include "runtime/control_flow.h"

/* apply_control(kind, tracers, inputs[, trips[, for_gradient]]) -> tuple of tensors
 *   kind "if":    tracers (then, else), inputs (pred, operands...)
 *   kind "while": tracers (cond, body), inputs (loop values...); trips: the trip count when the
 *   caller knows it (> 0), which lets the loop's gradient store residuals (src/ir/control_grad.c);
 *   for_gradient: the caller will differentiate the result (inside kiln.grad): then the loop node
 *   itself stores them (kiln_while_for_gradient), so the gradient does not run the loop again
 * The bodies' captured tensors become extra inputs of the node (so gradients reach them); the
 * bodies are registered and the node runs through kiln_apply (eagerly, recorded by the active
 * trace and by autograd). */
static PyObject *py_apply_control(PyObject *self, PyObject *args) {
    (void)self;
    const char *kind;
    PyObject *tracers, *inputs;
    long long trips = 0;
    int for_gradient = 0;
    if (!PyArg_ParseTuple(args, "sOO|Lp:apply_control", &kind, &tracers, &inputs, &trips, &for_gradient)) return NULL;
    kiln_op op = strcmp(kind, "if") == 0 ? KILN_OP_IF : (strcmp(kind, "while") == 0 ? KILN_OP_WHILE : KILN_OP_COUNT);
    if (op == KILN_OP_COUNT) return PyErr_Format(PyExc_ValueError, "apply_control: unknown kind '%s'", kind);
    PyObject *tseq = PySequence_Fast(tracers, "apply_control: tracers must be a sequence");
    if (!tseq) return NULL;
    if (PySequence_Fast_GET_SIZE(tseq) != 2) {
        Py_DECREF(tseq);
        return PyErr_Format(PyExc_ValueError, "apply_control: %s takes two bodies", kind);
    }
    PyObject *iseq = PySequence_Fast(inputs, "apply_control: inputs must be a sequence of tensors");
    if (!iseq) {
        Py_DECREF(tseq);
        return NULL;
    }
    kiln_graph *bodies[2] = {NULL, NULL};
    int64_t ids[2] = {-1, -1}; /* registered for this call (a tape node recording it holds them too) */
    int64_t storing = -1;      /* the stored-residual body of a while recorded for a gradient */
    kiln_tensor **lifted = NULL, **in = NULL;
    int nlifted = 0;
    PyObject *result = NULL;
    Py_ssize_t nin = PySequence_Fast_GET_SIZE(iseq);
    for (int k = 0; k < 2; k++)
        if (!(bodies[k] = pykiln_tracer_take_body(PySequence_Fast_GET_ITEM(tseq, k)))) goto done;
    for (Py_ssize_t k = 0; k < nin; k++)
        if (!pykiln_is_tensor(PySequence_Fast_GET_ITEM(iseq, k))) {
            PyErr_Format(PyExc_TypeError, "apply_control: input %zd is not a Tensor", k);
            goto done;
        }
    kiln_status s = kiln_bodies_lift(2, bodies, &lifted, &nlifted);
    if (s != KILN_OK) {
        pykiln_raise(s);
        goto done;
    }
    in = PyMem_Malloc(sizeof *in * (size_t)(nin + nlifted + 1));
    if (!in) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < nin; k++) in[k] = pykiln_unwrap(PySequence_Fast_GET_ITEM(iseq, k));
    for (int k = 0; k < nlifted; k++) in[nin + k] = lifted[k];
    int nout = op == KILN_OP_IF ? bodies[0]->noutputs : (int)nin;
    kiln_attrs a = {.ni = KILN_A_IF_NI}; /* if and while: two bodies and the output count */
    a.i[KILN_A_CONTROL_NOUT] = nout;
    if (op == KILN_OP_WHILE && trips > 0) { /* a static trip count: the gradient may store residuals */
        a.ni = KILN_A_WHILE_NI;
        a.i[KILN_A_WHILE_BACKWARD] = -1;
        a.i[KILN_A_WHILE_TRIPS] = trips;
    }
    for (int k = 0; k < 2 && s == KILN_OK; k++) {
        kiln_graph *b = bodies[k];
        bodies[k] = NULL;
        s = kiln_body_register(b, &ids[k]);
        a.i[kiln_op_body_attr(op, k)] = ids[k];
    }
    kiln_tensor *out[KILN_MAX_OUTPUTS] = {0};
    if (s == KILN_OK && (nout < 1 || nout > KILN_MAX_OUTPUTS))
        s = kiln_error(KILN_ERR_VALUE, "%s: %d values (between 1 and %d are supported)", kiln_op_table[op].name, nout,
                       KILN_MAX_OUTPUTS);
    /* a while whose gradient will be taken stores its residuals as it runs (its extra outputs,
     * which only its gradient reads): the loop then runs forward once, not again in the gradient */
    if (s == KILN_OK && for_gradient && op == KILN_OP_WHILE && trips > 0 && nout >= 1 && nout <= KILN_MAX_OUTPUTS)
        s = kiln_while_for_gradient((int)nin + nlifted, in, &a, &storing);
    int nall = s == KILN_OK ? kiln_op_nout(op, &a) : nout; /* nout, and the residual buffers */
    if (s == KILN_OK && pykiln_interrupt_stale() < 0) goto done;
    pykiln_interrupt_arm(); /* a loop runs here, the GIL held: Ctrl-C stops it */
    if (s == KILN_OK) s = kiln_apply(op, (int)nin + nlifted, in, &a, out);
    if (s != KILN_OK) {
        pykiln_raise(s);
        goto done;
    }
    kiln_release_all(out + nout, nall - nout);
    result = PyTuple_New(nout);
    for (int k = 0; k < nout; k++) {
        PyObject *o = result ? pykiln_wrap(out[k]) : NULL;
        if (!o) {
            if (!result) kiln_tensor_release(out[k]);
            for (int j = k + 1; j < nout; j++) kiln_tensor_release(out[j]);
            Py_CLEAR(result);
            break;
        }
        PyTuple_SET_ITEM(result, k, o);
    }
done:
    kiln_graph_free(bodies[0]);
    kiln_graph_free(bodies[1]);
    kiln_body_release(ids[0]);
    kiln_body_release(ids[1]);
    kiln_body_release(storing);
    if (lifted) kiln_release_all(lifted, nlifted);
    free(lifted);
    PyMem_Free(in);
    Py_DECREF(tseq);
    Py_DECREF(iseq);
    return result;
}

/* loop_residual_budget([bytes]) -> int: the budget of a loop gradient's stored residuals
 * (kiln_loop_residual_budget), set first when bytes is given */
static PyObject *py_loop_residual_budget(PyObject *self, PyObject *args) {
    (void)self;
    long long bytes = -1;
    if (!PyArg_ParseTuple(args, "|L:loop_residual_budget", &bytes)) return NULL;
    if (PyTuple_GET_SIZE(args) && bytes < 0)
        return PyErr_Format(PyExc_ValueError, "loop_residual_budget: bytes must be >= 0, got %lld", bytes);
    if (PyTuple_GET_SIZE(args)) kiln_set_loop_residual_budget(bytes);
    return PyLong_FromLongLong(kiln_loop_residual_budget());
}

/* loop_body_runs() -> int: loop bodies run forward so far in this process (for tests) */
static PyObject *py_loop_body_runs(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromLongLong(kiln_loop_body_runs());
}

/* loop_packed_operands() -> int: loop-invariant GEMM operands loop gradients packed (for tests) */
static PyObject *py_loop_packed_operands(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromLongLong(kiln_loop_packed_operands());
}

/* live_bodies() -> int: control-flow bodies registered and not yet freed (for tests) */
static PyObject *py_live_bodies(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromLongLong(kiln_body_live_count());
}

PyMethodDef pykiln_control_functions[] = {
    {"apply_control", py_apply_control, METH_VARARGS,
     "apply_control(kind, tracers, inputs[, trips[, for_gradient]]): one if / while node over bodies traced by "
     "nested Tracers"},
    {"loop_residual_budget", py_loop_residual_budget, METH_VARARGS,
     "loop_residual_budget([bytes]): the budget of a loop gradient's stored residuals (set when given)"},
    {"live_bodies", py_live_bodies, METH_NOARGS, "control-flow bodies registered and not yet freed"},
    {"loop_body_runs", py_loop_body_runs, METH_NOARGS, "loop bodies run forward so far (counts iterations)"},
    {"loop_packed_operands", py_loop_packed_operands, METH_NOARGS,
     "loop-invariant GEMM operands that loop gradients laid out transposed once per loop"},
    {NULL, NULL, 0, NULL},
};
