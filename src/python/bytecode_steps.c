/* The hot part of capture_mode="bytecode"'s symbolic interpreter (python/kiln/jit/bytecode.py):
 * the instructions that only move values or compute on them, run in C.
 *
 * bytecode_table(instructions, consts, filename) -> (table, runs) for one code object: per
 * instruction (opcode, arg, index of the jump target or -1, line, offset) as Code decoded it, an
 * opcode of -1 for one the interpreter must run in Python whatever it is (inside a try,
 * BEFORE_WITH); runs holds 1 for each instruction C runs, 0 for Python's. One table
 * (by_opcode below) says which opcodes C runs and how; every other opcode goes to the Python
 * handler of bytecode.py, which introspects Python objects (attributes, globals, calls to inline,
 * containers the function did not create, graph breaks).
 *
 * bytecode_steps(table, frame, null, created, keep, set_loc, line) runs frame's instructions from
 * frame.pc while C can: it stops before the first one C does not run (Python's, a branch on a
 * tensor's value, a local not bound: the Python handler raises), and returns the source line
 * set_loc was last told (set_loc, while capturing: told "file:line" at each new line; the frame's
 * executed set gets each offset run, as Python's loop does). An exception a value raises (an
 * operator on Python values) is raised with frame.pc at its instruction, for the caller's
 * exception handling. The frame's locals and stack are Python lists, changed in place.
 * Reference notes: the table owns its constants, file name and offsets; list items are borrowed
 * from the lists and owned by them. */
#include "pykiln.h"

#include <opcode.h>

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
#define KILN_BYTECODE_STEPS 1
#endif

enum {
    K_PYTHON, /* the Python handler */
    K_NOP,
    K_LOAD_FAST,
    K_STORE_FAST,
    K_LOAD_CONST,
    K_POP_TOP,
    K_COPY,
    K_SWAP,
    K_PUSH_NULL,
    K_JUMP,
    K_BUILD_TUPLE,
    K_BUILD_LIST,
    K_BINARY_OP,
    K_COMPARE_OP,
    K_IS_OP,
    K_JUMP_IF_TRUE,  /* pops; jumps when true */
    K_JUMP_IF_FALSE, /* pops; jumps when false */
    K_JUMP_IF_NONE,
    K_JUMP_IF_NOT_NONE,
};

static unsigned char by_opcode[256];

#ifdef KILN_BYTECODE_STEPS
static const struct {
    int op, kind;
} opcode_kinds[] = {
    {NOP, K_NOP}, {RESUME, K_NOP}, {PRECALL, K_NOP}, {EXTENDED_ARG, K_NOP}, {LOAD_FAST, K_LOAD_FAST},
    {STORE_FAST, K_STORE_FAST}, {LOAD_CONST, K_LOAD_CONST}, {POP_TOP, K_POP_TOP}, {COPY, K_COPY}, {SWAP, K_SWAP},
    {PUSH_NULL, K_PUSH_NULL}, {JUMP_FORWARD, K_JUMP}, {JUMP_BACKWARD, K_JUMP}, {JUMP_BACKWARD_NO_INTERRUPT, K_JUMP},
    {BUILD_TUPLE, K_BUILD_TUPLE}, {BUILD_LIST, K_BUILD_LIST}, {BINARY_OP, K_BINARY_OP}, {COMPARE_OP, K_COMPARE_OP},
    {IS_OP, K_IS_OP}, {POP_JUMP_FORWARD_IF_TRUE, K_JUMP_IF_TRUE}, {POP_JUMP_BACKWARD_IF_TRUE, K_JUMP_IF_TRUE},
    {POP_JUMP_FORWARD_IF_FALSE, K_JUMP_IF_FALSE}, {POP_JUMP_BACKWARD_IF_FALSE, K_JUMP_IF_FALSE},
    {POP_JUMP_FORWARD_IF_NONE, K_JUMP_IF_NONE}, {POP_JUMP_BACKWARD_IF_NONE, K_JUMP_IF_NONE},
    {POP_JUMP_FORWARD_IF_NOT_NONE, K_JUMP_IF_NOT_NONE}, {POP_JUMP_BACKWARD_IF_NOT_NONE, K_JUMP_IF_NOT_NONE},
};
#endif

static void fill_by_opcode(void) {
#ifdef KILN_BYTECODE_STEPS
    static int filled;
    if (filled) return;
    filled = 1;
    for (size_t k = 0; k < sizeof opcode_kinds / sizeof opcode_kinds[0]; k++)
        by_opcode[opcode_kinds[k].op] = (unsigned char)opcode_kinds[k].kind;
#endif
}

typedef struct {
    unsigned char kind;
    int arg, target, line;
    PyObject *offset; /* owned */
} step;

typedef struct {
    Py_ssize_t n;
    PyObject *consts;   /* owned */
    PyObject *filename; /* owned */
    step steps[];
} step_table;

static const char *TABLE_NAME = "kiln.bytecode_table";

static void table_free(PyObject *capsule) {
    step_table *t = PyCapsule_GetPointer(capsule, TABLE_NAME);
    if (!t) return;
    for (Py_ssize_t k = 0; k < t->n; k++) Py_XDECREF(t->steps[k].offset);
    Py_XDECREF(t->consts);
    Py_XDECREF(t->filename);
    PyMem_Free(t);
}

static PyObject *py_bytecode_table(PyObject *module, PyObject *args) {
    PyObject *ins, *consts, *filename;
    (void)module;
    if (!PyArg_ParseTuple(args, "O!O!U:bytecode_table", &PyList_Type, &ins, &PyTuple_Type, &consts, &filename))
        return NULL;
    fill_by_opcode();
    Py_ssize_t n = PyList_GET_SIZE(ins);
    step_table *t = PyMem_Calloc(1, sizeof(step_table) + (size_t)n * sizeof(step));
    if (!t) return PyErr_NoMemory();
    t->consts = Py_NewRef(consts);
    t->filename = Py_NewRef(filename);
    PyObject *capsule = PyCapsule_New(t, TABLE_NAME, table_free);
    if (!capsule) {
        Py_DECREF(consts);
        Py_DECREF(filename);
        PyMem_Free(t);
        return NULL;
    }
    PyObject *runs = PyBytes_FromStringAndSize(NULL, n);
    if (!runs) {
        Py_DECREF(capsule);
        return NULL;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        int op, arg, target, line;
        PyObject *offset;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(ins, k), "iiiiO!:bytecode_table", &op, &arg, &target, &line, &PyLong_Type,
                              &offset)) {
            Py_DECREF(capsule);
            Py_DECREF(runs);
            return NULL;
        }
        if (target >= n) {
            Py_DECREF(capsule);
            Py_DECREF(runs);
            return PyErr_Format(PyExc_ValueError, "bytecode_table: jump target %d past the %zd instructions", target, n);
        }
        step *s = &t->steps[k];
        s->kind = op >= 0 && op < 256 ? by_opcode[op] : K_PYTHON;
        if ((s->kind == K_JUMP || s->kind >= K_JUMP_IF_TRUE) && target < 0) s->kind = K_PYTHON;
        if ((s->kind == K_COPY || s->kind == K_SWAP) && arg < 1) s->kind = K_PYTHON;
        s->arg = arg, s->target = target, s->line = line;
        s->offset = Py_NewRef(offset);
        t->n = k + 1;
        PyBytes_AS_STRING(runs)[k] = s->kind != K_PYTHON;
    }
    PyObject *result = PyTuple_Pack(2, capsule, runs);
    Py_DECREF(capsule);
    Py_DECREF(runs);
    return result;
}

static PyObject *binary(int op, PyObject *a, PyObject *b) {
    switch (op) {
    case 0: return PyNumber_Add(a, b);
    case 1: return PyNumber_And(a, b);
    case 2: return PyNumber_FloorDivide(a, b);
    case 3: return PyNumber_Lshift(a, b);
    case 4: return PyNumber_MatrixMultiply(a, b);
    case 5: return PyNumber_Multiply(a, b);
    case 6: return PyNumber_Remainder(a, b);
    case 7: return PyNumber_Or(a, b);
    case 8: return PyNumber_Power(a, b, Py_None);
    case 9: return PyNumber_Rshift(a, b);
    case 10: return PyNumber_Subtract(a, b);
    case 11: return PyNumber_TrueDivide(a, b);
    case 12: return PyNumber_Xor(a, b);
    case 13: return PyNumber_InPlaceAdd(a, b);
    case 14: return PyNumber_InPlaceAnd(a, b);
    case 15: return PyNumber_InPlaceFloorDivide(a, b);
    case 16: return PyNumber_InPlaceLshift(a, b);
    case 17: return PyNumber_InPlaceMatrixMultiply(a, b);
    case 18: return PyNumber_InPlaceMultiply(a, b);
    case 19: return PyNumber_InPlaceRemainder(a, b);
    case 20: return PyNumber_InPlaceOr(a, b);
    case 21: return PyNumber_InPlacePower(a, b, Py_None);
    case 22: return PyNumber_InPlaceRshift(a, b);
    case 23: return PyNumber_InPlaceSubtract(a, b);
    case 24: return PyNumber_InPlaceTrueDivide(a, b);
    case 25: return PyNumber_InPlaceXor(a, b);
    default: return PyErr_Format(PyExc_SystemError, "BINARY_OP: unknown operator %d", op);
    }
}

/* Pops the top n items of a list into a new tuple. */
static PyObject *pop_tuple(PyObject *stack, Py_ssize_t n) {
    Py_ssize_t len = PyList_GET_SIZE(stack);
    PyObject *t = PyList_GetSlice(stack, len - n, len);
    if (!t) return NULL;
    PyObject *tuple = PyList_AsTuple(t);
    Py_DECREF(t);
    if (tuple && PyList_SetSlice(stack, len - n, len, NULL) < 0) Py_CLEAR(tuple);
    return tuple;
}

static int push(PyObject *stack, PyObject *v) { return PyList_Append(stack, v); }

/* The top of the stack, popped (new reference). */
static PyObject *pop(PyObject *stack) {
    Py_ssize_t len = PyList_GET_SIZE(stack);
    PyObject *v = Py_NewRef(PyList_GET_ITEM(stack, len - 1));
    if (PyList_SetSlice(stack, len - 1, len, NULL) < 0) Py_CLEAR(v);
    return v;
}

/* Runs one instruction: 1 done, 0 C does not run it now, -1 error. */
static int run_step(const step_table *t, const step *s, Py_ssize_t *pc, PyObject *locals, PyObject *stack,
                    PyObject *null, PyObject *created, PyObject *keep) {
    Py_ssize_t depth = PyList_GET_SIZE(stack);
    switch (s->kind) {
    case K_NOP: break;
    case K_LOAD_FAST: {
        if (s->arg >= PyList_GET_SIZE(locals)) return 0;
        PyObject *v = PyList_GET_ITEM(locals, s->arg);
        if (v == null) return 0; /* unbound: the Python handler raises UnboundLocalError */
        if (push(stack, v) < 0) return -1;
        break;
    }
    case K_STORE_FAST: {
        if (s->arg >= PyList_GET_SIZE(locals) || depth < 1) return 0;
        PyObject *v = pop(stack);
        if (!v || PyList_SetItem(locals, s->arg, v) < 0) return -1; /* (steals v) */
        break;
    }
    case K_LOAD_CONST:
        if (s->arg >= PyTuple_GET_SIZE(t->consts)) return 0;
        if (push(stack, PyTuple_GET_ITEM(t->consts, s->arg)) < 0) return -1;
        break;
    case K_POP_TOP: {
        if (depth < 1) return 0;
        if (PyList_SetSlice(stack, depth - 1, depth, NULL) < 0) return -1;
        break;
    }
    case K_COPY:
        if (depth < s->arg) return 0;
        if (push(stack, PyList_GET_ITEM(stack, depth - s->arg)) < 0) return -1;
        break;
    case K_SWAP: {
        if (depth < s->arg) return 0;
        PyObject **items = ((PyListObject *)stack)->ob_item, *top = items[depth - 1];
        items[depth - 1] = items[depth - s->arg];
        items[depth - s->arg] = top;
        break;
    }
    case K_PUSH_NULL:
        if (push(stack, null) < 0) return -1;
        break;
    case K_JUMP: *pc = s->target; return 1;
    case K_BUILD_TUPLE: {
        if (depth < s->arg) return 0;
        PyObject *tuple = pop_tuple(stack, s->arg);
        int rc = tuple ? push(stack, tuple) : -1;
        Py_XDECREF(tuple);
        if (rc < 0) return -1;
        break;
    }
    case K_BUILD_LIST: { /* a list the function made: noted as created (free to change), kept alive */
        if (depth < s->arg) return 0;
        PyObject *list = PyList_GetSlice(stack, depth - s->arg, depth), *id = list ? PyLong_FromVoidPtr(list) : NULL;
        int rc = id && PySet_Add(created, id) == 0 && PyList_Append(keep, list) == 0 &&
                         PyList_SetSlice(stack, depth - s->arg, depth, NULL) == 0 && push(stack, list) == 0
                     ? 0
                     : -1;
        Py_XDECREF(id);
        Py_XDECREF(list);
        if (rc < 0) return -1;
        break;
    }
    case K_BINARY_OP:
    case K_COMPARE_OP:
    case K_IS_OP: {
        if (depth < 2) return 0;
        PyObject *a = PyList_GET_ITEM(stack, depth - 2), *b = PyList_GET_ITEM(stack, depth - 1), *r;
        if (s->kind == K_BINARY_OP && (PyList_Check(a) || PyDict_Check(a) || PyAnySet_Check(a) || PyList_Check(b) ||
                                       PyDict_Check(b) || PyAnySet_Check(b)))
            return 0; /* containers: Python's handler notes a new one as created, an in-place change as a mutation */
        if (s->kind == K_BINARY_OP)
            r = binary(s->arg, a, b);
        else if (s->kind == K_COMPARE_OP)
            r = s->arg >= 0 && s->arg <= Py_GE ? PyObject_RichCompare(a, b, s->arg)
                                               : PyErr_Format(PyExc_SystemError, "COMPARE_OP %d", s->arg);
        else
            r = Py_NewRef((a == b) != (s->arg != 0) ? Py_True : Py_False);
        if (!r) return -1;
        int rc = PyList_SetSlice(stack, depth - 2, depth, NULL) == 0 && push(stack, r) == 0 ? 0 : -1;
        Py_DECREF(r);
        if (rc < 0) return -1;
        break;
    }
    case K_JUMP_IF_TRUE:
    case K_JUMP_IF_FALSE:
    case K_JUMP_IF_NONE:
    case K_JUMP_IF_NOT_NONE: {
        if (depth < 1) return 0;
        PyObject *v = PyList_GET_ITEM(stack, depth - 1);
        if (pykiln_is_tensor(v)) return 0; /* a branch on a tensor's value: a graph break (Python's) */
        int jump;
        if (s->kind == K_JUMP_IF_NONE || s->kind == K_JUMP_IF_NOT_NONE) {
            jump = (v == Py_None) == (s->kind == K_JUMP_IF_NONE);
        } else {
            int truth = PyObject_IsTrue(v);
            if (truth < 0) return -1;
            jump = truth == (s->kind == K_JUMP_IF_TRUE);
        }
        if (PyList_SetSlice(stack, depth - 1, depth, NULL) < 0) return -1;
        *pc = jump ? s->target : *pc + 1;
        return 1;
    }
    default: return 0;
    }
    *pc += 1;
    return 1;
}

static PyObject *s_locals, *s_stack, *s_pc, *s_executed;

static PyObject *py_bytecode_steps(PyObject *module, PyObject *args) {
    PyObject *capsule, *frame, *null, *created, *keep, *set_loc;
    int line;
    (void)module;
    if (!PyArg_ParseTuple(args, "OOOO!O!Oi:bytecode_steps", &capsule, &frame, &null, &PySet_Type, &created,
                          &PyList_Type, &keep, &set_loc, &line))
        return NULL;
    step_table *t = PyCapsule_GetPointer(capsule, TABLE_NAME);
    if (!t) return NULL;
    PyObject *locals = PyObject_GetAttr(frame, s_locals), *stack = locals ? PyObject_GetAttr(frame, s_stack) : NULL;
    PyObject *pc_obj = stack ? PyObject_GetAttr(frame, s_pc) : NULL;
    PyObject *executed = pc_obj ? PyObject_GetAttr(frame, s_executed) : NULL, *result = NULL;
    if (!executed) goto done;
    if (!PyList_Check(locals) || !PyList_Check(stack) || (executed != Py_None && !PySet_Check(executed))) {
        PyErr_SetString(PyExc_TypeError, "bytecode_steps: a frame's locals and stack are lists, executed a set");
        goto done;
    }
    Py_ssize_t pc = PyLong_AsSsize_t(pc_obj);
    if (pc < 0 && PyErr_Occurred()) goto done;
    int rc = 1;
    while (pc >= 0 && pc < t->n && t->steps[pc].kind != K_PYTHON) {
        const step *s = &t->steps[pc];
        if (set_loc != Py_None && s->line != line) {
            PyObject *loc = PyUnicode_FromFormat("%U:%d", t->filename, s->line);
            PyObject *r = loc ? PyObject_CallOneArg(set_loc, loc) : NULL;
            Py_XDECREF(loc);
            if (!r) {
                rc = -1;
                break;
            }
            Py_DECREF(r);
            line = s->line;
        }
        if (executed != Py_None && PySet_Add(executed, s->offset) < 0) {
            rc = -1;
            break;
        }
        rc = run_step(t, s, &pc, locals, stack, null, created, keep);
        if (rc <= 0) break;
    }
    PyObject *new_pc = PyLong_FromSsize_t(pc);
    if (!new_pc || PyObject_SetAttr(frame, s_pc, new_pc) < 0) rc = -1;
    Py_XDECREF(new_pc);
    if (rc >= 0) result = PyLong_FromLong(line);
done:
    Py_XDECREF(locals);
    Py_XDECREF(stack);
    Py_XDECREF(pc_obj);
    Py_XDECREF(executed);
    return result;
}

static PyObject *py_bytecode_steps_supported(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
#ifdef KILN_BYTECODE_STEPS
    Py_RETURN_TRUE;
#else
    Py_RETURN_FALSE;
#endif
}

static PyMethodDef bytecode_steps_functions[] = {
    {"bytecode_table", py_bytecode_table, METH_VARARGS,
     "bytecode_table([(opcode, arg, target index, line, offset)], consts, filename) -> (table, which instructions "
     "C runs)"},
    {"bytecode_steps", py_bytecode_steps, METH_VARARGS,
     "bytecode_steps(table, frame, null, created, keep, set_loc, line) -> line: runs frame's instructions while C "
     "can"},
    {"bytecode_steps_supported", py_bytecode_steps_supported, METH_NOARGS,
     "whether C runs instructions on this CPython (3.11)"},
    {NULL, NULL, 0, NULL},
};

int pykiln_bytecode_steps_init(PyObject *module) {
    s_locals = PyUnicode_InternFromString("locals");
    s_stack = PyUnicode_InternFromString("stack");
    s_pc = PyUnicode_InternFromString("pc");
    s_executed = PyUnicode_InternFromString("executed");
    if (!s_locals || !s_stack || !s_pc || !s_executed) return -1;
    return PyModule_AddFunctions(module, bytecode_steps_functions);
}
