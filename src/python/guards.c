/* kiln._C.GuardSet: the checks that decide whether a compiled graph may serve a call, on the
 * Python state its capture read (globals, closure cells, attributes, dict items, captured
 * constants). Built once per compiled entry from a list of
 *     (root, path, expected, mode)
 * where path is a tuple of steps ("attr", name) | ("item", key) | ("cell",) walked from root,
 * and mode says how the value found is compared with expected:
 *     IDENTITY  the same object
 *     VALUE     the same type and value (floats bit for bit: -0.0 is not 0.0; tuples elementwise)
 *     ABSENT    the last step finds nothing (a global not defined, so a builtin is used)
 *     METHOD    a bound method of the same function and the same self
 *     VERSION   expected is the storage version the tensor found had (an in-place write changes it)
 *     WEAK      the same object as the token expected: a weakref to it (dead: fails) or its id, for an
 *               object that takes no weakref (its contents read are guarded beside it)
 *     WEAK_METHOD  (0, function token, self token): a bound method of those; (1, name, self token): a
 *               builtin's bound method of that name and self
 *     CONTENTS  a list, dict or set whose contents (pykiln_guard_contents) are what expected holds: items
 *               the same objects, or equal numbers and strings (len(S) of a global set S read by the code);
 *               the lists and dicts among them (three levels deep) by their own contents; a NumPy
 *               array by its dtype, shape and bytes
 * A spec may name how its root is found, as a fifth item (a GuardSet kept with a code object holds
 * nothing that leads back to the code: see python/kiln/jit/code_cache.py):
 *     ROOT_OBJECT   root is the object (the default)
 *     ROOT_WEAK     root is a weakref, or (weakref, attribute name): its referent (or that attribute
 *                   of it); a dead referent fails the guard
 *     ROOT_GLOBALS  the globals of the function being called (root is None)
 *     ROOT_CELL     closure cell number root of the function being called
 * The function being called is check(fn)'s argument, else the set's context (GuardSet(specs, fn)).
 * Checked per call by kiln.jit's C fast path (dispatcher.c) and by the Python slow path.
 * Reference notes: the set owns references to roots, step keys, expected values and its context. */
#include <string.h>

#include "pykiln.h"

enum { STEP_ATTR, STEP_ITEM, STEP_CELL };
enum { ROOT_OBJECT, ROOT_WEAK, ROOT_GLOBALS, ROOT_CELL, ROOT_KIND_COUNT };

typedef struct {
    int kind;
    PyObject *key; /* owned; NULL for STEP_CELL */
} guard_step;

typedef struct {
    PyObject *root;      /* owned */
    PyObject *root_attr; /* owned; ROOT_WEAK with an attribute name, else NULL */
    PyObject *expected;  /* owned */
    int mode;
    int root_kind;
    int nsteps;
    guard_step *steps;
    uint64_t dict_version; /* one item step on a dict: the dict's version when the guard last held */
} guard;

typedef struct {
    PyObject_HEAD
    guard *guards;
    Py_ssize_t n;
    Py_ssize_t checks; /* how many times the set was checked (for tests of the fast path) */
    PyObject *context; /* owned or NULL: the function ROOT_GLOBALS and ROOT_CELL read when check() names none */
} PyGuardSet;

static void free_guards(PyGuardSet *g) {
    for (Py_ssize_t k = 0; k < g->n; k++) {
        Py_CLEAR(g->guards[k].root);
        Py_CLEAR(g->guards[k].root_attr);
        Py_CLEAR(g->guards[k].expected);
        for (int s = 0; s < g->guards[k].nsteps; s++) Py_CLEAR(g->guards[k].steps[s].key);
        PyMem_Free(g->guards[k].steps);
    }
    PyMem_Free(g->guards);
    g->guards = NULL;
    g->n = 0;
    Py_CLEAR(g->context);
}

static int same_value(PyObject *a, PyObject *b) {
    if (a == b) return 1;
    if (Py_TYPE(a) != Py_TYPE(b)) return 0;
    if (PyFloat_CheckExact(a)) {
        double x = PyFloat_AS_DOUBLE(a), y = PyFloat_AS_DOUBLE(b);
        return memcmp(&x, &y, sizeof x) == 0;
    }
    if (PyComplex_CheckExact(a)) {
        Py_complex x = PyComplex_AsCComplex(a), y = PyComplex_AsCComplex(b);
        return memcmp(&x, &y, sizeof x) == 0;
    }
    if (PyTuple_CheckExact(a)) {
        Py_ssize_t n = PyTuple_GET_SIZE(a);
        if (n != PyTuple_GET_SIZE(b)) return 0;
        for (Py_ssize_t k = 0; k < n; k++) {
            int r = same_value(PyTuple_GET_ITEM(a, k), PyTuple_GET_ITEM(b, k));
            if (r != 1) return r;
        }
        return 1;
    }
    if (PyLong_CheckExact(a) || PyUnicode_CheckExact(a) || PyBytes_CheckExact(a))
        return PyObject_RichCompareBool(a, b, Py_EQ);
    return 0; /* other kinds are guarded by identity */
}

static int check_value(const guard *g, PyObject *root);

/* A list or dict inside the contents a guard compares (GRID[i][j] reads the inner lists' items
 * with indices no chain names): (marker, its contents), down to CONTENTS_DEPTH levels; deeper, and
 * other objects, by identity. The markers are strings: same_value compares them by value, and
 * code_cache keeps guards whose contents are numbers and strings only. */
#define CONTENTS_DEPTH 3
static PyObject *list_marker, *dict_marker;

static PyObject *contents_at(PyObject *value, int depth);

/* A NumPy array's contents: (marker, dtype text, shape, its bytes in C order). A global table
 * (`Tensor(TABLE)` in the function) changed in place must compile again, as the graph holds its
 * values; the bytes are copied at each check, as an array argument's are for the cache key. */
static PyObject *array_marker;

static PyObject *array_contents(PyObject *value) {
    if (!array_marker && !(array_marker = PyUnicode_InternFromString("<kiln: array contents>"))) return NULL;
    PyObject *dtype = PyObject_GetAttrString(value, "dtype"), *text = dtype ? PyObject_Str(dtype) : NULL;
    PyObject *shape = text ? PyObject_GetAttrString(value, "shape") : NULL;
    PyObject *bytes = shape ? PyObject_CallMethod(value, "tobytes", NULL) : NULL;
    PyObject *out = bytes ? PyTuple_Pack(4, array_marker, text, shape, bytes) : NULL;
    Py_XDECREF(dtype);
    Py_XDECREF(text);
    Py_XDECREF(shape);
    Py_XDECREF(bytes);
    return out;
}

static PyObject *nested(PyObject *item, int depth) {
    if (depth < CONTENTS_DEPTH && !PyList_CheckExact(item) && !PyDict_CheckExact(item) && !pykiln_is_tensor(item)) {
        int array = pykiln_is_ndarray(item); /* (TABLES[k], a NumPy array in a global list) */
        if (array) return array < 0 ? NULL : array_contents(item);
    }
    if (depth >= CONTENTS_DEPTH || !(PyList_CheckExact(item) || PyDict_CheckExact(item))) return Py_NewRef(item);
    PyObject *inner = contents_at(item, depth + 1);
    PyObject *t = inner ? PyTuple_Pack(2, PyList_CheckExact(item) ? list_marker : dict_marker, inner) : NULL;
    Py_XDECREF(inner);
    return t;
}

static PyObject *contents_at(PyObject *value, int depth) {
    if (!list_marker && (!(list_marker = PyUnicode_InternFromString("<kiln: list contents>")) ||
                         !(dict_marker = PyUnicode_InternFromString("<kiln: dict contents>"))))
        return NULL;
    if (PyList_CheckExact(value)) {
        Py_ssize_t n = PyList_GET_SIZE(value);
        PyObject *t = PyTuple_New(n);
        for (Py_ssize_t k = 0; t && k < n && k < PyList_GET_SIZE(value); k++) {
            PyObject *item = nested(PyList_GET_ITEM(value, k), depth);
            if (!item) Py_CLEAR(t);
            else PyTuple_SET_ITEM(t, k, item);
        }
        return t;
    }
    if (PySet_CheckExact(value)) return PyFrozenSet_New(value);
    int array = depth == 0 ? pykiln_is_ndarray(value) : 0;
    if (array) return array < 0 ? NULL : array_contents(value);
    if (PyDict_CheckExact(value)) {
        PyObject *items = PyList_New(0), *key, *v;
        Py_ssize_t pos = 0;
        while (items && PyDict_Next(value, &pos, &key, &v)) {
            PyObject *inner = nested(v, depth), *pair = inner ? PyTuple_Pack(2, key, inner) : NULL;
            if (!pair || PyList_Append(items, pair) < 0) Py_CLEAR(items);
            Py_XDECREF(inner);
            Py_XDECREF(pair);
        }
        PyObject *t = items ? PyList_AsTuple(items) : NULL;
        Py_XDECREF(items);
        return t;
    }
    return Py_NewRef(Py_None);
}

PyObject *pykiln_guard_contents(PyObject *value) { return contents_at(value, 0); }

/* The object a token names is v: a weakref's live referent, or the object whose id the token is. */
static int token_is(PyObject *token, PyObject *v) {
    if (PyWeakref_Check(token)) {
        PyObject *o = PyWeakref_GET_OBJECT(token);
        return o != Py_None && o == v;
    }
    if (PyLong_Check(token)) return PyLong_AsVoidPtr(token) == (void *)v;
    return token == v;
}

/* The guard's root for a call of func (new reference), or NULL (no error) when it cannot be found:
 * a dead weakref, no function, a cell number past its closure. */
static PyObject *resolve_root(const guard *g, PyObject *func) {
    switch (g->root_kind) {
    case ROOT_WEAK: {
        PyObject *o = PyWeakref_GET_OBJECT(g->root);
        if (o == Py_None) return NULL;
        if (!g->root_attr) return Py_NewRef(o);
        PyObject *r = PyObject_GetAttr(o, g->root_attr);
        if (!r) PyErr_Clear();
        return r;
    }
    case ROOT_GLOBALS:
        return func && PyFunction_Check(func) ? Py_NewRef(PyFunction_GET_GLOBALS(func)) : NULL;
    case ROOT_CELL: {
        PyObject *closure = func && PyFunction_Check(func) ? PyFunction_GET_CLOSURE(func) : NULL;
        Py_ssize_t k = PyLong_AsSsize_t(g->root);
        return closure && k >= 0 && k < PyTuple_GET_SIZE(closure) ? Py_NewRef(PyTuple_GET_ITEM(closure, k)) : NULL;
    }
    default:
        return Py_NewRef(g->root);
    }
}

/* The object the guard's path reaches from root (new reference), or NULL with *absent set when a
 * step found nothing; NULL without *absent is an error (set). */
static PyObject *walk(const guard *g, PyObject *root, int *absent) {
    PyObject *cur = root;
    Py_INCREF(cur);
    *absent = 0;
    for (int s = 0; s < g->nsteps; s++) {
        const guard_step *st = &g->steps[s];
        PyObject *next = NULL;
        if (st->kind == STEP_CELL) {
            if (!PyCell_Check(cur)) {
                Py_DECREF(cur);
                PyErr_SetString(PyExc_TypeError, "guard: a cell step on a non-cell");
                return NULL;
            }
            next = PyCell_GET(cur);
            Py_XINCREF(next);
            if (!next) *absent = 1;
        } else if (st->kind == STEP_ITEM) {
            if (PyDict_Check(cur)) {
                next = PyDict_GetItemWithError(cur, st->key);
                Py_XINCREF(next);
                if (!next && !PyErr_Occurred()) *absent = 1;
            } else {
                next = PyObject_GetItem(cur, st->key);
                if (!next && (PyErr_ExceptionMatches(PyExc_KeyError) || PyErr_ExceptionMatches(PyExc_IndexError))) {
                    PyErr_Clear();
                    *absent = 1;
                }
            }
        } else {
            next = PyObject_GetAttr(cur, st->key);
            if (!next && PyErr_ExceptionMatches(PyExc_AttributeError)) {
                PyErr_Clear();
                *absent = 1;
            }
        }
        Py_DECREF(cur);
        if (!next) return NULL;
        cur = next;
    }
    return cur;
}

/* PEP 509's version tag of a dict (changed by every write to it), on the CPython versions that
 * keep it; 0 (no shortcut) elsewhere. */
static uint64_t dict_version(PyObject *d) {
#if PY_VERSION_HEX < 0x030C0000
    return PyDict_CheckExact(d) ? ((PyDictObject *)d)->ma_version_tag : 0;
#else
    (void)d;
    return 0;
#endif
}

/* 1: holds, 0: fails, -1: error (set). A guard on one item of a dict that has not been written
 * since the guard last held still holds (the item is the same object; numbers, strings and
 * tuples cannot change in place). */
static int check_one(guard *g, PyObject *func) {
    if (g->mode == GUARD_REQUIRES_GRAD && g->root_kind == ROOT_OBJECT && g->nsteps == 0 && pykiln_is_tensor(g->root))
        return pykiln_unwrap(g->root)->requires_grad == (g->expected == Py_True); /* (the common case, without a walk) */
    PyObject *root = resolve_root(g, func);
    if (!root) return 0;
    bool one_item = g->nsteps == 1 && g->steps[0].kind == STEP_ITEM && g->mode != GUARD_CONTENTS;
    uint64_t version = one_item ? dict_version(root) : 0;
    int r = version && version == g->dict_version ? 1 : check_value(g, root);
    if (r == 1) g->dict_version = version;
    Py_DECREF(root);
    return r;
}

/* GUARD_VIEW: a and b read the same elements the same way (storage, offset, layout, dtype) and
 * gradients flow to both or to neither. */
static bool same_view(const kiln_tensor *a, const kiln_tensor *b) {
    if (a->storage != b->storage || a->offset != b->offset || a->meta.dtype != b->meta.dtype ||
        a->meta.ndim != b->meta.ndim || a->requires_grad != b->requires_grad)
        return false;
    for (int d = 0; d < a->meta.ndim; d++)
        if (a->meta.shape[d] != b->meta.shape[d] || a->strides[d] != b->strides[d]) return false;
    return true;
}

static int check_value(const guard *g, PyObject *root) {
    int absent;
    PyObject *v = walk(g, root, &absent);
    if (!v) return absent ? g->mode == GUARD_ABSENT : -1;
    int r;
    switch (g->mode) {
    case GUARD_IDENTITY: r = v == g->expected; break;
    case GUARD_VALUE: r = same_value(v, g->expected); break;
    case GUARD_METHOD: /* a builtin's bound method (list.append): the same C function and self */
        r = PyCFunction_Check(v) ? PyCFunction_Check(g->expected) &&
                                       PyCFunction_GET_FUNCTION(v) == PyCFunction_GET_FUNCTION(g->expected) &&
                                       PyCFunction_GET_SELF(v) == PyCFunction_GET_SELF(g->expected)
                                 : PyMethod_Check(v) && PyMethod_Check(g->expected) &&
                                       PyMethod_GET_FUNCTION(v) == PyMethod_GET_FUNCTION(g->expected) &&
                                       PyMethod_GET_SELF(v) == PyMethod_GET_SELF(g->expected);
        break;
    case GUARD_WEAK: r = token_is(g->expected, v); break;
    case GUARD_CONTENTS: {
        PyObject *now = pykiln_guard_contents(v);
        r = !now ? -1
            : PyFrozenSet_Check(now) ? PyObject_RichCompareBool(now, g->expected, Py_EQ)
                                     : same_value(now, g->expected);
        Py_XDECREF(now);
        break;
    }
    case GUARD_WEAK_METHOD: { /* expected: (0, function token, self token) or (1, name, self token) */
        PyObject *how = PyTuple_GET_ITEM(g->expected, 0), *a = PyTuple_GET_ITEM(g->expected, 1),
                 *self = PyTuple_GET_ITEM(g->expected, 2);
        if (PyLong_AsLong(how) == 0) {
            r = PyMethod_Check(v) && token_is(a, PyMethod_GET_FUNCTION(v)) && token_is(self, PyMethod_GET_SELF(v));
        } else {
            PyObject *bound = PyCFunction_Check(v) ? PyCFunction_GET_SELF(v) : NULL;
            r = PyCFunction_Check(v) && bound && token_is(self, bound) &&
                strcmp(((PyCFunctionObject *)v)->m_ml->ml_name, PyUnicode_AsUTF8(a)) == 0;
        }
        break;
    }
    case GUARD_VERSION:
        r = pykiln_is_tensor(v) && PyLong_AsLongLong(g->expected) == kiln_tensor_version(pykiln_unwrap(v));
        break;
    case GUARD_REQUIRES_GRAD: /* a tensor read from outside: whether gradients flow to it decides the graph */
        r = pykiln_is_tensor(v) && pykiln_unwrap(v)->requires_grad == (g->expected == Py_True);
        break;
    case GUARD_VIEW: r = pykiln_is_tensor(v) && pykiln_is_tensor(g->expected) && same_view(pykiln_unwrap(v), pykiln_unwrap(g->expected)); break;
    default: r = 0; break; /* GUARD_ABSENT, and something was found */
    }
    Py_DECREF(v);
    return r;
}

/* Index of the first guard that fails, or -1 when all hold. A guard whose path raises counts as
 * failing (the error is cleared): the caller then recaptures, where the function meets it itself. */
static Py_ssize_t first_failure(PyGuardSet *g, PyObject *func) {
    g->checks++;
    if (!func) func = g->context;
    for (Py_ssize_t k = 0; k < g->n; k++) {
        int r = check_one(&g->guards[k], func);
        if (r < 0) PyErr_Clear();
        if (r != 1) return k;
    }
    return -1;
}

int pykiln_guards_hold(PyObject *guards) {
    return first_failure((PyGuardSet *)guards, NULL) < 0;
}

static int parse_step(PyObject *item, guard_step *st) {
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) < 1 || !PyUnicode_Check(PyTuple_GET_ITEM(item, 0))) {
        PyErr_Format(PyExc_TypeError, "GuardSet: a path step must be ('attr', name), ('item', key) or "
                                      "('cell',), got %R", item);
        return -1;
    }
    const char *kind = PyUnicode_AsUTF8(PyTuple_GET_ITEM(item, 0));
    Py_ssize_t n = PyTuple_GET_SIZE(item);
    if (kind && strcmp(kind, "cell") == 0 && n == 1) {
        st->kind = STEP_CELL;
        st->key = NULL;
        return 0;
    }
    if (kind && n == 2 && (strcmp(kind, "attr") == 0 || strcmp(kind, "item") == 0)) {
        st->kind = kind[0] == 'a' ? STEP_ATTR : STEP_ITEM;
        st->key = PyTuple_GET_ITEM(item, 1);
        if (st->kind == STEP_ATTR && !PyUnicode_Check(st->key)) {
            PyErr_Format(PyExc_TypeError, "GuardSet: attribute names are strings, got %R", st->key);
            return -1;
        }
        Py_INCREF(st->key);
        if (st->kind == STEP_ATTR) PyUnicode_InternInPlace(&st->key);
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "GuardSet: a path step must be ('attr', name), ('item', key) or ('cell',), got %R",
                 item);
    return -1;
}

static int parse_root(PyObject *root, int kind, guard *g) {
    PyObject *attr = NULL;
    if (kind == ROOT_WEAK && PyTuple_Check(root) && PyTuple_GET_SIZE(root) == 2 &&
        PyUnicode_Check(PyTuple_GET_ITEM(root, 1))) {
        attr = PyTuple_GET_ITEM(root, 1);
        root = PyTuple_GET_ITEM(root, 0);
    }
    if ((kind == ROOT_WEAK && !PyWeakref_Check(root)) || (kind == ROOT_CELL && !PyLong_Check(root)) ||
        (kind == ROOT_GLOBALS && root != Py_None)) {
        PyErr_Format(PyExc_TypeError, "GuardSet: root %R does not fit root kind %d", root, kind);
        return -1;
    }
    g->root = Py_NewRef(root);
    g->root_attr = Py_XNewRef(attr);
    g->root_kind = kind;
    return 0;
}

static int parse_guard(PyObject *item, guard *g) {
    PyObject *root, *path, *expected;
    int mode, root_kind = ROOT_OBJECT;
    if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "OO!Oi|i:GuardSet", &root, &PyTuple_Type, &path, &expected,
                                                  &mode, &root_kind))
        return -1;
    if (mode < 0 || mode >= GUARD_MODE_COUNT) {
        PyErr_Format(PyExc_ValueError, "GuardSet: unknown guard mode %d", mode);
        return -1;
    }
    if (root_kind < 0 || root_kind >= ROOT_KIND_COUNT) {
        PyErr_Format(PyExc_ValueError, "GuardSet: unknown root kind %d", root_kind);
        return -1;
    }
    if (mode == GUARD_WEAK_METHOD &&
        (!PyTuple_Check(expected) || PyTuple_GET_SIZE(expected) != 3 || !PyLong_Check(PyTuple_GET_ITEM(expected, 0)) ||
         (PyLong_AsLong(PyTuple_GET_ITEM(expected, 0)) == 1 && !PyUnicode_Check(PyTuple_GET_ITEM(expected, 1))))) {
        PyErr_Format(PyExc_TypeError, "GuardSet: a WEAK_METHOD guard expects (0, function, self) or (1, name, self), "
                                      "got %R", expected);
        return -1;
    }
    Py_ssize_t nsteps = PyTuple_GET_SIZE(path);
    g->steps = PyMem_Calloc((size_t)(nsteps ? nsteps : 1), sizeof(guard_step));
    if (!g->steps) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t s = 0; s < nsteps; s++) {
        if (parse_step(PyTuple_GET_ITEM(path, s), &g->steps[s]) < 0) return -1;
        g->nsteps = (int)s + 1;
    }
    if (parse_root(root, root_kind, g) < 0) return -1;
    g->expected = Py_NewRef(expected);
    g->mode = mode;
    return 0;
}

static int guardset_init(PyObject *self, PyObject *args, PyObject *kwargs) {
    PyGuardSet *g = (PyGuardSet *)self;
    PyObject *list, *context = NULL;
    if (kwargs && PyDict_Size(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "GuardSet takes no keyword arguments");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "O!|O:GuardSet", &PyList_Type, &list, &context)) return -1;
    free_guards(g);
    g->context = context == Py_None ? NULL : Py_XNewRef(context);
    Py_ssize_t n = PyList_GET_SIZE(list);
    g->guards = PyMem_Calloc((size_t)(n ? n : 1), sizeof(guard));
    if (!g->guards) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        g->n = k + 1; /* so free_guards releases what a failing parse left */
        if (parse_guard(PyList_GET_ITEM(list, k), &g->guards[k]) < 0) return -1;
    }
    g->n = n;
    return 0;
}

static void guardset_dealloc(PyObject *self) {
    PyObject_GC_UnTrack(self);
    free_guards((PyGuardSet *)self);
    Py_TYPE(self)->tp_free(self);
}

static int guardset_traverse(PyObject *self, visitproc visit, void *arg) {
    PyGuardSet *g = (PyGuardSet *)self;
    for (Py_ssize_t k = 0; k < g->n; k++) {
        Py_VISIT(g->guards[k].root);
        Py_VISIT(g->guards[k].root_attr);
        Py_VISIT(g->guards[k].expected);
    }
    Py_VISIT(g->context);
    return 0;
}

static int guardset_clear(PyObject *self) {
    free_guards((PyGuardSet *)self);
    return 0;
}

static PyObject *guardset_check(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs > 1) return PyErr_Format(PyExc_TypeError, "GuardSet.check takes at most one function");
    return PyBool_FromLong(first_failure((PyGuardSet *)self, nargs && args[0] != Py_None ? args[0] : NULL) < 0);
}

static PyObject *guardset_first_failure(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs > 1) return PyErr_Format(PyExc_TypeError, "GuardSet.first_failure takes at most one function");
    return PyLong_FromSsize_t(first_failure((PyGuardSet *)self, nargs && args[0] != Py_None ? args[0] : NULL));
}

static Py_ssize_t guardset_len(PyObject *self) { return ((PyGuardSet *)self)->n; }

static PyObject *get_checks(PyObject *self, void *c) {
    (void)c;
    return PyLong_FromSsize_t(((PyGuardSet *)self)->checks);
}

static PyMethodDef guardset_methods[] = {
    {"check", (PyCFunction)(void (*)(void))guardset_check, METH_FASTCALL,
     "check(fn=None): whether every guard holds (for a call of fn: the root of ROOT_GLOBALS and ROOT_CELL guards)"},
    {"first_failure", (PyCFunction)(void (*)(void))guardset_first_failure, METH_FASTCALL,
     "first_failure(fn=None): index of the first guard that fails, or -1"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef guardset_getset[] = {
    {"checks", get_checks, NULL, "how many times the set was checked", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods guardset_as_sequence = {.sq_length = guardset_len};

static PyTypeObject PyGuardSet_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln._C.GuardSet",
    .tp_basicsize = sizeof(PyGuardSet),
    .tp_dealloc = guardset_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Guards on the Python state a capture read: GuardSet([(root, path, expected, mode[, root_kind]), ...]"
              "[, context function]).",
    .tp_traverse = guardset_traverse,
    .tp_clear = guardset_clear,
    .tp_methods = guardset_methods,
    .tp_getset = guardset_getset,
    .tp_as_sequence = &guardset_as_sequence,
    .tp_init = guardset_init,
    .tp_new = PyType_GenericNew,
};

PyObject *pykiln_guardset_new(PyObject *specs) {
    return PyObject_CallOneArg((PyObject *)&PyGuardSet_Type, specs);
}

int pykiln_is_guardset(PyObject *o) { return PyObject_TypeCheck(o, &PyGuardSet_Type); }

int pykiln_guards_init_type(PyObject *module) {
    if (PyType_Ready(&PyGuardSet_Type) < 0) return -1;
    Py_INCREF(&PyGuardSet_Type);
    if (PyModule_AddObject(module, "GuardSet", (PyObject *)&PyGuardSet_Type) < 0) return -1;
    static const struct {
        const char *name;
        int value;
    } modes[] = {{"GUARD_IDENTITY", GUARD_IDENTITY}, {"GUARD_VALUE", GUARD_VALUE}, {"GUARD_ABSENT", GUARD_ABSENT},
                 {"GUARD_METHOD", GUARD_METHOD}, {"GUARD_VERSION", GUARD_VERSION}, {"GUARD_WEAK", GUARD_WEAK},
                 {"GUARD_CONTENTS", GUARD_CONTENTS}, {"GUARD_REQUIRES_GRAD", GUARD_REQUIRES_GRAD},
                 {"GUARD_WEAK_METHOD", GUARD_WEAK_METHOD}, {"GUARD_VIEW", GUARD_VIEW}, {"ROOT_OBJECT", ROOT_OBJECT}, {"ROOT_WEAK", ROOT_WEAK},
                 {"ROOT_GLOBALS", ROOT_GLOBALS}, {"ROOT_CELL", ROOT_CELL}};
    for (size_t k = 0; k < sizeof modes / sizeof modes[0]; k++)
        if (PyModule_AddIntConstant(module, modes[k].name, modes[k].value) < 0) return -1;
    return 0;
}
