/* Flattening nested arguments and results for kiln.jit and kiln.trace (kiln.jit.tree): tensors
 * become a flat list, everything else a hashable structure (the spec, part of the cache key)
 * from which the object is rebuilt:
 *     "T"                                a tensor (the next leaf); "Tv" in call_key's spec: one
 *                                        that is not contiguous
 *     ("tuple", (spec, ...))             a tuple / ("list", ...) a list
 *     ("dict", (key, ...), (spec, ...))  a dict, keys in order
 *                                        (a subclass — namedtuple, OrderedDict — has its type appended)
 *     ("node", type, aux, (spec, ...))   a registered node type or a dataclass instance: its
 *                                        flatten gave (children, aux); unflatten(aux, children)
 *     ("const", type, const_key, payload)  any other hashable value (and a set, a dict's keys view, a
 *                                        NumPy array, keyed by their contents); payload carries the value
 *                                        without taking part in equality (ConstPayload)
 * Also the texts kiln.trace needs: a spec's short description, the labels of its tensor leaves
 * and the first difference between two specs.
 * Reference notes: specs own their parts; leaves are borrowed and returned with new references. */
#include "pykiln.h"

#include <structmember.h>

static PyObject *s_T, *s_tuple, *s_list, *s_dict, *s_const, *s_node, *numbers_number;
/* Registered pytree node types (kiln.jit.tree.register_pytree_node): type -> (flatten, unflatten);
 * node_default(type) gives the pair for an unregistered dataclass (None: a constant). */
static PyObject *node_registry, *node_default;
/* Set while call_key flattens: a tensor that is not contiguous is "Tv", so a layout fact read in
 * Python (x.is_contiguous()) is part of the cache key. */
static PyObject *s_Tv;
static int mark_layout;

/* ---- ConstPayload: the constant itself, equal to every other payload ------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *value;
    int fresh; /* a result's set the call made: unflatten gives a copy (fresh_results) */
} PyConstPayload;

static PyTypeObject PyConstPayload_Type;

static PyObject *make_payload(PyObject *value) {
    PyConstPayload *p = PyObject_GC_New(PyConstPayload, &PyConstPayload_Type);
    if (!p) return NULL;
    p->value = Py_NewRef(value);
    p->fresh = 0;
    PyObject_GC_Track(p);
    return (PyObject *)p;
}

static void payload_dealloc(PyObject *self) {
    PyObject_GC_UnTrack(self);
    Py_CLEAR(((PyConstPayload *)self)->value);
    PyObject_GC_Del(self);
}

static int payload_traverse(PyObject *self, visitproc visit, void *arg) {
    Py_VISIT(((PyConstPayload *)self)->value);
    return 0;
}

static int payload_clear(PyObject *self) {
    Py_CLEAR(((PyConstPayload *)self)->value);
    return 0;
}

/* Two keys are equal when their const_key()s are (float('nan') is not equal to itself). */
static PyObject *payload_richcompare(PyObject *a, PyObject *b, int op) {
    int same = PyObject_TypeCheck(b, &PyConstPayload_Type);
    if (op == Py_EQ) return PyBool_FromLong(same);
    if (op == Py_NE) return PyBool_FromLong(!same);
    (void)a;
    Py_RETURN_NOTIMPLEMENTED;
}

static Py_hash_t payload_hash(PyObject *self) {
    (void)self;
    return 0;
}

static PyMemberDef payload_members[] = {
    {"value", T_OBJECT_EX, offsetof(PyConstPayload, value), READONLY, "the constant"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject PyConstPayload_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln._C.ConstPayload",
    .tp_basicsize = sizeof(PyConstPayload),
    .tp_dealloc = payload_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A constant carried in a spec without taking part in its equality.",
    .tp_traverse = payload_traverse,
    .tp_clear = payload_clear,
    .tp_richcompare = payload_richcompare,
    .tp_hash = payload_hash,
    .tp_members = payload_members,
};

/* ---- const_key ---------------------------------------------------------------------------- */

/* getattr(obj, name, None) (new reference; None when absent), NULL on another error. */
static PyObject *attr_or_none(PyObject *obj, const char *name) {
    PyObject *v = PyObject_GetAttrString(obj, name);
    if (v || !PyErr_ExceptionMatches(PyExc_AttributeError)) return v;
    PyErr_Clear();
    return Py_NewRef(Py_None);
}

/* A NumPy scalar's (dtype name, bytes), or None when obj is not one (new reference). */
static PyObject *numpy_scalar_key(PyObject *obj) {
    PyObject *tobytes = attr_or_none(obj, "tobytes"), *shape = NULL, *key = NULL;
    if (!tobytes || tobytes == Py_None) return tobytes;
    shape = attr_or_none(obj, "shape");
    int scalar = shape && PyTuple_Check(shape) && PyTuple_GET_SIZE(shape) == 0;
    if (scalar && PyObject_HasAttrString(obj, "dtype")) {
        PyObject *dtype = PyObject_GetAttrString(obj, "dtype");
        PyObject *name = dtype ? PyObject_Str(dtype) : NULL, *bytes = name ? PyObject_CallNoArgs(tobytes) : NULL;
        key = bytes ? PyTuple_Pack(2, name, bytes) : NULL;
        Py_XDECREF(dtype);
        Py_XDECREF(name);
        Py_XDECREF(bytes);
    } else if (shape) {
        key = Py_NewRef(Py_None);
    }
    Py_DECREF(tobytes);
    Py_XDECREF(shape);
    return key;
}

/* What distinguishes a constant argument for the compile cache: the type is part of the key
 * beside it (1, 1.0 and True differ); floats and complex numbers by their bits (0.0 and -0.0
 * differ, a NaN equals itself), NumPy scalars by dtype and bytes, other numbers by value and
 * repr (Decimal('-0') and Decimal('0')); anything else by its own equality. */
static PyObject *const_key(PyObject *obj) {
    char bits[16];
    if (PyFloat_CheckExact(obj)) {
        if (PyFloat_Pack8(PyFloat_AS_DOUBLE(obj), bits, 1) < 0) return NULL;
        return PyBytes_FromStringAndSize(bits, 8);
    }
    if (PyComplex_CheckExact(obj)) {
        Py_complex c = PyComplex_AsCComplex(obj);
        if (PyFloat_Pack8(c.real, bits, 1) < 0 || PyFloat_Pack8(c.imag, bits + 8, 1) < 0) return NULL;
        return PyBytes_FromStringAndSize(bits, 16);
    }
    if (PyLong_CheckExact(obj) || PyBool_Check(obj) || PyUnicode_CheckExact(obj) || PyBytes_CheckExact(obj) ||
        obj == Py_None)
        return Py_NewRef(obj);
    PyObject *key = numpy_scalar_key(obj);
    if (key != Py_None) return key;
    Py_DECREF(key);
    if (!numbers_number) {
        PyObject *numbers = PyImport_ImportModule("numbers");
        numbers_number = numbers ? PyObject_GetAttrString(numbers, "Number") : NULL;
        Py_XDECREF(numbers);
        if (!numbers_number) return NULL;
    }
    int number = PyObject_IsInstance(obj, numbers_number);
    if (number < 0) return NULL;
    if (!number) return Py_NewRef(obj);
    PyObject *repr = PyObject_Repr(obj);
    key = repr ? PyTuple_Pack(2, obj, repr) : NULL;
    Py_XDECREF(repr);
    return key;
}

/* ---- flatten / unflatten ------------------------------------------------------------------ */

static PyObject *flatten(PyObject *obj, PyObject *leaves);

static PyObject *flatten_items(PyObject *seq, PyObject *leaves) {
    PyObject *fast = PySequence_Fast(seq, "flatten");
    if (!fast) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject *specs = PyTuple_New(n);
    for (Py_ssize_t k = 0; specs && k < n; k++) {
        PyObject *s = flatten(PySequence_Fast_GET_ITEM(fast, k), leaves);
        if (!s) Py_CLEAR(specs);
        else PyTuple_SET_ITEM(specs, k, s);
    }
    Py_DECREF(fast);
    return specs;
}

/* The key of an unhashable constant kiln.jit accepts: a set by its frozenset, a dict's keys view by
 * the keys in order, a NumPy array by (dtype, shape, bytes); NULL with TypeError for anything else. */
static PyObject *unhashable_key(PyObject *obj) {
    if (PyAnySet_Check(obj)) return PyFrozenSet_New(obj);
    if (PyDictKeys_Check(obj)) return PySequence_Tuple(obj);
    PyObject *tobytes = attr_or_none(obj, "tobytes"), *key = NULL;
    if (tobytes && tobytes != Py_None && PyObject_HasAttrString(obj, "dtype") && PyObject_HasAttrString(obj, "shape")) {
        PyObject *dtype = PyObject_GetAttrString(obj, "dtype"), *shape = dtype ? PyObject_GetAttrString(obj, "shape") : NULL;
        PyObject *name = shape ? PyObject_Str(dtype) : NULL, *bytes = name ? PyObject_CallNoArgs(tobytes) : NULL;
        key = bytes ? PyTuple_Pack(3, name, shape, bytes) : NULL;
        Py_XDECREF(dtype);
        Py_XDECREF(shape);
        Py_XDECREF(name);
        Py_XDECREF(bytes);
        Py_DECREF(tobytes);
        return key;
    }
    Py_XDECREF(tobytes);
    if (PyErr_Occurred()) return NULL;
    return PyErr_Format(PyExc_TypeError, "jit: argument of type %s is neither a Tensor, a container of them, "
                                         "nor a hashable constant", _PyType_Name(Py_TYPE(obj)));
}

/* A container spec, with the container's type appended when it is a subclass (a namedtuple, an
 * OrderedDict): unflatten rebuilds that type. */
static PyObject *typed_spec(PyObject *spec, PyObject *obj, PyTypeObject *exact) {
    if (!spec || Py_TYPE(obj) == exact) return spec;
    PyObject *type = PyTuple_Pack(1, (PyObject *)Py_TYPE(obj)), *out = type ? PySequence_Concat(spec, type) : NULL;
    Py_XDECREF(type);
    Py_DECREF(spec);
    return out;
}

/* The (flatten, unflatten) pair of obj's type when it is a pytree node (borrowed), else NULL;
 * -1 in *err on an error. */
static PyObject *node_of(PyObject *obj, int *err) {
    PyObject *type = (PyObject *)Py_TYPE(obj), *pair = node_registry ? PyDict_GetItemWithError(node_registry, type) : NULL;
    if (pair) return pair == Py_None ? NULL : pair;
    if (PyErr_Occurred() || !node_default || !PyObject_HasAttrString(type, "__dataclass_fields__")) {
        *err = PyErr_Occurred() ? -1 : 0;
        return NULL;
    }
    PyObject *made = PyObject_CallOneArg(node_default, type);
    if (!made || PyDict_SetItem(node_registry, type, made) < 0) {
        Py_XDECREF(made);
        *err = -1;
        return NULL;
    }
    Py_DECREF(made);
    return made == Py_None ? NULL : made; /* (the registry holds it) */
}

/* ("node", type, aux, specs) of obj through its type's flatten (new reference). */
static PyObject *flatten_node(PyObject *obj, PyObject *pair, PyObject *leaves) {
    PyObject *res = PyObject_CallOneArg(PyTuple_GET_ITEM(pair, 0), obj);
    if (!res) return NULL;
    if (!PyTuple_Check(res) || PyTuple_GET_SIZE(res) != 2) {
        Py_DECREF(res);
        return PyErr_Format(PyExc_TypeError, "jit: the pytree flatten of %s must return (children, aux)",
                            _PyType_Name(Py_TYPE(obj)));
    }
    PyObject *aux = PyTuple_GET_ITEM(res, 1), *spec = NULL;
    if (PyObject_Hash(aux) == -1) {
        Py_DECREF(res);
        return NULL;
    }
    PyObject *specs = flatten_items(PyTuple_GET_ITEM(res, 0), leaves);
    if (specs) spec = Py_BuildValue("(OOON)", s_node, (PyObject *)Py_TYPE(obj), aux, specs);
    Py_DECREF(res);
    return spec;
}

static PyObject *flatten(PyObject *obj, PyObject *leaves) {
    if (pykiln_is_tensor(obj))
        return PyList_Append(leaves, obj) < 0 ? NULL
               : Py_NewRef(mark_layout && !kiln_tensor_is_contiguous(pykiln_unwrap(obj)) ? s_Tv : s_T);
    int err = 0;
    PyObject *pair = node_of(obj, &err);
    if (err) return NULL;
    if (pair) return flatten_node(obj, pair, leaves);
    if (PyTuple_Check(obj) || PyList_Check(obj)) {
        PyObject *items = flatten_items(obj, leaves);
        PyObject *spec = items ? Py_BuildValue("(ON)", PyTuple_Check(obj) ? s_tuple : s_list, items) : NULL;
        return typed_spec(spec, obj, PyTuple_Check(obj) ? &PyTuple_Type : &PyList_Type);
    }
    if (PyDict_Check(obj)) {
        PyObject *keys = PyDict_Keys(obj), *values = keys ? PyDict_Values(obj) : NULL;
        PyObject *specs = values ? flatten_items(values, leaves) : NULL;
        PyObject *spec = specs ? Py_BuildValue("(ONN)", s_dict, PyList_AsTuple(keys), specs) : NULL;
        Py_XDECREF(keys);
        Py_XDECREF(values);
        return typed_spec(spec, obj, &PyDict_Type);
    }
    PyObject *key;
    if (PyObject_Hash(obj) == -1) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError)) return NULL;
        PyErr_Clear();
        key = unhashable_key(obj);
    } else {
        key = const_key(obj);
    }
    PyObject *payload = key ? make_payload(obj) : NULL;
    PyObject *spec = payload ? PyTuple_Pack(4, s_const, (PyObject *)Py_TYPE(obj), key, payload) : NULL;
    Py_XDECREF(key);
    Py_XDECREF(payload);
    return spec;
}

static int is_tensor_spec(PyObject *spec) { return PyUnicode_Check(spec); }

static int spec_kind(PyObject *spec, PyObject *kind) {
    return PyTuple_Check(spec) && PyTuple_GET_SIZE(spec) >= 2 && PyUnicode_Compare(PyTuple_GET_ITEM(spec, 0), kind) == 0;
}

static PyObject *bad_spec(PyObject *spec) { return PyErr_Format(PyExc_ValueError, "jit: malformed spec %R", spec); }

/* items (a plain tuple, list or dict) as an object of the subclass `type`: a namedtuple by its _make,
 * else type(items); one whose constructor takes no such argument (a defaultdict) made empty and
 * filled (new reference). */
static PyObject *rebuild_as(PyObject *type, PyObject *items, int tuple) {
    PyObject *make = tuple ? attr_or_none(type, "_make") : Py_NewRef(Py_None);
    if (!make) return NULL;
    PyObject *out = make != Py_None ? PyObject_CallOneArg(make, items) : PyObject_CallOneArg(type, items);
    Py_DECREF(make);
    if (out || tuple || !PyErr_ExceptionMatches(PyExc_TypeError)) return out;
    PyErr_Clear();
    out = PyObject_CallNoArgs(type);
    PyObject *rc = out ? PyObject_CallMethod(out, "update", "O", items) : NULL;
    if (!rc) Py_CLEAR(out);
    Py_XDECREF(rc);
    return out;
}

/* The object spec describes, from leaves[*pos:] (new reference); advances *pos. */
static PyObject *unflatten(PyObject *spec, PyObject *leaves, Py_ssize_t *pos) {
    if (is_tensor_spec(spec)) {
        if (*pos >= PySequence_Fast_GET_SIZE(leaves))
            return PyErr_Format(PyExc_IndexError, "jit: the spec wants more than %zd tensors", *pos);
        return Py_NewRef(PySequence_Fast_GET_ITEM(leaves, (*pos)++));
    }
    if (spec_kind(spec, s_const) && PyTuple_GET_SIZE(spec) == 4 &&
        PyObject_TypeCheck(PyTuple_GET_ITEM(spec, 3), &PyConstPayload_Type)) {
        PyConstPayload *p = (PyConstPayload *)PyTuple_GET_ITEM(spec, 3);
        return p->fresh ? PySet_New(p->value) : Py_NewRef(p->value);
    }
    if (spec_kind(spec, s_node) && PyTuple_GET_SIZE(spec) == 4 && PyTuple_Check(PyTuple_GET_ITEM(spec, 3))) {
        PyObject *pair = node_registry ? PyDict_GetItemWithError(node_registry, PyTuple_GET_ITEM(spec, 1)) : NULL;
        if (!pair || pair == Py_None)
            return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_TypeError, "jit: %R is no registered pytree node",
                                                          PyTuple_GET_ITEM(spec, 1));
        PyObject *children = PyTuple_New(PyTuple_GET_SIZE(PyTuple_GET_ITEM(spec, 3)));
        for (Py_ssize_t k = 0; children && k < PyTuple_GET_SIZE(children); k++) {
            PyObject *item = unflatten(PyTuple_GET_ITEM(PyTuple_GET_ITEM(spec, 3), k), leaves, pos);
            if (!item) Py_CLEAR(children);
            else PyTuple_SET_ITEM(children, k, item);
        }
        PyObject *out = children ? PyObject_CallFunctionObjArgs(PyTuple_GET_ITEM(pair, 1), PyTuple_GET_ITEM(spec, 2),
                                                                children, NULL)
                                 : NULL;
        Py_XDECREF(children);
        return out;
    }
    int dict = spec_kind(spec, s_dict) && PyTuple_GET_SIZE(spec) >= 3;
    PyObject *items = PyTuple_Check(spec) && PyTuple_GET_SIZE(spec) >= 2 ? PyTuple_GET_ITEM(spec, dict ? 2 : 1) : NULL;
    PyObject *type = PyTuple_Check(spec) && PyTuple_GET_SIZE(spec) == (dict ? 4 : 3) ? PyTuple_GET_ITEM(spec, dict ? 3 : 2)
                                                                                    : NULL;
    if (!items || !PyTuple_Check(items) || (!dict && !spec_kind(spec, s_tuple) && !spec_kind(spec, s_list)) ||
        (dict && (!PyTuple_Check(PyTuple_GET_ITEM(spec, 1)) ||
                  PyTuple_GET_SIZE(PyTuple_GET_ITEM(spec, 1)) != PyTuple_GET_SIZE(items))))
        return bad_spec(spec);
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    PyObject *out = dict ? PyDict_New() : PyList_New(n);
    for (Py_ssize_t k = 0; out && k < n; k++) {
        PyObject *item = unflatten(PyTuple_GET_ITEM(items, k), leaves, pos);
        if (!item) {
            Py_CLEAR(out);
        } else if (!dict) {
            PyList_SET_ITEM(out, k, item);
        } else {
            if (PyDict_SetItem(out, PyTuple_GET_ITEM(PyTuple_GET_ITEM(spec, 1), k), item) < 0) Py_CLEAR(out);
            Py_DECREF(item);
        }
    }
    if (out && spec_kind(spec, s_tuple)) Py_SETREF(out, PyList_AsTuple(out));
    if (out && type && PyType_Check(type)) Py_SETREF(out, rebuild_as(type, out, spec_kind(spec, s_tuple)));
    return out;
}

/* ---- texts -------------------------------------------------------------------------------- */

/* Short text of a spec, for messages: Tensor, a constant's repr, (a, b), [a, b], {'k': a}. */
static PyObject *describe(PyObject *spec) {
    if (is_tensor_spec(spec)) return PyUnicode_FromString("Tensor");
    if (spec_kind(spec, s_const) && PyTuple_GET_SIZE(spec) == 4)
        return PyObject_Repr(((PyConstPayload *)PyTuple_GET_ITEM(spec, 3))->value);
    if (spec_kind(spec, s_node) && PyTuple_GET_SIZE(spec) == 4)
        return PyUnicode_FromFormat("%s(...)", _PyType_Name((PyTypeObject *)PyTuple_GET_ITEM(spec, 1)));
    int dict = spec_kind(spec, s_dict);
    if (!dict && !spec_kind(spec, s_tuple) && !spec_kind(spec, s_list)) return bad_spec(spec);
    PyObject *items = PyTuple_GET_ITEM(spec, dict ? 2 : 1), *parts = PyList_New(0);
    for (Py_ssize_t k = 0; parts && k < PyTuple_GET_SIZE(items); k++) {
        PyObject *d = describe(PyTuple_GET_ITEM(items, k));
        PyObject *part = d && dict ? PyUnicode_FromFormat("%R: %U", PyTuple_GET_ITEM(PyTuple_GET_ITEM(spec, 1), k), d)
                                   : Py_XNewRef(d);
        if (!part || PyList_Append(parts, part) < 0) Py_CLEAR(parts);
        Py_XDECREF(d);
        Py_XDECREF(part);
    }
    PyObject *sep = PyUnicode_FromString(", "), *inner = parts && sep ? PyUnicode_Join(sep, parts) : NULL;
    PyObject *text = !inner ? NULL
                     : dict ? PyUnicode_FromFormat("{%U}", inner)
                     : spec_kind(spec, s_tuple) ? PyUnicode_FromFormat("(%U)", inner)
                                                : PyUnicode_FromFormat("[%U]", inner);
    Py_XDECREF(parts);
    Py_XDECREF(sep);
    Py_XDECREF(inner);
    return text;
}

/* Appends the labels of spec's tensor leaves to out: path, path[1][0], path['k']. */
static int leaf_labels(PyObject *spec, PyObject *path, PyObject *out) {
    if (is_tensor_spec(spec)) return PyList_Append(out, path);
    int dict = spec_kind(spec, s_dict), node = spec_kind(spec, s_node) && PyTuple_GET_SIZE(spec) == 4;
    if (!dict && !node && !spec_kind(spec, s_tuple) && !spec_kind(spec, s_list)) return 0;
    PyObject *items = PyTuple_GET_ITEM(spec, dict ? 2 : node ? 3 : 1);
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(items); k++) {
        PyObject *sub = dict ? PyUnicode_FromFormat("%U[%R]", path, PyTuple_GET_ITEM(PyTuple_GET_ITEM(spec, 1), k))
                             : PyUnicode_FromFormat("%U[%zd]", path, k);
        int rc = sub ? leaf_labels(PyTuple_GET_ITEM(items, k), sub, out) : -1;
        Py_XDECREF(sub);
        if (rc < 0) return -1;
    }
    return 0;
}

/* "a tensor" | "a non-tensor (<description>)" */
static PyObject *kind_text(PyObject *spec) {
    if (is_tensor_spec(spec)) return PyUnicode_FromString("a tensor");
    PyObject *d = describe(spec), *text = d ? PyUnicode_FromFormat("a non-tensor (%U)", d) : NULL;
    Py_XDECREF(d);
    return text;
}

static PyObject *was_text(PyObject *path, PyObject *now, PyObject *then) {
    PyObject *text = now && then ? PyUnicode_FromFormat("%U is %U this time but was %U when traced", path, now, then)
                                 : NULL;
    Py_XDECREF(now);
    Py_XDECREF(then);
    return text;
}

/* The first difference between two argument specs (non-tensor values too when `values`), as
 * text (new reference), or None. */
static PyObject *diff_spec(PyObject *a, PyObject *b, PyObject *path, int values) {
    int eq = PyObject_RichCompareBool(a, b, Py_EQ);
    if (eq) return eq < 0 ? NULL : Py_NewRef(Py_None);
    if (is_tensor_spec(a) != is_tensor_spec(b)) return was_text(path, kind_text(b), kind_text(a));
    if (is_tensor_spec(a)) return Py_NewRef(Py_None);
    int konst = spec_kind(a, s_const), dict = spec_kind(a, s_dict);
    int kinds = PyObject_RichCompareBool(PyTuple_GET_ITEM(a, 0), PyTuple_GET_ITEM(b, 0), Py_EQ);
    int keys = dict && kinds == 1 ? PyObject_RichCompareBool(PyTuple_GET_ITEM(a, 1), PyTuple_GET_ITEM(b, 1), Py_EQ) : 1;
    if (kinds < 0 || keys < 0) return NULL;
    PyObject *ia = konst ? NULL : PyTuple_GET_ITEM(a, dict ? 2 : 1), *ib = konst ? NULL : PyTuple_GET_ITEM(b, dict ? 2 : 1);
    if (!kinds || (!konst && (PyTuple_GET_SIZE(ia) != PyTuple_GET_SIZE(ib) || !keys)))
        return was_text(path, describe(b), describe(a));
    if (konst) {
        if (!values) return Py_NewRef(Py_None);
        return was_text(path, PyObject_Repr(((PyConstPayload *)PyTuple_GET_ITEM(b, 3))->value),
                        PyObject_Repr(((PyConstPayload *)PyTuple_GET_ITEM(a, 3))->value));
    }
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(ia); k++) {
        PyObject *sub = dict ? PyUnicode_FromFormat("%U[%R]", path, PyTuple_GET_ITEM(PyTuple_GET_ITEM(a, 1), k))
                             : PyUnicode_FromFormat("%U[%zd]", path, k);
        PyObject *d = sub ? diff_spec(PyTuple_GET_ITEM(ia, k), PyTuple_GET_ITEM(ib, k), sub, values) : NULL;
        Py_XDECREF(sub);
        if (d != Py_None) return d;
        Py_DECREF(d);
    }
    return Py_NewRef(Py_None);
}

/* ---- kiln.jit's cache key ------------------------------------------------------------------ */
/* The key of a call: (spec of (args, kwargs), per tensor leaf (dtype id, shape, requires_grad or 2: hooked),
 * (grad mode, the training mode of each Cell among the owners and the arguments)). */

static PyObject *leaf_signature(PyObject *leaves) {
    PyObject *sig = PyTuple_New(PyList_GET_SIZE(leaves));
    for (Py_ssize_t k = 0; sig && k < PyList_GET_SIZE(leaves); k++) {
        const kiln_tensor *t = pykiln_unwrap(PyList_GET_ITEM(leaves, k));
        PyObject *shape = PyTuple_New(t->meta.ndim);
        for (int d = 0; shape && d < t->meta.ndim; d++) {
            PyObject *n = PyLong_FromLongLong(t->meta.shape[d]);
            if (!n) Py_CLEAR(shape);
            else PyTuple_SET_ITEM(shape, d, n);
        }
        /* requires_grad: True, False, or 2 when a backward hook would see the tensor's gradient (a call
         * whose backward runs it is not replayed: kiln.grad_hooks) */
        PyObject *rg = kiln_autograd_has_hooks(t) ? PyLong_FromLong(2) : Py_NewRef(t->requires_grad ? Py_True : Py_False);
        PyObject *entry = shape && rg ? Py_BuildValue("(iNN)", (int)t->meta.dtype, shape, rg) : NULL;
        if (!entry && !shape) Py_XDECREF(rg);
        if (!entry) Py_CLEAR(sig);
        else PyTuple_SET_ITEM(sig, k, entry);
    }
    return sig;
}

/* Appends the training mode of each Cell in seq to modes. */
static int cells_training(PyObject *seq, PyObject *modes) {
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(seq); k++) {
        PyObject *o = PyTuple_GET_ITEM(seq, k);
        if (!pykiln_is_cell(o)) continue;
        PyObject *training = PyObject_GetAttrString(o, "training");
        int rc = training ? PyList_Append(modes, training) : -1;
        Py_XDECREF(training);
        if (rc < 0) return -1;
    }
    return 0;
}

/* Where a tensor is passed more than once (f(x, x)): a tuple giving, per leaf, the index of its first
 * occurrence (new reference), or None when every leaf is its own tensor. The key holds it, so a graph
 * captured with one tensor in two places (where `a is b`) serves only calls that pass one tensor so. */
static PyObject *same_tensor_pattern(PyObject *leaves) {
    Py_ssize_t n = PyList_GET_SIZE(leaves);
    PyObject *first = NULL;
    for (Py_ssize_t k = 1; k < n; k++) {
        PyObject *t = PyList_GET_ITEM(leaves, k);
        for (Py_ssize_t j = 0; j < k; j++) {
            if (PyList_GET_ITEM(leaves, j) != t) continue;
            if (!first) {
                first = PyTuple_New(n);
                for (Py_ssize_t i = 0; first && i < n; i++) {
                    PyObject *v = PyLong_FromSsize_t(i);
                    if (!v) Py_CLEAR(first);
                    else PyTuple_SET_ITEM(first, i, v);
                }
                if (!first) return NULL;
            }
            PyObject *v = PyLong_FromSsize_t(j);
            if (!v) {
                Py_DECREF(first);
                return NULL;
            }
            Py_SETREF(PyTuple_GET_ITEM(first, k), v); /* (a tuple this function made: not shared yet) */
            break;
        }
    }
    return first ? first : Py_NewRef(Py_None);
}

static PyObject *call_key(PyObject *args, PyObject *kwargs, PyObject *owners) {
    PyObject *leaves = PyList_New(0), *call = leaves ? PyTuple_Pack(2, args, kwargs) : NULL;
    int prev_mark = mark_layout;
    mark_layout = 1;
    PyObject *spec = call ? flatten(call, leaves) : NULL, *sig = spec ? leaf_signature(leaves) : NULL;
    mark_layout = prev_mark;
    PyObject *modes = sig ? PyList_New(0) : NULL, *key = NULL;
    if (modes && cells_training(owners, modes) == 0 && cells_training(args, modes) == 0) {
        PyObject *same = same_tensor_pattern(leaves), *extra = NULL;
        if (same == Py_None)
            extra = Py_BuildValue("(ON)", kiln_grad_enabled() ? Py_True : Py_False, PyList_AsTuple(modes));
        else if (same)
            extra = Py_BuildValue("(ON(sO))", kiln_grad_enabled() ? Py_True : Py_False, PyList_AsTuple(modes),
                                  "same tensors", same);
        Py_XDECREF(same);
        kiln_amp_level amp;
        kiln_dtype low;
        kiln_amp_get(&amp, &low);
        if (extra && amp != KILN_AMP_O0) { /* a call under amp records other casts: its own key */
            PyObject *more = Py_BuildValue("((siO))", "amp", (int)amp, pykiln_dtypes[low]);
            Py_SETREF(extra, more ? PySequence_Concat(extra, more) : NULL);
            Py_XDECREF(more);
        }
        key = extra ? Py_BuildValue("((OON)O)", spec, sig, extra, leaves) : NULL;
    }
    Py_XDECREF(leaves);
    Py_XDECREF(call);
    Py_XDECREF(spec);
    Py_XDECREF(sig);
    Py_XDECREF(modes);
    return key;
}

/* What differs between two cache keys, for the recompile warning. */
static PyObject *describe_change(PyObject *old, PyObject *new) {
    PyObject *ospec, *osig, *oextra, *nspec, *nsig, *nextra;
    if (!PyArg_ParseTuple(old, "OO!O", &ospec, &PyTuple_Type, &osig, &oextra) ||
        !PyArg_ParseTuple(new, "OO!O", &nspec, &PyTuple_Type, &nsig, &nextra))
        return NULL;
    /* extra: (grad mode, training modes[, which leaves are one tensor]); the modes first, the
     * aliasing after the arguments themselves */
    PyObject *omodes = PyTuple_Check(oextra) ? PyTuple_GetSlice(oextra, 0, 2) : Py_NewRef(oextra);
    PyObject *nmodes = omodes && PyTuple_Check(nextra) ? PyTuple_GetSlice(nextra, 0, 2) : Py_XNewRef(nextra);
    int eq = omodes && nmodes ? PyObject_RichCompareBool(omodes, nmodes, Py_EQ) : -1;
    Py_XDECREF(omodes);
    Py_XDECREF(nmodes);
    if (eq <= 0) return eq < 0 ? NULL : PyUnicode_FromString("the grad or training mode");
    eq = PyObject_RichCompareBool(ospec, nspec, Py_EQ);
    if (eq < 0) return NULL;
    if (!eq) {
        PyObject *oa = PyTuple_GET_ITEM(PyTuple_GET_ITEM(PyTuple_GET_ITEM(ospec, 1), 0), 1);
        PyObject *na = PyTuple_GET_ITEM(PyTuple_GET_ITEM(PyTuple_GET_ITEM(nspec, 1), 0), 1);
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(oa) && i < PyTuple_GET_SIZE(na); i++) {
            PyObject *a = PyTuple_GET_ITEM(oa, i), *b = PyTuple_GET_ITEM(na, i);
            int same = PyObject_RichCompareBool(a, b, Py_EQ);
            if (same < 0) return NULL;
            if (same) continue;
            PyObject *da = describe(a), *db = da ? describe(b) : NULL;
            PyObject *text = db ? PyUnicode_FromFormat("argument %zd (%U -> %U)", i, da, db) : NULL;
            Py_XDECREF(da);
            Py_XDECREF(db);
            return text;
        }
        return PyUnicode_FromString("the argument structure");
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(osig) && i < PyTuple_GET_SIZE(nsig); i++) {
        PyObject *o = PyTuple_GET_ITEM(osig, i), *n = PyTuple_GET_ITEM(nsig, i);
        int same = PyObject_RichCompareBool(o, n, Py_EQ);
        if (same < 0) return NULL;
        if (same) continue;
        PyObject *osh = PyTuple_GET_ITEM(o, 1), *nsh = PyTuple_GET_ITEM(n, 1);
        int same_shape = PyObject_RichCompareBool(osh, nsh, Py_EQ);
        int same_dtype = PyObject_RichCompareBool(PyTuple_GET_ITEM(o, 0), PyTuple_GET_ITEM(n, 0), Py_EQ);
        if (same_shape < 0 || same_dtype < 0) return NULL;
        const char *what = !same_shape ? "shape" : !same_dtype ? "dtype" : "requires_grad";
        return PyUnicode_FromFormat("the %s of tensor argument %zd (%R -> %R)", what, i, osh, nsh);
    }
    eq = PyObject_RichCompareBool(oextra, nextra, Py_EQ);
    if (eq == 0) return PyUnicode_FromString("one tensor passed as two arguments (or no longer)");
    if (eq < 0) return NULL;
    return PyUnicode_FromString("the signature");
}

/* ---- a trace's call against the traced call ----------------------------------------------- */

/* "k (was <description>)" / "k (now ...)" for each keyword in names whose spec is in specs. */
static PyObject *keyword_list(PyObject *names, PyObject *specs, const char *format) {
    PyObject *parts = PyList_New(0);
    for (Py_ssize_t k = 0; parts && k < PyList_GET_SIZE(names); k++) {
        PyObject *name = PyList_GET_ITEM(names, k), *d = describe(PyDict_GetItem(specs, name));
        PyObject *part = d ? PyUnicode_FromFormat(format, name, d) : NULL;
        if (!part || PyList_Append(parts, part) < 0) Py_CLEAR(parts);
        Py_XDECREF(d);
        Py_XDECREF(part);
    }
    PyObject *sep = PyUnicode_FromString(", "), *text = parts && sep ? PyUnicode_Join(sep, parts) : NULL;
    Py_XDECREF(parts);
    Py_XDECREF(sep);
    return text;
}

/* The keywords whose spec is a tensor in `now` but not in `then`, sorted (new list). */
static PyObject *turned_tensor(PyObject *now, PyObject *then) {
    PyObject *out = PyList_New(0), *name, *spec;
    Py_ssize_t pos = 0;
    while (out && PyDict_Next(now, &pos, &name, &spec)) {
        PyObject *old = PyDict_GetItem(then, name);
        if (old && is_tensor_spec(spec) && !is_tensor_spec(old) && PyList_Append(out, name) < 0) Py_CLEAR(out);
    }
    if (out && PyList_Sort(out) < 0) Py_CLEAR(out);
    return out;
}

static PyObject *kwargs_dict(PyObject *spec) {
    PyObject *d = PyDict_New();
    PyObject *names = PyTuple_GET_ITEM(spec, 1), *specs = PyTuple_GET_ITEM(spec, 2);
    for (Py_ssize_t k = 0; d && k < PyTuple_GET_SIZE(names); k++)
        if (PyDict_SetItem(d, PyTuple_GET_ITEM(names, k), PyTuple_GET_ITEM(specs, k)) < 0) Py_CLEAR(d);
    return d;
}

static PyObject *sorted_names(PyObject *names) {
    PyObject *list = PySequence_List(names);
    if (list && PyList_Sort(list) < 0) Py_CLEAR(list);
    return list;
}

/* Keyword differences between two calls, as text, or None (new reference). */
static PyObject *keyword_difference(PyObject *okw, PyObject *nkw, PyObject *old_items, PyObject *new_items) {
    PyObject *on = PyTuple_GET_ITEM(okw, 1), *nn = PyTuple_GET_ITEM(nkw, 1);
    int same_names = PyObject_RichCompareBool(on, nn, Py_EQ);
    if (same_names == 0) { /* the same names in another order are the same keywords */
        PyObject *a = PyFrozenSet_New(on), *b = a ? PyFrozenSet_New(nn) : NULL;
        same_names = b ? PyObject_RichCompareBool(a, b, Py_EQ) : -1;
        Py_XDECREF(a);
        Py_XDECREF(b);
    }
    if (same_names < 0) return NULL;
    if (!same_names) {
        PyObject *a = sorted_names(on), *b = a ? sorted_names(nn) : NULL;
        PyObject *text = b ? PyUnicode_FromFormat("different keyword arguments: the function was traced with %R, this "
                                                  "call passes %R", a, b)
                           : NULL;
        Py_XDECREF(a);
        Py_XDECREF(b);
        return text;
    }
    PyObject *to_tensor = turned_tensor(new_items, old_items), *to_other = to_tensor ? turned_tensor(old_items, new_items)
                                                                                      : NULL;
    PyObject *text = NULL;
    if (to_other && PyList_GET_SIZE(to_tensor)) {
        PyObject *list = keyword_list(to_tensor, old_items, "%U (was %U)");
        text = list ? PyUnicode_FromFormat("keyword arguments found to be tensor this time but were non-tensor when "
                                           "traced: %U", list)
                    : NULL;
        Py_XDECREF(list);
    } else if (to_other && PyList_GET_SIZE(to_other)) {
        PyObject *list = keyword_list(to_other, new_items, "%U (now %U)");
        text = list ? PyUnicode_FromFormat("keyword arguments found to be non-tensor this time but were tensor when "
                                           "traced: %U", list)
                    : NULL;
        Py_XDECREF(list);
    } else if (to_other) {
        text = Py_NewRef(Py_None);
    }
    Py_XDECREF(to_tensor);
    Py_XDECREF(to_other);
    return text;
}

static const char values_hint[] = "; with verify=False the trace can't check that the graph still holds for new "
                                  "non-tensor values (pass them as tensors, or use verify=True)";

/* The first difference of argument structure (then, unless verify, of non-tensor values)
 * between the traced call `old` and this call `new` (specs of (args, kwargs)), or None. */
static PyObject *check_call(PyObject *old, PyObject *new, int verify) {
    PyObject *oargs = PyTuple_GET_ITEM(PyTuple_GET_ITEM(old, 1), 0), *okw = PyTuple_GET_ITEM(PyTuple_GET_ITEM(old, 1), 1);
    PyObject *nargs = PyTuple_GET_ITEM(PyTuple_GET_ITEM(new, 1), 0), *nkw = PyTuple_GET_ITEM(PyTuple_GET_ITEM(new, 1), 1);
    PyObject *oa = PyTuple_GET_ITEM(oargs, 1), *na = PyTuple_GET_ITEM(nargs, 1);
    if (PyTuple_GET_SIZE(oa) != PyTuple_GET_SIZE(na))
        return PyUnicode_FromFormat("different argument count: the function was traced with %zd positional "
                                    "arguments, this call passes %zd", PyTuple_GET_SIZE(oa), PyTuple_GET_SIZE(na));
    PyObject *old_items = kwargs_dict(okw), *new_items = old_items ? kwargs_dict(nkw) : NULL;
    PyObject *d = new_items ? keyword_difference(okw, nkw, old_items, new_items) : NULL;
    for (int values = 0; d == Py_None && values < 2 && !(values && verify); values++) {
        for (Py_ssize_t k = 0; d == Py_None && k < PyTuple_GET_SIZE(oa); k++) {
            PyObject *path = PyUnicode_FromFormat("args[%zd]", k);
            Py_SETREF(d, path ? diff_spec(PyTuple_GET_ITEM(oa, k), PyTuple_GET_ITEM(na, k), path, values) : NULL);
            Py_XDECREF(path);
        }
        PyObject *names = PyTuple_GET_ITEM(okw, 1);
        for (Py_ssize_t k = 0; d == Py_None && k < PyTuple_GET_SIZE(names); k++) {
            PyObject *name = PyTuple_GET_ITEM(names, k);
            Py_SETREF(d, diff_spec(PyDict_GetItem(old_items, name), PyDict_GetItem(new_items, name), name, values));
        }
        if (d && d != Py_None && values) Py_SETREF(d, PyUnicode_FromFormat("%U%s", d, values_hint));
    }
    Py_XDECREF(old_items);
    Py_XDECREF(new_items);
    return d;
}

/* ---- the values of ast-converted branches ------------------------------------------------- */
/* A value an if on a tensor chooses, flattened for kiln.ops.cond (kiln.jit.ast_runtime):
 *     "T"                          a tensor, or a bool/int/float made a 0-d tensor (bool, int64,
 *                                  float64, or float32 when asked) that the graph selects
 *     (type, (spec, ...))          a tuple or list (rebuilt as a tuple only for exactly tuple)
 *     (dict, (key, ...), (spec, ...))
 *     ("const", value)             anything else, which both branches must give equal */

static int is_number(PyObject *v) { return PyLong_Check(v) || PyFloat_Check(v); }

static PyObject *number_tensor(PyObject *v, kiln_dtype float_dtype) {
    kiln_dtype dtype = PyBool_Check(v) ? KILN_DTYPE_BOOL : PyLong_Check(v) ? KILN_DTYPE_INT64 : float_dtype;
    return PyObject_CallFunctionObjArgs((PyObject *)pykiln_tensor_class, v, pykiln_dtypes[dtype], NULL);
}

static PyObject *branch_flatten(PyObject *obj, PyObject *leaves, kiln_dtype float_dtype) {
    if (pykiln_is_tensor(obj) || is_number(obj)) {
        PyObject *t = pykiln_is_tensor(obj) ? Py_NewRef(obj) : number_tensor(obj, float_dtype);
        int rc = t ? PyList_Append(leaves, t) : -1;
        Py_XDECREF(t);
        return rc < 0 ? NULL : Py_NewRef(s_T);
    }
    int dict = PyDict_Check(obj);
    if (!dict && !PyTuple_Check(obj) && !PyList_Check(obj)) return Py_BuildValue("(OO)", s_const, obj);
    PyObject *keys = dict ? PyDict_Keys(obj) : NULL, *values = dict ? PyDict_Values(obj) : PySequence_List(obj);
    PyObject *specs = values ? PyTuple_New(PyList_GET_SIZE(values)) : NULL;
    for (Py_ssize_t k = 0; specs && k < PyList_GET_SIZE(values); k++) {
        PyObject *sub = branch_flatten(PyList_GET_ITEM(values, k), leaves, float_dtype);
        if (!sub) Py_CLEAR(specs);
        else PyTuple_SET_ITEM(specs, k, sub);
    }
    PyObject *spec = !specs ? NULL
                     : dict ? Py_BuildValue("(ONN)", (PyObject *)&PyDict_Type, PyList_AsTuple(keys), specs)
                            : Py_BuildValue("(ON)", (PyObject *)Py_TYPE(obj), specs);
    Py_XDECREF(keys);
    Py_XDECREF(values);
    return spec;
}

static PyObject *branch_unflatten(PyObject *spec, PyObject *leaves) {
    if (is_tensor_spec(spec)) {
        PyObject *leaf = PyIter_Next(leaves);
        return leaf || PyErr_Occurred() ? leaf : PyErr_Format(PyExc_ValueError, "branch results: too few tensors");
    }
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) < 2) return bad_spec(spec);
    PyObject *kind = PyTuple_GET_ITEM(spec, 0);
    if (PyUnicode_Check(kind)) return Py_NewRef(PyTuple_GET_ITEM(spec, 1)); /* ("const", value) */
    int dict = kind == (PyObject *)&PyDict_Type;
    PyObject *items = PyTuple_GET_ITEM(spec, dict ? 2 : 1), *out = dict ? PyDict_New() : PyList_New(0);
    for (Py_ssize_t k = 0; out && k < PyTuple_GET_SIZE(items); k++) {
        PyObject *item = branch_unflatten(PyTuple_GET_ITEM(items, k), leaves);
        int rc = !item ? -1
                 : dict ? PyDict_SetItem(out, PyTuple_GET_ITEM(PyTuple_GET_ITEM(spec, 1), k), item)
                        : PyList_Append(out, item);
        Py_XDECREF(item);
        if (rc < 0) Py_CLEAR(out);
    }
    if (out && kind == (PyObject *)&PyTuple_Type) Py_SETREF(out, PyList_AsTuple(out));
    return out;
}

/* Whether two branches gave values of one structure (and equal constants): 1, 0, -1. */
static int same_branch_spec(PyObject *a, PyObject *b) {
    if (is_tensor_spec(a) || is_tensor_spec(b)) return is_tensor_spec(a) && is_tensor_spec(b);
    PyObject *ka = PyTuple_GET_ITEM(a, 0), *kb = PyTuple_GET_ITEM(b, 0);
    if (PyUnicode_Check(ka) || PyUnicode_Check(kb)) {
        if (!PyUnicode_Check(ka) || !PyUnicode_Check(kb)) return 0;
        PyObject *va = PyTuple_GET_ITEM(a, 1), *vb = PyTuple_GET_ITEM(b, 1);
        return va == vb ? 1 : PyObject_RichCompareBool(va, vb, Py_EQ);
    }
    int dict = ka == (PyObject *)&PyDict_Type;
    PyObject *ia = PyTuple_GET_ITEM(a, dict ? 2 : 1), *ib = PyTuple_GET_ITEM(b, dict ? 2 : 1);
    if (ka != kb || PyTuple_GET_SIZE(ia) != PyTuple_GET_SIZE(ib)) return 0;
    int same = dict ? PyObject_RichCompareBool(PyTuple_GET_ITEM(a, 1), PyTuple_GET_ITEM(b, 1), Py_EQ) : 1;
    for (Py_ssize_t k = 0; same == 1 && k < PyTuple_GET_SIZE(ia); k++)
        same = same_branch_spec(PyTuple_GET_ITEM(ia, k), PyTuple_GET_ITEM(ib, k));
    return same;
}

/* ---- the module functions ----------------------------------------------------------------- */

static PyObject *py_flatten(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *obj, *leaves;
    if (!PyArg_ParseTuple(args, "OO!:flatten", &obj, &PyList_Type, &leaves)) return NULL;
    return flatten(obj, leaves);
}

static PyObject *py_unflatten(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *spec, *leaves;
    Py_ssize_t pos = 0;
    if (!PyArg_ParseTuple(args, "OO|n:unflatten", &spec, &leaves, &pos)) return NULL;
    PyObject *fast = PySequence_Fast(leaves, "unflatten: leaves must be a sequence");
    if (!fast) return NULL;
    if (pos < 0) pos = 0;
    PyObject *obj = unflatten(spec, fast, &pos);
    Py_DECREF(fast);
    return obj ? Py_BuildValue("(Nn)", obj, pos) : NULL;
}

/* ---- results made again at each call ---------------------------------------------------------- */

/* The set a const spec carries (borrowed), or NULL: any other spec. */
static PyObject *set_constant(PyObject *spec) {
    if (!spec_kind(spec, s_const) || PyTuple_GET_SIZE(spec) != 4 ||
        !PyObject_TypeCheck(PyTuple_GET_ITEM(spec, 3), &PyConstPayload_Type))
        return NULL;
    PyObject *value = ((PyConstPayload *)PyTuple_GET_ITEM(spec, 3))->value;
    return PySet_CheckExact(value) ? value : NULL;
}

/* Where a container spec keeps the tuple of its children's specs: (tuple|list, specs, ...),
 * (dict, keys, specs, ...), (node, type, aux, specs); -1 for any other spec. */
static Py_ssize_t children_at(PyObject *spec) {
    Py_ssize_t at = spec_kind(spec, s_node) ? 3 : spec_kind(spec, s_dict) ? 2
                    : (spec_kind(spec, s_tuple) || spec_kind(spec, s_list)) ? 1 : -1;
    return at < 0 || PyTuple_GET_SIZE(spec) <= at || !PyTuple_Check(PyTuple_GET_ITEM(spec, at)) ? -1 : at;
}

/* spec with the payloads of its sets marked fresh (new reference): a set the call made is a new set
 * at each eager call, and a compiled call must not hand every caller the capture's. The sets are
 * appended to found (the caller refuses those that are not the call's own). */
static PyObject *mark_fresh(PyObject *spec, PyObject *found, int depth) {
    if (depth > 100) return PyErr_Format(PyExc_RecursionError, "jit: a result nested too deep");
    if (is_tensor_spec(spec) || !PyTuple_Check(spec)) return Py_NewRef(spec);
    PyObject *value = set_constant(spec);
    if (value) {
        if (PyList_Append(found, value) < 0) return NULL;
        PyObject *payload = make_payload(value);
        if (!payload) return NULL;
        ((PyConstPayload *)payload)->fresh = 1; /* (unflatten: PySet_New of it) */
        PyObject *out = PyTuple_Pack(4, s_const, PyTuple_GET_ITEM(spec, 1), PyTuple_GET_ITEM(spec, 2), payload);
        Py_DECREF(payload);
        return out;
    }
    Py_ssize_t at = children_at(spec);
    if (at < 0) return Py_NewRef(spec);
    PyObject *items = PyTuple_GET_ITEM(spec, at), *fresh_items = PyTuple_New(PyTuple_GET_SIZE(items));
    for (Py_ssize_t k = 0; fresh_items && k < PyTuple_GET_SIZE(items); k++) {
        PyObject *item = mark_fresh(PyTuple_GET_ITEM(items, k), found, depth + 1);
        if (!item) Py_CLEAR(fresh_items);
        else PyTuple_SET_ITEM(fresh_items, k, item);
    }
    if (!fresh_items) return NULL;
    PyObject *out = PyTuple_New(PyTuple_GET_SIZE(spec));
    if (!out) {
        Py_DECREF(fresh_items);
        return NULL;
    }
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(spec); k++)
        PyTuple_SET_ITEM(out, k, k == at ? fresh_items : Py_NewRef(PyTuple_GET_ITEM(spec, k)));
    return out;
}

/* Whether spec holds a set constant (a walk without allocations: most results hold none). */
static int holds_set(PyObject *spec, int depth) {
    if (depth > 100 || is_tensor_spec(spec) || !PyTuple_Check(spec)) return 0;
    if (set_constant(spec)) return 1;
    Py_ssize_t at = children_at(spec);
    if (at < 0) return 0;
    PyObject *items = PyTuple_GET_ITEM(spec, at);
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(items); k++)
        if (holds_set(PyTuple_GET_ITEM(items, k), depth + 1)) return 1;
    return 0;
}

static PyObject *py_fresh_results(PyObject *module, PyObject *spec) {
    (void)module;
    if (!holds_set(spec, 0)) return Py_BuildValue("(ON)", spec, PyList_New(0));
    PyObject *found = PyList_New(0), *out = found ? mark_fresh(spec, found, 0) : NULL;
    PyObject *res = out ? PyTuple_Pack(2, out, found) : NULL;
    Py_XDECREF(out);
    Py_XDECREF(found);
    return res;
}

static PyObject *py_describe(PyObject *module, PyObject *spec) {
    (void)module;
    return describe(spec);
}

static PyObject *py_const_key(PyObject *module, PyObject *obj) {
    (void)module;
    return const_key(obj);
}

static PyObject *py_arg_labels(PyObject *module, PyObject *spec) {
    (void)module;
    PyObject *args_spec, *kwargs_spec;
    if (!PyArg_ParseTuple(spec, "s(OO):arg_labels", &(const char *){0}, &args_spec, &kwargs_spec) ||
        !spec_kind(args_spec, s_tuple) || !spec_kind(kwargs_spec, s_dict) || PyTuple_GET_SIZE(kwargs_spec) != 3)
        return PyErr_Occurred() ? NULL : bad_spec(spec);
    PyObject *out = PyList_New(0), *items = PyTuple_GET_ITEM(args_spec, 1);
    for (Py_ssize_t k = 0; out && k < PyTuple_GET_SIZE(items); k++) {
        PyObject *path = PyUnicode_FromFormat("args[%zd]", k);
        if (!path || leaf_labels(PyTuple_GET_ITEM(items, k), path, out) < 0) Py_CLEAR(out);
        Py_XDECREF(path);
    }
    PyObject *names = PyTuple_GET_ITEM(kwargs_spec, 1), *specs = PyTuple_GET_ITEM(kwargs_spec, 2);
    for (Py_ssize_t k = 0; out && k < PyTuple_GET_SIZE(names) && k < PyTuple_GET_SIZE(specs); k++)
        if (leaf_labels(PyTuple_GET_ITEM(specs, k), PyTuple_GET_ITEM(names, k), out) < 0) Py_CLEAR(out);
    return out;
}

static PyObject *py_diff_spec(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *a, *b, *path;
    int values;
    if (!PyArg_ParseTuple(args, "OOUp:diff_spec", &a, &b, &path, &values)) return NULL;
    return diff_spec(a, b, path, values);
}

static PyObject *py_call_key(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *call_args, *kwargs, *owners;
    if (!PyArg_ParseTuple(args, "O!O!O!:call_key", &PyTuple_Type, &call_args, &PyDict_Type, &kwargs, &PyTuple_Type,
                          &owners))
        return NULL;
    return call_key(call_args, kwargs, owners);
}

static PyObject *py_describe_change(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *old, *new;
    if (!PyArg_ParseTuple(args, "O!O!:describe_change", &PyTuple_Type, &old, &PyTuple_Type, &new)) return NULL;
    return describe_change(old, new);
}

static PyObject *py_check_call(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *old, *new;
    int verify;
    if (!PyArg_ParseTuple(args, "OOp:check_call", &old, &new, &verify)) return NULL;
    if (!spec_kind(old, s_tuple) || !spec_kind(new, s_tuple)) return bad_spec(old);
    return check_call(old, new, verify);
}

static PyObject *py_branch_flatten(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *obj, *leaves;
    int float32 = 0;
    if (!PyArg_ParseTuple(args, "OO!|p:branch_flatten", &obj, &PyList_Type, &leaves, &float32)) return NULL;
    return branch_flatten(obj, leaves, float32 ? KILN_DTYPE_FLOAT32 : KILN_DTYPE_FLOAT64);
}

static PyObject *py_branch_unflatten(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *spec, *leaves;
    if (!PyArg_ParseTuple(args, "OO:branch_unflatten", &spec, &leaves)) return NULL;
    if (!PyIter_Check(leaves)) return PyErr_Format(PyExc_TypeError, "branch_unflatten: leaves must be an iterator");
    return branch_unflatten(spec, leaves);
}

static PyObject *py_same_branch_spec(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *a, *b;
    if (!PyArg_ParseTuple(args, "OO:same_branch_spec", &a, &b)) return NULL;
    int same = same_branch_spec(a, b);
    return same < 0 ? NULL : PyBool_FromLong(same);
}

static PyObject *py_register_node(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *type, *flat, *unflat;
    if (!PyArg_ParseTuple(args, "O!OO:register_node", &PyType_Type, &type, &flat, &unflat)) return NULL;
    if (!PyCallable_Check(flat) || !PyCallable_Check(unflat))
        return PyErr_Format(PyExc_TypeError, "register_node: flatten and unflatten must be callable");
    PyObject *pair = PyTuple_Pack(2, flat, unflat);
    int rc = pair ? PyDict_SetItem(node_registry, type, pair) : -1;
    Py_XDECREF(pair);
    return rc < 0 ? NULL : Py_NewRef(Py_None);
}

static PyObject *py_set_node_default(PyObject *module, PyObject *fn) {
    (void)module;
    Py_XSETREF(node_default, Py_NewRef(fn));
    return Py_NewRef(Py_None);
}

static PyMethodDef tree_functions[] = {
    {"flatten", py_flatten, METH_VARARGS, "flatten(obj, leaves) -> spec: appends obj's tensors to leaves"},
    {"unflatten", py_unflatten, METH_VARARGS, "unflatten(spec, leaves, pos=0) -> (object, next pos)"},
    {"describe", py_describe, METH_O, "describe(spec) -> short text of a structure, for messages"},
    {"fresh_results", py_fresh_results, METH_O,
     "fresh_results(spec of a result) -> (spec whose sets unflatten copies, those sets)"},
    {"const_key", py_const_key, METH_O, "const_key(obj) -> what distinguishes a constant for the compile cache"},
    {"arg_labels", py_arg_labels, METH_O, "arg_labels(spec of (args, kwargs)) -> labels of its tensor leaves"},
    {"diff_spec", py_diff_spec, METH_VARARGS,
     "diff_spec(a, b, path, values) -> the first difference between two specs as text, or None"},
    {"call_key", py_call_key, METH_VARARGS,
     "call_key(args, kwargs, owners) -> ((spec, signature, (grad mode, Cell training modes)), tensor leaves)"},
    {"describe_change", py_describe_change, METH_VARARGS,
     "describe_change(old_key, new_key) -> what differs between two call keys, for messages"},
    {"check_call", py_check_call, METH_VARARGS,
     "check_call(old, new, verify) -> how a trace's call differs from the traced one in its arguments, or None"},
    {"branch_flatten", py_branch_flatten, METH_VARARGS,
     "branch_flatten(value, leaves, float32=False) -> spec: a value an if on a tensor chooses; numbers become "
     "0-d tensors (floats float64, or float32)"},
    {"branch_unflatten", py_branch_unflatten, METH_VARARGS,
     "branch_unflatten(spec, leaves_iterator) -> the value rebuilt from the selected tensors"},
    {"same_branch_spec", py_same_branch_spec, METH_VARARGS,
     "same_branch_spec(a, b) -> whether two branches gave values of one structure"},
    {"register_node", py_register_node, METH_VARARGS,
     "register_node(type, flatten, unflatten): flatten(obj) -> (children, hashable aux); unflatten(aux, children)"},
    {"set_node_default", py_set_node_default, METH_O,
     "set_node_default(fn): fn(dataclass type) -> (flatten, unflatten) or None, for unregistered dataclasses"},
    {NULL, NULL, 0, NULL},
};

int pykiln_tree_init(PyObject *module) {
    if (!(s_T = PyUnicode_InternFromString("T")) || !(s_tuple = PyUnicode_InternFromString("tuple")) ||
        !(s_list = PyUnicode_InternFromString("list")) || !(s_dict = PyUnicode_InternFromString("dict")) ||
        !(s_const = PyUnicode_InternFromString("const")) || !(s_node = PyUnicode_InternFromString("node")) ||
        !(s_Tv = PyUnicode_InternFromString("Tv")) ||
        !(node_registry = PyDict_New()))
        return -1;
    if (PyType_Ready(&PyConstPayload_Type) < 0) return -1;
    Py_INCREF(&PyConstPayload_Type);
    if (PyModule_AddObject(module, "ConstPayload", (PyObject *)&PyConstPayload_Type) < 0) return -1;
    PyObject *tree = PyModule_New("kiln._C.tree");
    /* the registry itself, read by kiln.tree_util (one registry for jit and the public pytree API) */
    if (!tree || PyModule_AddFunctions(tree, tree_functions) < 0 || PyModule_AddObjectRef(tree, "TENSOR", s_T) < 0 ||
        PyModule_AddObjectRef(tree, "registry", node_registry) < 0) {
        Py_XDECREF(tree);
        return -1;
    }
    return PyModule_AddObject(module, "tree", tree);
}
