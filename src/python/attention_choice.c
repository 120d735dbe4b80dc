/* kiln._C.attention_choice: the cost model's choice between fused attention and the unfused ops
 * (src/ops/attention_cost.c), for kiln.ops.scaled_dot_product_attention, which decides by it as
 * the O1 pass fuse_attention does. */
#include "pykiln.h"

#include "ops/attention_cost.h"

/* attention_choice(heads, Lq, Lk, D, Dv, dtype, causal, masked, dropout, backward)
 *   -> (fused, fused_cost, unfused_cost, why) */
static PyObject *py_attention_choice(PyObject *self, PyObject *args) {
    (void)self;
    long long heads, lq, lk, d, dv;
    PyObject *dtype;
    int causal, masked, dropout, backward;
    if (!PyArg_ParseTuple(args, "LLLLLOpppp", &heads, &lq, &lk, &d, &dv, &dtype, &causal, &masked, &dropout, &backward))
        return NULL;
    if (heads < 0 || lq < 0 || lk < 0 || d < 0 || dv < 0) {
        PyErr_SetString(PyExc_ValueError, "attention_choice: sizes must be >= 0");
        return NULL;
    }
    kiln_attention_case c = {heads, lq, lk, d, dv, KILN_DTYPE_FLOAT32, causal, masked, dropout, backward};
    if (pykiln_parse_dtype(dtype, &c.dtype) < 0) return NULL;
    kiln_attention_choice out;
    kiln_attention_choose(&c, &out);
    return Py_BuildValue("(Odds)", out.fused ? Py_True : Py_False, out.fused_cost, out.unfused_cost, out.why);
}

PyMethodDef pykiln_attention_functions[] = {
    {"attention_choice", py_attention_choice, METH_VARARGS,
     "attention_choice(heads, Lq, Lk, D, Dv, dtype, causal, masked, dropout, backward) -> (fused, fused cost, "
     "unfused cost, why): fused attention or the unfused ops, by the cost model"},
    {NULL, NULL, 0, NULL},
};
