/* kiln._C.SymTable and kiln._C.SymExpr: the symbolic-size algebra of src/core/symdim.c for Python.
 * A SymTable is one symbol table (symbols with a lower bound and a hint); a SymExpr is a handle to
 * an expression in it (or a constant), with + - * // % and negation by the table's canonical form,
 * so two equal expressions built in any order are equal and hash alike (a constant equals and
 * hashes as its int). kiln.jit.dynamic's captures hold one table and their sizes as SymExprs;
 * Graph.symbolize copies them into the graph's table.
 *
 * An operation the table has no room for (more terms, factors or entries than its limits, a
 * coefficient past int64) raises kiln._C.SymLimitError (a ValueError): the caller may treat the
 * sizes involved as constants instead. Division and modulo by 0 raise ZeroDivisionError; by a
 * symbolic size, ValueError (the algebra divides by constants only). */
#include "pykiln.h"

#include "core/internal.h"
#include "core/symdim.h"

typedef struct {
    PyObject_HEAD
    kiln_symtab *t;
} PySymTable;

typedef struct {
    PyObject_HEAD
    PySymTable *table;
    kiln_sdim d;
} PySymExpr;

static PyTypeObject PySymTable_Type, PySymExpr_Type;
static PyObject *SymLimitError;

static PyObject *raise_status(kiln_status s) {
    if (s == KILN_ERR_LIMIT) {
        PyErr_SetString(SymLimitError, kiln_last_error());
        return NULL;
    }
    return pykiln_raise(s);
}

static PyObject *expr_new(PySymTable *table, kiln_sdim d) {
    PySymExpr *e = PyObject_New(PySymExpr, &PySymExpr_Type);
    if (!e) return NULL;
    e->table = (PySymTable *)Py_NewRef(table);
    e->d = d;
    return (PyObject *)e;
}

int pykiln_symexpr_get(PyObject *o, const kiln_symtab **t, kiln_sdim *d) {
    if (!PyObject_TypeCheck(o, &PySymExpr_Type)) return 0;
    *t = ((PySymExpr *)o)->table->t;
    *d = ((PySymExpr *)o)->d;
    return 1;
}

/* ---- SymTable --------------------------------------------------------------------------------- */

static PyObject *table_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    if (!_PyArg_NoPositional("SymTable", args) || !_PyArg_NoKeywords("SymTable", kwargs)) return NULL;
    PySymTable *self = (PySymTable *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    kiln_status s = kiln_symtab_new(&self->t);
    if (s != KILN_OK) {
        Py_DECREF(self);
        return pykiln_raise(s);
    }
    return (PyObject *)self;
}

static void table_dealloc(PyObject *self) {
    kiln_symtab_free(((PySymTable *)self)->t);
    Py_TYPE(self)->tp_free(self);
}

/* symbol(hint, lower=2) -> SymExpr: a new symbol s<k> (k = the symbols so far), sizes >= lower */
static PyObject *table_symbol(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"hint", "lower", NULL};
    long long hint, lower = 2;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "L|L:symbol", kwlist, &hint, &lower)) return NULL;
    kiln_sdim d;
    kiln_status s = kiln_sym_new(((PySymTable *)self)->t, lower, hint, &d);
    return s == KILN_OK ? expr_new((PySymTable *)self, d) : raise_status(s);
}

/* get(k) -> SymExpr: symbol s<k> */
static PyObject *table_get(PyObject *self, PyObject *arg) {
    kiln_symtab *t = ((PySymTable *)self)->t;
    long k = PyLong_AsLong(arg);
    if (k == -1 && PyErr_Occurred()) return NULL;
    if (k < 0 || k >= kiln_sym_count(t)) return PyErr_Format(PyExc_IndexError, "SymTable.get: no symbol s%ld", k);
    return expr_new((PySymTable *)self, kiln_sym_get(t, (int32_t)k));
}

/* const(v) -> SymExpr: the constant v */
static PyObject *table_const(PyObject *self, PyObject *v) {
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred()) return NULL;
    return expr_new((PySymTable *)self, kiln_sdim_const(x));
}

static PyObject *table_symbols(PyObject *self, void *unused) {
    (void)unused;
    return PyLong_FromLong(kiln_sym_count(((PySymTable *)self)->t));
}

static PyObject *table_entries(PyObject *self, void *unused) {
    (void)unused;
    return PyLong_FromLong(kiln_symtab_entries(((PySymTable *)self)->t));
}

static PyMethodDef table_methods[] = {
    {"symbol", (PyCFunction)(void (*)(void))table_symbol, METH_VARARGS | METH_KEYWORDS,
     "symbol(hint, lower=2) -> SymExpr: a new symbol, its sizes >= lower, hint its size where recorded"},
    {"const", table_const, METH_O, "const(v) -> SymExpr: the constant v"},
    {"get", table_get, METH_O, "get(k) -> SymExpr: symbol s<k>"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef table_getset[] = {
    {"symbols", table_symbols, NULL, "the number of symbols", NULL},
    {"entries", table_entries, NULL, "the expressions held so far (at most the table's limit)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PySymTable_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln._C.SymTable",
    .tp_basicsize = sizeof(PySymTable),
    .tp_dealloc = table_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "SymTable(): a table of size symbols and canonical expressions over them (see SymExpr).",
    .tp_methods = table_methods,
    .tp_getset = table_getset,
    .tp_new = table_new,
};

/* ---- SymExpr ---------------------------------------------------------------------------------- */

static void expr_dealloc(PyObject *self) {
    Py_DECREF(((PySymExpr *)self)->table);
    PyObject_Free(self);
}

/* An operand: a SymExpr or an int (not a bool); 0 when neither (NotImplemented), -1 on error. */
static int operand(PyObject *o, PySymTable **table, kiln_sdim *d) {
    if (PyObject_TypeCheck(o, &PySymExpr_Type)) {
        *table = ((PySymExpr *)o)->table;
        *d = ((PySymExpr *)o)->d;
        return 1;
    }
    if (!PyLong_Check(o) || PyBool_Check(o)) return 0;
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_SetString(SymLimitError, "symbolic sizes: a constant past int64");
        }
        return -1;
    }
    *table = NULL;
    *d = kiln_sdim_const(v);
    return 1;
}

/* Both operands and the table to build in (a symbolic one's); 0: NotImplemented, -1: error. */
static int operands(PyObject *a, PyObject *b, PySymTable **table, kiln_sdim *da, kiln_sdim *db) {
    PySymTable *ta, *tb;
    int r = operand(a, &ta, da);
    if (r <= 0) return r;
    if ((r = operand(b, &tb, db)) <= 0) return r;
    if (ta && tb && ta != tb && !kiln_sdim_is_const(*da) && !kiln_sdim_is_const(*db)) {
        PyErr_SetString(PyExc_ValueError, "SymExpr: expressions of two different symbol tables");
        return -1;
    }
    /* the symbolic side's table (an int operand has none; one side is a SymExpr) */
    *table = ta && !kiln_sdim_is_const(*da) ? ta : tb && !kiln_sdim_is_const(*db) ? tb : ta ? ta : tb;
    return 1;
}

enum { OP_ADD, OP_SUB, OP_MUL, OP_FLOORDIV, OP_MOD };

static PyObject *binary(PyObject *a, PyObject *b, int op) {
    PySymTable *table;
    kiln_sdim x, y, out;
    int r = operands(a, b, &table, &x, &y);
    if (r < 0) return NULL;
    if (r == 0) Py_RETURN_NOTIMPLEMENTED;
    kiln_symtab *t = table->t;
    kiln_status s;
    if (op == OP_FLOORDIV || op == OP_MOD) {
        if (!kiln_sdim_is_const(y))
            return PyErr_Format(PyExc_ValueError, "SymExpr: %s by a symbolic size has no symbolic form",
                                op == OP_MOD ? "modulo" : "floor division");
        if (y.v == 0)
            return PyErr_Format(PyExc_ZeroDivisionError, "SymExpr: %s by zero",
                                op == OP_MOD ? "modulo" : "integer division");
        s = op == OP_MOD ? kiln_sym_mod(t, x, y.v, &out) : kiln_sym_floordiv(t, x, y.v, &out);
    } else {
        s = op == OP_ADD ? kiln_sym_add(t, x, y, &out) : op == OP_SUB ? kiln_sym_sub(t, x, y, &out)
                                                          : kiln_sym_mul(t, x, y, &out);
    }
    return s == KILN_OK ? expr_new(table, out) : raise_status(s);
}

static PyObject *expr_add(PyObject *a, PyObject *b) { return binary(a, b, OP_ADD); }
static PyObject *expr_sub(PyObject *a, PyObject *b) { return binary(a, b, OP_SUB); }
static PyObject *expr_mul(PyObject *a, PyObject *b) { return binary(a, b, OP_MUL); }
static PyObject *expr_floordiv(PyObject *a, PyObject *b) { return binary(a, b, OP_FLOORDIV); }
static PyObject *expr_mod(PyObject *a, PyObject *b) { return binary(a, b, OP_MOD); }

static PyObject *expr_neg(PyObject *self) {
    PySymExpr *e = (PySymExpr *)self;
    kiln_sdim out;
    kiln_status s = kiln_sym_mul(e->table->t, e->d, kiln_sdim_const(-1), &out);
    return s == KILN_OK ? expr_new(e->table, out) : raise_status(s);
}

static PyObject *expr_pos(PyObject *self) { return Py_NewRef(self); }

static PyNumberMethods expr_number = {
    .nb_add = expr_add,
    .nb_subtract = expr_sub,
    .nb_multiply = expr_mul,
    .nb_floor_divide = expr_floordiv,
    .nb_remainder = expr_mod,
    .nb_negative = expr_neg,
    .nb_positive = expr_pos,
};

static PyObject *expr_richcompare(PyObject *a, PyObject *b, int op) {
    if (op != Py_EQ && op != Py_NE) Py_RETURN_NOTIMPLEMENTED;
    PySymTable *ta, *tb;
    kiln_sdim x, y;
    int r = operand(a, &ta, &x);
    if (r > 0) r = operand(b, &tb, &y);
    if (r < 0) {
        PyErr_Clear(); /* an int past int64 equals no size */
        return PyBool_FromLong(op == Py_NE);
    }
    if (r == 0) Py_RETURN_NOTIMPLEMENTED;
    bool same = kiln_sdim_same(x, y) && (kiln_sdim_is_const(x) || ta == tb);
    return PyBool_FromLong(same == (op == Py_EQ));
}

static Py_hash_t expr_hash(PyObject *self) {
    PySymExpr *e = (PySymExpr *)self;
    if (kiln_sdim_is_const(e->d)) { /* as the int */
        PyObject *v = PyLong_FromLongLong(e->d.v);
        if (!v) return -1;
        Py_hash_t h = PyObject_Hash(v);
        Py_DECREF(v);
        return h;
    }
    Py_uhash_t h = (Py_uhash_t)(uintptr_t)e->table * 1000003u ^ (Py_uhash_t)e->d.e * 0x9e3779b9u;
    return h == (Py_uhash_t)-1 ? -2 : (Py_hash_t)h;
}

/* The expression's text, symbol k named names[k] where names is given (a sequence of str). */
static PyObject *text_of(PySymExpr *e, PyObject *names) {
    const char **labels = NULL;
    PyObject *seq = NULL, *result = NULL;
    if (names && names != Py_None) {
        if (!(seq = PySequence_Fast(names, "SymExpr.text: names must be a sequence of str"))) return NULL;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), count = kiln_sym_count(e->table->t);
        labels = PyMem_Calloc((size_t)(count ? count : 1), sizeof *labels);
        if (!labels) {
            Py_DECREF(seq);
            return PyErr_NoMemory();
        }
        for (Py_ssize_t k = 0; k < n && k < count; k++) {
            PyObject *name = PySequence_Fast_GET_ITEM(seq, k);
            if (name == Py_None) continue;
            if (!PyUnicode_Check(name)) {
                PyErr_Format(PyExc_TypeError, "SymExpr.text: name %zd is not a str", k);
                goto done;
            }
            if (!(labels[k] = PyUnicode_AsUTF8(name))) goto done;
        }
    }
    kiln_strbuf b = {0};
    kiln_sym_print_named(&b, e->table->t, e->d, labels);
    result = b.failed || !b.buf ? PyErr_NoMemory() : PyUnicode_FromStringAndSize(b.buf, (Py_ssize_t)b.len);
    free(b.buf);
done:
    PyMem_Free(labels);
    Py_XDECREF(seq);
    return result;
}

static PyObject *expr_str(PyObject *self) { return text_of((PySymExpr *)self, NULL); }

static PyObject *expr_repr(PyObject *self) {
    PyObject *text = expr_str(self);
    if (!text) return NULL;
    PyObject *r = PyUnicode_FromFormat("SymExpr(%R)", text);
    Py_DECREF(text);
    return r;
}

static PyObject *expr_text(PyObject *self, PyObject *args) {
    PyObject *names = NULL;
    if (!PyArg_ParseTuple(args, "|O:text", &names)) return NULL;
    return text_of((PySymExpr *)self, names);
}

/* eval(values) -> int: the value with symbol k = values[k] (a sequence of ints, one per symbol) */
static PyObject *expr_eval(PyObject *self, PyObject *values) {
    PySymExpr *e = (PySymExpr *)self;
    if (kiln_sdim_is_const(e->d)) return PyLong_FromLongLong(e->d.v);
    PyObject *seq = PySequence_Fast(values, "SymExpr.eval: values must be a sequence of ints");
    if (!seq) return NULL;
    int32_t count = kiln_sym_count(e->table->t);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int64_t small[16], *b = count <= 16 ? small : PyMem_Malloc(sizeof *b * (size_t)count);
    PyObject *result = NULL;
    if (!b) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    if (n < count) {
        PyErr_Format(PyExc_ValueError, "SymExpr.eval: %d sizes expected (one per symbol), got %zd", count, n);
        goto done;
    }
    for (int32_t k = 0; k < count; k++) {
        b[k] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, k));
        if (b[k] == -1 && PyErr_Occurred()) goto done;
    }
    int64_t out;
    kiln_status s = kiln_sym_eval(e->table->t, e->d, b, &out);
    result = s == KILN_OK ? PyLong_FromLongLong(out) : pykiln_raise(s);
done:
    if (b != small) PyMem_Free(b);
    Py_DECREF(seq);
    return result;
}

/* symbols() -> tuple of the symbol indices the value depends on, ascending */
static PyObject *expr_symbols(PyObject *self, PyObject *unused) {
    (void)unused;
    PySymExpr *e = (PySymExpr *)self;
    PyObject *out = PyList_New(0);
    int32_t count = kiln_sym_count(e->table->t);
    for (int32_t k = 0; out && k < count && !kiln_sdim_is_const(e->d); k++) {
        if (!kiln_sym_uses(e->table->t, e->d, k)) continue;
        PyObject *v = PyLong_FromLong(k);
        if (!v || PyList_Append(out, v) < 0) Py_CLEAR(out);
        Py_XDECREF(v);
    }
    if (!out) return NULL;
    PyObject *t = PyList_AsTuple(out);
    Py_DECREF(out);
    return t;
}

/* substitute(mapping) -> SymExpr: symbol k replaced by the int mapping[k] where mapping has k */
static PyObject *expr_substitute(PyObject *self, PyObject *mapping) {
    PySymExpr *e = (PySymExpr *)self;
    if (!PyDict_Check(mapping)) return PyErr_Format(PyExc_TypeError, "SymExpr.substitute: expected a dict");
    if (kiln_sdim_is_const(e->d)) return Py_NewRef(self);
    kiln_symtab *t = e->table->t;
    int32_t count = kiln_sym_count(t);
    kiln_sdim *map = PyMem_Malloc(sizeof *map * (size_t)(count ? count : 1));
    if (!map) return PyErr_NoMemory();
    PyObject *result = NULL;
    for (int32_t k = 0; k < count; k++) map[k] = kiln_sym_get(t, k);
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(mapping, &pos, &key, &value)) {
        long k = PyLong_AsLong(key);
        if (k == -1 && PyErr_Occurred()) goto done;
        long long v = PyLong_AsLongLong(value);
        if (v == -1 && PyErr_Occurred()) goto done;
        if (k < 0 || k >= count) {
            PyErr_Format(PyExc_ValueError, "SymExpr.substitute: no symbol s%ld", k);
            goto done;
        }
        map[k] = kiln_sdim_const(v);
    }
    kiln_sdim out;
    kiln_status s = kiln_sym_subst(t, t, e->d, map, &out);
    result = s == KILN_OK ? expr_new(e->table, out) : raise_status(s);
done:
    PyMem_Free(map);
    return result;
}

static PyObject *expr_is_const(PyObject *self, void *unused) {
    (void)unused;
    return PyBool_FromLong(kiln_sdim_is_const(((PySymExpr *)self)->d));
}

static PyObject *expr_value(PyObject *self, void *unused) {
    (void)unused;
    PySymExpr *e = (PySymExpr *)self;
    if (!kiln_sdim_is_const(e->d)) return PyErr_Format(PyExc_ValueError, "SymExpr.value: not a constant");
    return PyLong_FromLongLong(e->d.v);
}

static PyObject *expr_hint(PyObject *self, void *unused) {
    (void)unused;
    return PyLong_FromLongLong(((PySymExpr *)self)->d.v);
}

static PyObject *expr_symbol_index(PyObject *self, void *unused) {
    (void)unused;
    PySymExpr *e = (PySymExpr *)self;
    int32_t k = kiln_sym_symbol_of(e->table->t, e->d);
    return k < 0 ? Py_NewRef(Py_None) : PyLong_FromLong(k);
}

static PyObject *expr_table(PyObject *self, void *unused) {
    (void)unused;
    return Py_NewRef((PyObject *)((PySymExpr *)self)->table);
}

static PyMethodDef expr_methods[] = {
    {"eval", expr_eval, METH_O, "eval(values) -> int: the value with symbol k = values[k]"},
    {"symbols", expr_symbols, METH_NOARGS, "symbols() -> tuple of the symbols the value depends on"},
    {"text", expr_text, METH_VARARGS, "text(names=None) -> str: the expression, symbol k written names[k]"},
    {"substitute", expr_substitute, METH_O, "substitute({k: int}) -> SymExpr: those symbols as constants"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef expr_getset[] = {
    {"is_const", expr_is_const, NULL, "whether the expression is a constant", NULL},
    {"value", expr_value, NULL, "the constant (ValueError when symbolic)", NULL},
    {"hint", expr_hint, NULL, "the value at the symbols' hints", NULL},
    {"symbol_index", expr_symbol_index, NULL, "k when the expression is the lone symbol s<k>, else None", NULL},
    {"table", expr_table, NULL, "the SymTable it lives in", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PySymExpr_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln._C.SymExpr",
    .tp_basicsize = sizeof(PySymExpr),
    .tp_dealloc = expr_dealloc,
    .tp_repr = expr_repr,
    .tp_str = expr_str,
    .tp_as_number = &expr_number,
    .tp_hash = expr_hash,
    .tp_richcompare = expr_richcompare,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A size expression in a SymTable (made by SymTable.symbol / SymTable.const and arithmetic):\n"
              "+ - * // % with ints and SymExprs of its table, eval(values), symbols(), text(names).",
    .tp_methods = expr_methods,
    .tp_getset = expr_getset,
};

int pykiln_sym_expr_init(PyObject *module) {
    if (PyType_Ready(&PySymTable_Type) < 0 || PyType_Ready(&PySymExpr_Type) < 0) return -1;
    SymLimitError = PyErr_NewExceptionWithDoc(
        "kiln._C.SymLimitError",
        "A symbolic size outgrew the algebra's limits (terms, factors, table entries, int64): treat its sizes "
        "as constants.",
        PyExc_ValueError, NULL);
    if (!SymLimitError) return -1;
    Py_INCREF(&PySymTable_Type);
    if (PyModule_AddObject(module, "SymTable", (PyObject *)&PySymTable_Type) < 0) return -1;
    Py_INCREF(&PySymExpr_Type);
    if (PyModule_AddObject(module, "SymExpr", (PyObject *)&PySymExpr_Type) < 0) return -1;
    return PyModule_AddObjectRef(module, "SymLimitError", SymLimitError);
}
