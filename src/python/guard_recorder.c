/* kiln._C.GuardRecorder: collects the guards and the Python side effects of one capture (the
 * policy is described in python/kiln/jit/guards.py). kiln.jit shows it every frame of user code
 * as the frame starts (on_call); from the frame's CodeFacts (code_facts.c) it guards the globals
 * the code loads, the closure cells it reads and each step of its attribute and subscript chains
 * on the value each has now, a Cell's state version beside it, and takes a shallow snapshot of
 * each container or object reached. When the capture ends, side_effect() reports the first
 * Python side effect and guard_set() builds the GuardSet (guards.c).
 *
 * Reference notes: the recorder owns everything it keeps; guards and snapshots are keyed by the
 * id of an object the entry itself holds, so ids stay valid while the recorder lives. */
#include "pykiln.h"

typedef struct {
    PyObject_HEAD
    PyObject *top;          /* the function captured (its closure is known without a search), or None */
    PyObject *is_user_code; /* callable(code) -> bool */
    PyObject *rt;           /* the name under which converted code sees the ast runtime */
    PyObject *cell_type;    /* kiln.nn.Cell */
    PyObject *side_effect;  /* the SideEffect exception class: SideEffect(what, filename, line) */
    PyObject *guards;       /* (id(root), step) -> (root, path, expected, mode, description) */
    PyObject *watched;      /* id(obj) -> (obj, snapshot, description, code that reached it) */
    PyObject *outside;      /* ids of the watched objects a chain reached (not a frame's argument): state from before the call */
    PyObject *effects;      /* [(what, filename, line)] */
    PyObject *local_codes;  /* code objects of functions defined while capturing */
    PyObject *functions_of; /* code -> the functions with that code (a search of the heap, once) */
    PyObject *appended;     /* borrowed while a code is recorded: its CodeFacts.appended, or NULL */
    PyObject *running;      /* borrowed while a code is recorded: the function running it, when known */
} PyGuardRecorder;

static PyObject *s_getattribute, *s_getattr, *s_get;
static PyObject *s_kiln_original;
static PyObject *s_defaults, *s_kwdefaults, *s_contents, *s_attr, *s_item, *s_kiln, *s_colon, *cell_path, *s_kiln_version, *s_training, *s_dict, *s_print, *s_locals, *builtins;

enum { SNAP_LIST, SNAP_DICT, SNAP_SET, SNAP_BYTES, SNAP_OBJECT, SNAP_ITERATOR };

static int step_is(PyObject *step, char kind) {
    return PyUnicode_READ_CHAR(PyTuple_GET_ITEM(step, 0), 0) == (Py_UCS4)kind;
}

static PyObject *instance_dict(PyObject *obj, int *err);

/* Whether f is a function of kiln's own package (its attribute hooks read kiln's tables only). */
static int kiln_function(PyObject *f) {
    if (!PyFunction_Check(f)) return 0;
    PyObject *module = PyFunction_GetModule(f);
    return module && PyUnicode_Check(module) && PyUnicode_Tailmatch(module, s_kiln, 0, 4, -1) == 1 &&
           (PyUnicode_GET_LENGTH(module) == 4 || PyUnicode_READ_CHAR(module, 4) == '.');
}

/* Whether reading cur.name would run Python code of the user's: a property or another descriptor
 * written in Python, a __getattribute__, or a __getattr__ for a name found nowhere else. Its getter
 * may have effects (self.count += 1), which a guard must not repeat: such a chain is not followed
 * (the getter's own reads are guarded where it runs). 1, 0, or -1 on error. */
static int attribute_runs_user_code(PyObject *cur, PyObject *name) {
    PyTypeObject *tp = Py_TYPE(cur);
    if (PyModule_Check(cur) || PyType_Check(cur) || !(tp->tp_flags & Py_TPFLAGS_HEAPTYPE)) return 0;
    PyObject *hook = _PyType_Lookup(tp, s_getattribute);
    if (hook && PyFunction_Check(hook) && !kiln_function(hook)) return 1;
    PyObject *d = _PyType_Lookup(tp, name);
    if (d && Py_TYPE(d)->tp_descr_get && !PyFunction_Check(d)) {
        if (PyObject_TypeCheck(d, &PyProperty_Type)) {
            PyObject *fget = PyObject_GetAttrString(d, "fget");
            if (!fget) return -1;
            int own = kiln_function(fget);
            Py_DECREF(fget);
            return !own;
        }
        if (Py_TYPE(d)->tp_flags & Py_TPFLAGS_HEAPTYPE) { /* a descriptor class written in Python */
            PyObject *get = _PyType_Lookup(Py_TYPE(d), s_get);
            return get && !kiln_function(get);
        }
        return 0; /* a method, staticmethod, classmethod, slot or C getter */
    }
    if (d) return 0;
    int err;
    PyObject *dict = instance_dict(cur, &err);
    if (err) return -1;
    int in = dict ? PyDict_Contains(dict, name) : 0;
    Py_XDECREF(dict);
    if (in != 0) return in < 0 ? -1 : 0;
    hook = _PyType_Lookup(tp, s_getattr);
    return hook && !kiln_function(hook);
}

/* The object one step reaches from cur (new reference), or NULL: nothing there, also when the
 * step raises an Exception (a failing property: the function meets it itself) or would run the
 * user's code (attribute_runs_user_code); an error is left set only for what is not an Exception
 * (KeyboardInterrupt). */
static PyObject *walk_step(PyObject *cur, PyObject *step) {
    PyObject *r;
    if (step_is(step, 'a')) {
        int runs = attribute_runs_user_code(cur, PyTuple_GET_ITEM(step, 1));
        if (runs != 0) {
            if (runs < 0 && PyErr_ExceptionMatches(PyExc_Exception)) PyErr_Clear();
            return NULL;
        }
    }
    if (step_is(step, 'c')) {
        r = PyCell_Check(cur) ? PyCell_GET(cur) : NULL;
        Py_XINCREF(r);
    } else if (step_is(step, 'i')) {
        r = PyObject_GetItem(cur, PyTuple_GET_ITEM(step, 1));
    } else {
        r = PyObject_GetAttr(cur, PyTuple_GET_ITEM(step, 1));
    }
    if (!r && PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_Exception)) PyErr_Clear();
    return r;
}

/* getattr(obj, "__dict__", None) when it is a dict (new reference), else NULL; -1 in *err on error. */
static PyObject *instance_dict(PyObject *obj, int *err) {
    PyObject *d = PyObject_GetAttr(obj, s_dict);
    *err = 0;
    if (!d) {
        if (PyErr_ExceptionMatches(PyExc_AttributeError))
            PyErr_Clear();
        else
            *err = 1;
        return NULL;
    }
    if (!PyDict_Check(d)) Py_CLEAR(d);
    return d;
}

/* Whether obj.name is read from obj's instance __dict__ (no data descriptor on its type): 1, 0, -1. */
static int plain_attribute(PyObject *obj, PyObject *name) {
    int err;
    PyObject *d = instance_dict(obj, &err);
    if (!d) return err ? -1 : 0;
    int in = PyDict_Contains(d, name);
    Py_DECREF(d);
    if (in != 1 || PyType_Check(obj)) return in < 0 ? -1 : 0;
    PyObject *attr = _PyType_Lookup(Py_TYPE(obj), name);
    return !attr || Py_TYPE(attr)->tp_descr_set == NULL;
}

static int mode_of(PyObject *value) {
    if (pykiln_is_tensor(value)) return GUARD_IDENTITY;
    if (value == Py_None || PyBool_Check(value) || PyLong_CheckExact(value) || PyFloat_CheckExact(value) ||
        PyComplex_CheckExact(value) || PyUnicode_CheckExact(value) || PyBytes_CheckExact(value) ||
        PyTuple_CheckExact(value))
        return GUARD_VALUE;
    if (PyCFunction_Check(value) && PyCFunction_GET_SELF(value) && !PyModule_Check(PyCFunction_GET_SELF(value)))
        return GUARD_METHOD; /* made anew at each attribute read, like a bound method */
    return PyMethod_Check(value) ? GUARD_METHOD : GUARD_IDENTITY;
}

/* Whether a snapshot of obj can see nothing a side effect would change. */
static int never_watched(PyGuardRecorder *r, PyObject *obj) {
    /* a class defined in Python is watched (a class attribute written: C.count += 1), a built-in one not */
    int builtin_type = PyType_Check(obj) && !(((PyTypeObject *)obj)->tp_flags & Py_TPFLAGS_HEAPTYPE);
    if (obj == Py_None || PyModule_Check(obj) || PyFunction_Check(obj) || PyCFunction_Check(obj) ||
        PyMethod_Check(obj) || builtin_type || PyCode_Check(obj) || PyWeakref_CheckRef(obj) ||
        PyObject_TypeCheck(obj, &PyRange_Type) || PyUnicode_Check(obj) || PyBytes_Check(obj) || PyLong_Check(obj) ||
        PyFloat_Check(obj) || PyComplex_Check(obj) || PyTuple_Check(obj) || PyFrozenSet_Check(obj) ||
        pykiln_is_tensor(obj))
        return 1;
    int cell = PyObject_IsInstance(obj, r->cell_type);
    if (cell) return cell;
    /* kiln's own objects (a jitted function's cache) and classes */
    PyObject *module = PyObject_GetAttrString(PyType_Check(obj) ? obj : (PyObject *)Py_TYPE(obj), "__module__");
    if (!module) return -1;
    int own = PyUnicode_Check(module) && PyUnicode_Tailmatch(module, s_kiln, 0, 4, -1) == 1 &&
              (PyUnicode_GET_LENGTH(module) == 4 || PyUnicode_READ_CHAR(module, 4) == '.');
    Py_DECREF(module);
    return own;
}

/* Where an iterator stands (new reference): its __reduce__() (a builtin iterator's sequence and index), a
 * generator's frame and instruction, or a new object, never equal to another (no way to tell: next() on it in
 * the captured code would run once). */
static PyObject *iterator_position(PyObject *obj) {
    if (PyGen_Check(obj)) {
        PyObject *frame = PyObject_GetAttrString(obj, "gi_frame");
        if (!frame || frame == Py_None) return frame;
        PyObject *lasti = PyObject_GetAttrString(frame, "f_lasti");
        PyObject *position = lasti ? PyTuple_Pack(2, frame, lasti) : NULL;
        Py_DECREF(frame);
        Py_XDECREF(lasti);
        return position;
    }
    PyObject *reduced = PyObject_CallMethod(obj, "__reduce__", NULL);
    if (reduced || !PyErr_ExceptionMatches(PyExc_Exception)) return reduced;
    PyErr_Clear();
    return PyBaseObject_Type.tp_alloc(&PyBaseObject_Type, 0);
}

/* A shallow copy of what a Python side effect would change in obj, as (kind, contents) (new
 * reference), or None: nothing to watch. */
static PyObject *snapshot(PyGuardRecorder *r, PyObject *obj) {
    int never = never_watched(r, obj);
    if (never) return never < 0 ? NULL : Py_NewRef(Py_None);
    int kind;
    PyObject *contents;
    iternextfunc next = Py_TYPE(obj)->tp_iternext;
    if (next && next != &_PyObject_NextNotImplemented && Py_TYPE(obj)->tp_iter == PyObject_SelfIter) {
        kind = SNAP_ITERATOR, contents = iterator_position(obj);
    } else if (PyList_Check(obj)) {
        kind = SNAP_LIST, contents = PySequence_Tuple(obj);
    } else if (PyDict_Check(obj) || PyAnySet_Check(obj) || PyByteArray_Check(obj)) {
        kind = PyDict_Check(obj) ? SNAP_DICT : PyAnySet_Check(obj) ? SNAP_SET : SNAP_BYTES;
        contents = kind == SNAP_SET ? PyFrozenSet_New(obj) : kind == SNAP_BYTES ? PyBytes_FromObject(obj) : NULL;
        if (kind == SNAP_DICT) {
            PyObject *items = PyMapping_Items(obj);
            contents = items ? PySequence_Tuple(items) : NULL;
            Py_XDECREF(items);
        }
    } else if (PyType_Check(obj)) { /* a class's own attributes (its __dict__ is a read-only proxy) */
        PyObject *d = ((PyTypeObject *)obj)->tp_dict;
        PyObject *items = d ? PyDict_Items(d) : PyList_New(0);
        kind = SNAP_OBJECT, contents = items ? PySequence_Tuple(items) : NULL;
        Py_XDECREF(items);
    } else {
        int err;
        PyObject *d = instance_dict(obj, &err);
        if (!d) return err ? NULL : Py_NewRef(Py_None);
        PyObject *items = PyDict_Items(d);
        Py_DECREF(d);
        kind = SNAP_OBJECT, contents = items ? PySequence_Tuple(items) : NULL;
        Py_XDECREF(items);
    }
    if (!contents) return NULL;
    PyObject *snap = Py_BuildValue("(iO)", kind, contents);
    Py_DECREF(contents);
    return snap;
}

/* 1 when no side effect shows between two snapshots: the same items (lists), keys and values
 * (dicts, objects; values by identity), or equal contents (sets, bytes); -1 on error. */
static int same_snapshot(PyObject *a, PyObject *b) {
    PyObject *ka = PyTuple_GET_ITEM(a, 0), *ca = PyTuple_GET_ITEM(a, 1), *cb = PyTuple_GET_ITEM(b, 1);
    long kind = PyLong_AsLong(ka);
    if (kind != PyLong_AsLong(PyTuple_GET_ITEM(b, 0))) return 0;
    if (kind == SNAP_SET || kind == SNAP_BYTES || kind == SNAP_ITERATOR) return PyObject_RichCompareBool(ca, cb, Py_EQ);
    Py_ssize_t n = PyTuple_GET_SIZE(ca);
    if (n != PyTuple_GET_SIZE(cb)) return 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *x = PyTuple_GET_ITEM(ca, k), *y = PyTuple_GET_ITEM(cb, k);
        if (kind == SNAP_LIST) {
            if (x != y) return 0;
            continue;
        }
        if (!PyTuple_Check(x) || !PyTuple_Check(y) || PyTuple_GET_SIZE(x) != 2 || PyTuple_GET_SIZE(y) != 2 ||
            PyTuple_GET_ITEM(x, 1) != PyTuple_GET_ITEM(y, 1))
            return 0;
        int eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(x, 0), PyTuple_GET_ITEM(y, 0), Py_EQ);
        if (eq != 1) return eq;
    }
    return 1;
}

/* Adds key -> entry unless the key is there. */
static int add_guard(PyGuardRecorder *r, PyObject *root, PyObject *key_step, PyObject *path, PyObject *expected,
                     int mode, PyObject *description) {
    PyObject *key = Py_BuildValue("(nO)", (Py_ssize_t)(uintptr_t)root, key_step);
    if (!key) return -1;
    int in = PyDict_Contains(r->guards, key), rc = in < 0 ? -1 : 0;
    if (in == 0) {
        PyObject *entry = Py_BuildValue("(OOOiO)", root, path, expected, mode, description);
        rc = entry ? PyDict_SetItem(r->guards, key, entry) : -1;
        Py_XDECREF(entry);
    }
    Py_DECREF(key);
    return rc;
}

static int guard_step_mode(PyGuardRecorder *r, PyObject *root, PyObject *step, PyObject *value, int mode,
                           PyObject *description, int guard_contents) {
    PyObject *path = PyTuple_Pack(1, step);
    int rc = path ? add_guard(r, root, step, path, value, mode, description) : -1;
    int array = rc == 0 && guard_contents ? pykiln_is_ndarray(value) : 0;
    if (array < 0) rc = -1;
    /* what the code reads of it (len(), iteration, items, an array's values) may change in place */
    if (rc == 0 && guard_contents && (PyList_CheckExact(value) || PySet_CheckExact(value) || PyDict_CheckExact(value) || array)) {
        PyObject *contents = pykiln_guard_contents(value), *key = contents ? PyTuple_Pack(2, step, s_contents) : NULL;
        PyObject *what = key ? PyUnicode_FromFormat("the contents of %U", description) : NULL;
        rc = what ? add_guard(r, root, key, path, contents, GUARD_CONTENTS, what) : -1;
        Py_XDECREF(contents);
        Py_XDECREF(key);
        Py_XDECREF(what);
    }
    Py_XDECREF(path);
    return rc;
}

static int guard_step_only(PyGuardRecorder *r, PyObject *root, PyObject *step, PyObject *value, PyObject *description,
                           int guard_contents) {
    return guard_step_mode(r, root, step, value, mode_of(value), description, guard_contents);
}

/* How a step that reached `value` from cur is guarded: mode_of(value), except for a tensor an
 * attribute makes anew at each read (a second read gives another object: `w.T`), whose identity
 * would never hold again (every later call recompiled, then ran eagerly): GUARD_VIEW. -1 on error. */
static int step_mode(PyObject *cur, PyObject *step, PyObject *value) {
    if (!step_is(step, 'a') || !pykiln_is_tensor(value)) return mode_of(value);
    PyObject *again = walk_step(cur, step);
    if (!again) return PyErr_Occurred() ? -1 : mode_of(value);
    int mode = again != value && pykiln_is_tensor(again) ? GUARD_VIEW : mode_of(value);
    Py_DECREF(again);
    return mode;
}

/* Guards one item (name) of a Cell's __dict__ with the value it has; format names the cell's type. */
static int guard_cell_item(PyGuardRecorder *r, PyObject *cell, PyObject *name, PyObject *value, const char *format) {
    int err;
    PyObject *d = instance_dict(cell, &err);
    if (!d) return err ? -1 : 0;
    PyObject *step = PyTuple_Pack(2, s_item, name);
    PyObject *what = PyUnicode_FromFormat(format, _PyType_Name(Py_TYPE(cell)));
    int rc = step && what ? guard_step_only(r, d, step, value, what, 1) : -1;
    Py_XDECREF(step);
    Py_XDECREF(what);
    Py_DECREF(d);
    return rc;
}

static int guard_cell_version(PyGuardRecorder *r, PyObject *value) {
    int cell = PyObject_IsInstance(value, r->cell_type), err;
    if (cell != 1) return cell;
    PyObject *d = instance_dict(value, &err);
    if (!d) return err ? -1 : 0;
    PyObject *version = PyDict_GetItemWithError(d, s_kiln_version);
    Py_XINCREF(version);
    Py_DECREF(d);
    int rc = version ? guard_cell_item(r, value, s_kiln_version, version, "the attributes of %s cell")
                     : (PyErr_Occurred() ? -1 : 0);
    Py_XDECREF(version);
    return rc;
}

/* Watches obj for changes; outside: a chain from a global, a closure cell or an argument reached it
 * (an object from before the call, not one the captured code made and passed to a helper). */
static int watch(PyGuardRecorder *r, PyObject *obj, PyObject *description, PyObject *code, int outside) {
    PyObject *id = PyLong_FromVoidPtr(obj);
    if (!id) return -1;
    int in = PyDict_Contains(r->watched, id), rc = in < 0 ? -1 : 0;
    if (in == 0) {
        PyObject *snap = snapshot(r, obj);
        if (!snap) {
            rc = -1;
        } else if (snap != Py_None) {
            PyObject *entry = PyTuple_Pack(4, obj, snap, description, code);
            rc = entry ? PyDict_SetItem(r->watched, id, entry) : -1;
            Py_XDECREF(entry);
        }
        Py_XDECREF(snap);
    }
    /* (only an object the entry holds: its id stays its own while the recorder lives) */
    if (rc == 0 && outside && (in = PyDict_Contains(r->watched, id)) != 0)
        rc = in < 0 || PySet_Add(r->outside, id) < 0 ? -1 : 0;
    Py_DECREF(id);
    return rc;
}

static PyObject *partial_type; /* functools.partial */

static int guard_path(PyGuardRecorder *r, PyObject *root, PyObject *path, PyObject *description, PyObject *code,
                      PyObject *name);

/* A functools.partial the code reached and may call: its function, arguments and keywords (a
 * dict that may change in place: `p.keywords["w"] = 3.0` between calls) are what the call binds,
 * none of them in the call key. */
static int guard_partial(PyGuardRecorder *r, PyObject *p, PyObject *description, PyObject *code) {
    static const char *const parts[] = {"func", "args", "keywords"};
    int rc = 0;
    for (size_t k = 0; rc == 0 && k < sizeof parts / sizeof parts[0]; k++) {
        PyObject *path = Py_BuildValue("((ss))", "attr", parts[k]);
        PyObject *what = path ? PyUnicode_FromFormat("%U.%s", description, parts[k]) : NULL;
        rc = what ? guard_path(r, p, path, what, code, NULL) : -1;
        Py_XDECREF(path);
        Py_XDECREF(what);
    }
    return rc;
}

/* Guards each step of path from root on the object it reaches now: a chain of one-step guards,
 * each rooted at the object the step before reached (whose identity that step guards), so most
 * are items of a dict (a module's globals, an instance's __dict__), which the GuardSet skips
 * while the dict is unchanged. name: the global or free variable the path starts with, or NULL;
 * when the code only calls write-only methods on it (CodeFacts.appended), its contents are not
 * guarded. */
static int guard_path(PyGuardRecorder *r, PyObject *root, PyObject *path, PyObject *description, PyObject *code,
                      PyObject *name) {
    int appended = name && r->appended ? PySequence_Contains(r->appended, name) : 0;
    if (appended < 0) return -1;
    PyObject *cur = Py_NewRef(root), *step_desc = PyUnicode_FromFormat("%U (a step of it)", description);
    int rc = step_desc ? 0 : -1;
    Py_ssize_t n = PyTuple_GET_SIZE(path);
    for (Py_ssize_t k = 0; k < n && rc == 0; k++) {
        PyObject *step = Py_NewRef(PyTuple_GET_ITEM(path, k)), *at = Py_NewRef(cur);
        PyObject *value = walk_step(cur, step);
        int mode = value ? step_mode(cur, step, value) : 0;
        if (!value && !PyErr_Occurred() && step_is(step, 'a')) {
            /* an attribute the object does not have (getattr(cls, "opt", default), hasattr): its
             * absence is what the code read, guarded; a getter written in Python is never run */
            int runs = attribute_runs_user_code(cur, PyTuple_GET_ITEM(step, 1));
            PyObject *what = k == n - 1 ? description : step_desc, *one = runs == 0 ? PyTuple_Pack(1, step) : NULL;
            if (runs < 0 || (runs == 0 && (!one || add_guard(r, cur, step, one, Py_None, GUARD_ABSENT, what) < 0)))
                rc = -1;
            else
                rc = 1;
            Py_XDECREF(one);
        } else if (!value || mode < 0) {
            rc = PyErr_Occurred() ? -1 : 1;
        } else if (step_is(step, 'a')) {
            int plain = plain_attribute(cur, PyTuple_GET_ITEM(step, 1)), err = 0;
            if (plain == 1) { /* guard the item of the instance __dict__ instead */
                Py_SETREF(at, instance_dict(cur, &err));
                Py_SETREF(step, PyTuple_Pack(2, s_item, PyTuple_GET_ITEM(step, 1)));
            }
            if (plain < 0 || err || !at || !step) rc = -1;
        }
        PyObject *what = k == n - 1 ? description : step_desc;
        if (rc == 0 && (guard_step_mode(r, at, step, value, mode, what, !(k == 0 && appended)) < 0 || watch(r, value, what, code, 1) < 0 ||
                        guard_cell_version(r, value) < 0 ||
                        (PyObject_TypeCheck(value, (PyTypeObject *)partial_type) && guard_partial(r, value, what, code) < 0)))
            rc = -1;
        Py_XDECREF(step);
        Py_XDECREF(at);
        if (value) Py_SETREF(cur, value);
    }
    Py_DECREF(cur);
    Py_XDECREF(step_desc);
    return rc < 0 ? -1 : 0;
}

static int guard_global(PyGuardRecorder *r, PyObject *g, PyObject *name, int converted, PyObject *code) {
    if (converted && PyUnicode_Compare(name, s_locals) == 0) return 0; /* added by ast conversion */
    PyObject *step = PyTuple_Pack(2, s_item, name), *path = step ? PyTuple_Pack(1, step) : NULL;
    int in = PyDict_Contains(g, name), rc = -1;
    if (!path || in < 0) goto done;
    if (in) {
        PyObject *what = PyUnicode_FromFormat("global %R", name);
        rc = what ? guard_path(r, g, path, what, code, name) : -1;
        Py_XDECREF(what);
    } else {
        int builtin = PyDict_Contains(builtins, name);
        PyObject *what = builtin == 1 ? PyUnicode_FromFormat("global %R (undefined: the builtin)", name) : NULL;
        rc = builtin < 0 ? -1 : builtin == 0 ? 0 : what ? add_guard(r, g, path, path, Py_None, GUARD_ABSENT, what) : -1;
        Py_XDECREF(what); /* not defined anywhere: a NameError when the code runs */
    }
done:
    Py_XDECREF(step);
    Py_XDECREF(path);
    return rc;
}

/* name -> cell of a function's closure (new dict). */
static PyObject *closure_of(PyObject *func, PyObject *freevars) {
    PyObject *cells = PyDict_New(), *closure = PyFunction_GET_CLOSURE(func);
    for (Py_ssize_t k = 0; cells && closure && k < PyTuple_GET_SIZE(freevars) && k < PyTuple_GET_SIZE(closure); k++)
        if (PyDict_SetItem(cells, PyTuple_GET_ITEM(freevars, k), PyTuple_GET_ITEM(closure, k)) < 0) Py_CLEAR(cells);
    return cells;
}

/* Whether every cell of a closure holds what the frame sees under that name (1, 0, -1). */
static int closure_matches(PyObject *cells, PyObject *seen) {
    Py_ssize_t pos = 0;
    PyObject *name, *cell;
    while (PyDict_Next(cells, &pos, &name, &cell)) {
        PyObject *v = PyDict_GetItemWithError(seen, name);
        if (!v && PyErr_Occurred()) return -1;
        if (v && (!PyCell_Check(cell) || PyCell_GET(cell) != v)) return 0;
    }
    return 1;
}

/* The functions whose code is `code` (a search of the heap). */
static PyObject *functions_with(PyObject *code) {
    PyObject *gc = PyImport_ImportModule("gc");
    PyObject *refs = gc ? PyObject_CallMethod(gc, "get_referrers", "O", code) : NULL;
    PyObject *funcs = refs ? PyList_New(0) : NULL;
    for (Py_ssize_t k = 0; funcs && k < PyList_GET_SIZE(refs); k++) {
        PyObject *f = PyList_GET_ITEM(refs, k);
        if (PyFunction_Check(f) && PyFunction_GET_CODE(f) == code && PyList_Append(funcs, f) < 0) Py_CLEAR(funcs);
    }
    Py_XDECREF(gc);
    Py_XDECREF(refs);
    return funcs;
}

/* The closures (name -> cell) of the functions that may be running code (new list): those whose
 * cells hold what the frame sees (several functions share a code object; all that match are
 * guarded, which can only recompile more). Empty for functions defined while capturing: their
 * free variables are locals of a captured frame, guarded there. */
static PyObject *closures_of(PyGuardRecorder *r, PyObject *code, PyObject *freevars, PyObject *seen) {
    int local = PySet_Contains(r->local_codes, code);
    if (local) return local < 0 ? NULL : PyList_New(0);
    if (PyFunction_Check(r->top) && PyFunction_GET_CODE(r->top) == code) {
        PyObject *cells = closure_of(r->top, freevars);
        PyObject *list = cells ? PyList_New(1) : NULL;
        if (list) PyList_SET_ITEM(list, 0, cells);
        else Py_XDECREF(cells);
        return list;
    }
    if (r->running && PyFunction_Check(r->running) && PyFunction_GET_CODE(r->running) == code) {
        /* the frame's own function: its closure, no search (a search of the heap costs time in
         * proportion to everything alive) */
        PyObject *cells = closure_of(r->running, freevars);
        PyObject *list = cells ? PyList_New(1) : NULL;
        if (list) PyList_SET_ITEM(list, 0, cells);
        else Py_XDECREF(cells);
        return list;
    }
    PyObject *cached = PyDict_GetItemWithError(r->functions_of, code);
    if (!cached && PyErr_Occurred()) return NULL;
    PyObject *closures = NULL;
    /* a cached search may miss a function made since (converted lazily): search again then */
    for (int attempt = cached ? 0 : 1; attempt < 2; attempt++) {
        PyObject *funcs = attempt == 0 ? Py_NewRef(cached) : functions_with(code);
        if (!funcs || (attempt == 1 && PyDict_SetItem(r->functions_of, code, funcs) < 0)) goto fail;
        Py_XSETREF(closures, PyList_New(0));
        PyObject *matching = PyList_New(0);
        for (Py_ssize_t k = 0; closures && matching && k < PyList_GET_SIZE(funcs); k++) {
            PyObject *cells = closure_of(PyList_GET_ITEM(funcs, k), freevars);
            int m = cells ? closure_matches(cells, seen) : -1;
            if (m < 0 || PyList_Append(closures, cells) < 0 || (m && PyList_Append(matching, cells) < 0))
                Py_CLEAR(closures);
            Py_XDECREF(cells);
        }
        Py_DECREF(funcs);
        if (!closures || !matching) {
            Py_XDECREF(matching);
            goto fail;
        }
        if (PyList_GET_SIZE(matching)) {
            Py_DECREF(closures);
            return matching;
        }
        Py_DECREF(matching);
    }
    return closures;
fail:
    Py_XDECREF(closures);
    return NULL;
}

/* "global NAME.a[0]" and the like: what, then each step. */
static PyObject *describe_chain(PyObject *what, PyObject *steps) {
    PyObject *text = Py_NewRef(what);
    for (Py_ssize_t k = 0; text && k < PyTuple_GET_SIZE(steps); k++) {
        PyObject *step = PyTuple_GET_ITEM(steps, k);
        PyObject *more = step_is(step, 'a') ? PyUnicode_FromFormat("%U.%U", text, PyTuple_GET_ITEM(step, 1))
                                            : PyUnicode_FromFormat("%U[%R]", text, PyTuple_GET_ITEM(step, 1));
        Py_SETREF(text, more);
    }
    return text;
}

/* Guards the chains of facts rooted at a global of g, a cell of `cells` or an argument in locals. */
static int guard_chains(PyGuardRecorder *r, PyObject *facts, PyObject *g, PyObject *cells, PyObject *locals,
                        PyObject *code) {
    PyObject *chains = PyObject_GetAttrString(facts, "chains");
    if (!chains) return -1;
    int rc = 0;
    for (Py_ssize_t k = 0; rc == 0 && k < PyTuple_GET_SIZE(chains); k++) {
        PyObject *chain = PyTuple_GET_ITEM(chains, k), *name = PyTuple_GET_ITEM(chain, 1);
        PyObject *steps = PyTuple_GET_ITEM(chain, 2), *root = NULL, *path = NULL, *what = NULL;
        Py_UCS4 kind = PyUnicode_READ_CHAR(PyTuple_GET_ITEM(chain, 0), 0);
        if (kind == 'g') {
            int in = PyDict_Contains(g, name);
            if (in <= 0) {
                rc = in;
                continue;
            }
            PyObject *first = Py_BuildValue("((OO))", s_item, name);
            root = Py_NewRef(g), path = first ? PySequence_Concat(first, steps) : NULL;
            what = PyUnicode_FromFormat("global %U", name);
            Py_XDECREF(first);
        } else if (kind == 'm') { /* a module the code imports (sys.modules): its attributes as a global's */
            root = PyImport_GetModule(name);
            if (!root) {
                rc = PyErr_Occurred() ? -1 : 0;
                continue;
            }
            path = Py_NewRef(steps);
            what = PyUnicode_FromFormat("module %U", name);
        } else if (kind == 'd') {
            root = PyDict_GetItemWithError(cells, name);
            if (!root || PyUnicode_Compare(name, r->rt) == 0) {
                rc = PyErr_Occurred() ? -1 : 0;
                continue;
            }
            Py_INCREF(root);
            path = PySequence_Concat(cell_path, steps);
            what = PyUnicode_FromFormat("closure variable %U", name);
        } else {
            root = locals ? PyDict_GetItemWithError(locals, name) : NULL;
            if (!root || root == Py_None || pykiln_is_tensor(root)) {
                rc = PyErr_Occurred() ? -1 : 0;
                continue;
            }
            Py_INCREF(root);
            PyObject *arg = PyUnicode_FromFormat("argument %R of %U", name, ((PyCodeObject *)code)->co_qualname);
            rc = arg ? watch(r, root, arg, code, 0) : -1;
            Py_XDECREF(arg);
            path = Py_NewRef(steps), what = Py_NewRef(name);
        }
        PyObject *text = what && path && rc == 0 ? describe_chain(what, steps) : NULL;
        rc = text ? guard_path(r, root, path, text, code, kind == 'g' || kind == 'd' ? name : NULL) : -1;
        Py_XDECREF(text);
        Py_XDECREF(root);
        Py_XDECREF(path);
        Py_XDECREF(what);
    }
    Py_DECREF(chains);
    return rc;
}

static int add_effect(PyGuardRecorder *r, PyObject *what, PyObject *filename, PyObject *line) {
    PyObject *e = PyTuple_Pack(3, what, filename, line);
    int rc = e ? PyList_Append(r->effects, e) : -1;
    Py_XDECREF(e);
    return rc;
}

/* Effects and print() calls the code makes, from its facts. */
static int record_effects(PyGuardRecorder *r, PyCodeObject *code, PyObject *facts, PyObject *g, int converted) {
    PyObject *effects = PyObject_GetAttrString(facts, "effects"), *prints = PyObject_GetAttrString(facts, "prints");
    int rc = effects && prints ? 0 : -1;
    for (Py_ssize_t k = 0; rc == 0 && k < PyTuple_GET_SIZE(effects); k++) {
        PyObject *e = PyTuple_GET_ITEM(effects, k);
        rc = add_effect(r, PyTuple_GET_ITEM(e, 0), code->co_filename, PyTuple_GET_ITEM(e, 1));
    }
    int shadowed = rc == 0 && !converted ? PyDict_Contains(g, s_print) : 1; /* converted code prints in the graph */
    for (Py_ssize_t k = 0; shadowed == 0 && rc == 0 && k < PyTuple_GET_SIZE(prints); k++) {
        PyObject *what = PyUnicode_FromString("a print() (it would print only when the graph is captured)");
        rc = what ? add_effect(r, what, code->co_filename, PyTuple_GET_ITEM(prints, k)) : -1;
        Py_XDECREF(what);
    }
    Py_XDECREF(effects);
    Py_XDECREF(prints);
    return shadowed < 0 ? -1 : rc;
}

static int is_converted(PyGuardRecorder *r, PyCodeObject *code) {
    PyObject *free = PyCode_GetFreevars(code), *cellvars = PyCode_GetCellvars(code);
    int c = free && cellvars ? PySequence_Contains(free, r->rt) : -1;
    if (c == 0) c = PySequence_Contains(cellvars, r->rt);
    Py_XDECREF(free);
    Py_XDECREF(cellvars);
    return c;
}

static int guard_closures(PyGuardRecorder *r, PyObject *facts, PyCodeObject *code, PyObject *g, PyObject *locals) {
    PyObject *freevars = PyObject_GetAttrString(facts, "freevars");
    PyObject *co_freevars = PyCode_GetFreevars(code);
    PyObject *closures = freevars && co_freevars && PyTuple_GET_SIZE(freevars)
                             ? closures_of(r, (PyObject *)code, co_freevars, locals)
                             : PyList_New(0);
    int rc = closures ? 0 : -1;
    for (Py_ssize_t c = 0; rc == 0 && c < PyList_GET_SIZE(closures); c++) {
        PyObject *cells = PyList_GET_ITEM(closures, c);
        for (Py_ssize_t k = 0; rc == 0 && k < PyTuple_GET_SIZE(freevars); k++) {
            PyObject *name = PyTuple_GET_ITEM(freevars, k), *cell = PyDict_GetItemWithError(cells, name);
            if (!cell || PyUnicode_Compare(name, r->rt) == 0) { /* (RT: the ast runtime, kiln's own) */
                rc = PyErr_Occurred() ? -1 : 0;
                continue;
            }
            PyObject *what = PyUnicode_FromFormat("closure variable %R of %U", name, code->co_qualname);
            rc = what ? guard_path(r, cell, cell_path, what, (PyObject *)code, name) : -1;
            Py_XDECREF(what);
        }
        if (rc == 0) rc = guard_chains(r, facts, g, cells, locals, (PyObject *)code);
    }
    if (rc == 0 && closures && PyList_GET_SIZE(closures) == 0) {
        PyObject *none = PyDict_New();
        rc = none ? guard_chains(r, facts, g, none, locals, (PyObject *)code) : -1;
        Py_XDECREF(none);
    }
    Py_XDECREF(freevars);
    Py_XDECREF(co_freevars);
    Py_XDECREF(closures);
    return rc;
}

/* Guards the defaults of `running` that the frame got (its local of that name is the default
 * object): a default is state the call key does not hold (`f.__defaults__ = (5.0,)` between calls),
 * and len(), iteration or `in` read a list, dict or set default's contents without an attribute
 * chain to guard. Each is guarded as the path running.__defaults__[i] (or .__kwdefaults__[name]),
 * contents included; `running` is the function the user wrote (an ast-converted function's
 * original, whose defaults the converted one takes at each capture). */
static int guard_default(PyGuardRecorder *r, PyObject *running, PyObject *where, PyObject *key, PyObject *name,
                         PyObject *value, PyObject *locals, PyObject *code) {
    PyObject *local = name ? PyDict_GetItemWithError(locals, name) : NULL;
    if (!local) return PyErr_Occurred() ? -1 : 0;
    if (local != value) return 0;
    PyObject *path = Py_BuildValue("((OO)(OO))", s_attr, where, s_item, key);
    PyObject *what = path ? PyUnicode_FromFormat("the default of parameter %R of %U", name,
                                                 ((PyCodeObject *)code)->co_qualname)
                          : NULL;
    int rc = what ? guard_path(r, running, path, what, code, NULL) : -1;
    Py_XDECREF(path);
    Py_XDECREF(what);
    return rc;
}

static int guard_defaults(PyGuardRecorder *r, PyObject *running, PyCodeObject *code, PyObject *locals) {
    if (!running || !PyFunction_Check(running) || PyFunction_GET_CODE(running) != (PyObject *)code) return 0;
    int err;
    PyObject *fdict = instance_dict(running, &err);
    if (err) return -1;
    PyObject *original = fdict ? PyDict_GetItemWithError(fdict, s_kiln_original) : NULL;
    Py_XDECREF(fdict); /* (the function's own dict keeps original alive) */
    if (!original && PyErr_Occurred()) return -1;
    if (original && PyFunction_Check(original)) running = original; /* (the converted one's defaults follow it) */
    PyObject *defaults = PyFunction_GET_DEFAULTS(running), *kwdefaults = PyFunction_GET_KW_DEFAULTS(running);
    PyObject *names = PyCode_GetVarnames(code);
    int rc = names ? 0 : -1;
    Py_ssize_t n = defaults ? PyTuple_GET_SIZE(defaults) : 0, first = code->co_argcount - n;
    for (Py_ssize_t k = 0; rc == 0 && k < n && first + k >= 0 && first + k < PyTuple_GET_SIZE(names); k++) {
        PyObject *key = PyLong_FromSsize_t(k);
        rc = key ? guard_default(r, running, s_defaults, key, PyTuple_GET_ITEM(names, first + k),
                                 PyTuple_GET_ITEM(defaults, k), locals, (PyObject *)code)
                 : -1;
        Py_XDECREF(key);
    }
    Py_ssize_t pos = 0;
    PyObject *name, *value;
    while (rc == 0 && kwdefaults && PyDict_Check(kwdefaults) && PyDict_Next(kwdefaults, &pos, &name, &value))
        rc = guard_default(r, running, s_kwdefaults, name, name, value, locals, (PyObject *)code);
    Py_XDECREF(names);
    return rc;
}

/* What code, starting with globals g and locals (a dict), reads and writes (steals code, g and
 * locals); only its instructions at the offsets in the set `executed` when not NULL. */
static PyObject *record_code(PyGuardRecorder *r, PyCodeObject *code, PyObject *g, PyObject *locals,
                             PyObject *executed, PyObject *running) {
    PyObject *user = PyObject_CallOneArg(r->is_user_code, (PyObject *)code);
    int is_user = user ? PyObject_IsTrue(user) : -1, rc = -1;
    PyObject *facts = NULL, *nested = NULL, *appended = NULL;
    Py_XDECREF(user);
    if (is_user <= 0) goto done;
    facts = executed ? pykiln_code_facts_executed((PyObject *)code, executed) : pykiln_code_facts((PyObject *)code);
    nested = facts ? PyObject_GetAttrString(facts, "nested") : NULL;
    appended = facts ? PyObject_GetAttrString(facts, "appended") : NULL;
    r->appended = appended;
    r->running = running;
    int converted = is_converted(r, code);
    if (!nested || !appended || !g || !locals || converted < 0 || _PySet_Update(r->local_codes, nested) < 0 ||
        record_effects(r, code, facts, g, converted) < 0)
        goto done;
    PyObject *globals = PyObject_GetAttrString(facts, "globals");
    rc = globals ? 0 : -1;
    for (Py_ssize_t k = 0; rc == 0 && k < PyTuple_GET_SIZE(globals); k++)
        rc = guard_global(r, g, PyTuple_GET_ITEM(globals, k), converted, (PyObject *)code);
    Py_XDECREF(globals);
    if (rc == 0) rc = guard_closures(r, facts, code, g, locals);
    if (rc == 0) rc = guard_defaults(r, running, code, locals);
done:
    r->appended = NULL;
    r->running = NULL;
    Py_XDECREF(appended);
    Py_DECREF(code);
    Py_XDECREF(facts);
    Py_XDECREF(nested);
    Py_XDECREF(g);
    Py_XDECREF(locals);
    if (is_user < 0 || rc < 0) return is_user == 0 ? Py_NewRef(Py_None) : NULL;
    Py_RETURN_NONE;
}

/* on_call(frame): records what a frame of user code reads and writes, as it starts. */
static PyObject *recorder_on_call(PyObject *self, PyObject *frame) {
    if (!PyFrame_Check(frame)) return PyErr_Format(PyExc_TypeError, "on_call: expected a frame");
    return record_code((PyGuardRecorder *)self, PyFrame_GetCode((PyFrameObject *)frame),
                       PyFrame_GetGlobals((PyFrameObject *)frame), PyFrame_GetLocals((PyFrameObject *)frame), NULL,
                       pykiln_frame_function((PyFrameObject *)frame));
}

/* on_code(code, globals, locals, executed=None): on_call for code that bytecode capture
 * interprets (no frame), from the locals the interpreted part started with; executed: the set of
 * offsets it ran (None: all of the code). */
static PyObject *recorder_on_code(PyObject *self, PyObject *args) {
    PyObject *code, *g, *locals, *executed = Py_None, *running = Py_None;
    if (!PyArg_ParseTuple(args, "O!O!O!|OO:on_code", &PyCode_Type, &code, &PyDict_Type, &g, &PyDict_Type, &locals,
                          &executed, &running))
        return NULL;
    if (executed != Py_None && !PyAnySet_Check(executed))
        return PyErr_Format(PyExc_TypeError, "on_code: executed must be a set of offsets or None");
    return record_code((PyGuardRecorder *)self, (PyCodeObject *)Py_NewRef(code), Py_NewRef(g), Py_NewRef(locals),
                       executed == Py_None ? NULL : executed, PyFunction_Check(running) ? running : NULL);
}

/* add_cells(cells): guards the training mode and state version of each Cell the capture called. */
static PyObject *recorder_add_cells(PyObject *self, PyObject *cells) {
    PyGuardRecorder *r = (PyGuardRecorder *)self;
    PyObject *seq = PySequence_Fast(cells, "add_cells: expected a sequence of cells");
    int rc = seq ? 0 : -1;
    for (Py_ssize_t k = 0; rc == 0 && k < PySequence_Fast_GET_SIZE(seq); k++) {
        PyObject *c = PySequence_Fast_GET_ITEM(seq, k), *training = NULL;
        rc = guard_cell_version(r, c);
        if (rc == 0) training = PyObject_GetAttr(c, s_training);
        rc = training ? guard_cell_item(r, c, s_training, training, "the training mode of %s cell") : -1;
        Py_XDECREF(training);
    }
    Py_XDECREF(seq);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

/* add_tensors(tensors): guard whether each tensor the graph read from outside (a parameter, a
 * closure's tensor) requires grad: freezing or unfreezing one changes which gradients a graph
 * computes and whether its outputs carry history. */
static PyObject *recorder_add_tensors(PyObject *self, PyObject *tensors) {
    PyGuardRecorder *r = (PyGuardRecorder *)self;
    PyObject *seq = PySequence_Fast(tensors, "add_tensors: expected a sequence of tensors");
    PyObject *path = seq ? PyTuple_New(0) : NULL, *key = path ? PyUnicode_FromString("requires_grad") : NULL;
    PyObject *what =
        key ? PyUnicode_FromString("requires_grad of a tensor read from outside (a parameter, a closure's tensor)") : NULL;
    int rc = what ? 0 : -1;
    for (Py_ssize_t k = 0; rc == 0 && k < PySequence_Fast_GET_SIZE(seq); k++) {
        PyObject *t = PySequence_Fast_GET_ITEM(seq, k);
        if (!pykiln_is_tensor(t)) continue;
        rc = add_guard(r, t, key, path, pykiln_unwrap(t)->requires_grad ? Py_True : Py_False, GUARD_REQUIRES_GRAD,
                       what);
    }
    Py_XDECREF(what);
    Py_XDECREF(key);
    Py_XDECREF(path);
    Py_XDECREF(seq);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

/* add_value(root, key, value, description): guard that root[key] (root a dict) still equals value
 * (kiln.grad_hooks: the backward hooks on tensors, for a graph whose capture ran a backward pass). */
static PyObject *recorder_add_value(PyObject *self, PyObject *args) {
    PyObject *root, *key, *value, *what;
    if (!PyArg_ParseTuple(args, "O!OOU:add_value", &PyDict_Type, &root, &key, &value, &what)) return NULL;
    PyObject *step = PyTuple_Pack(2, s_item, key);
    PyObject *path = step ? PyTuple_Pack(1, step) : NULL;
    int rc = path ? add_guard((PyGuardRecorder *)self, root, step, path, value, GUARD_VALUE, what) : -1;
    Py_XDECREF(path);
    Py_XDECREF(step);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

/* add_contents(root, key, description): guard that the dict root holds the same object at key, and
 * (a list, dict or set) the same contents: Python state kiln's own code reads while capturing, which
 * on_call does not follow (kiln.jit.replay.read_by_kiln). */
static PyObject *recorder_add_contents(PyObject *self, PyObject *args) {
    PyObject *root, *key, *what;
    if (!PyArg_ParseTuple(args, "O!OU:add_contents", &PyDict_Type, &root, &key, &what)) return NULL;
    PyObject *value = PyDict_GetItemWithError(root, key);
    if (!value) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_KeyError, "add_contents: %R is not in the dict", key);
        return NULL;
    }
    Py_INCREF(value);
    PyObject *step = PyTuple_Pack(2, s_item, key);
    int rc = step ? guard_step_mode((PyGuardRecorder *)self, root, step, value, GUARD_IDENTITY, what, 1) : -1;
    Py_XDECREF(step);
    Py_DECREF(value);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

/* add_version(tensor, version, description): guard that tensor's storage still has version (no
 * in-place write since a capture read its value). */
static PyObject *recorder_add_version(PyObject *self, PyObject *args) {
    PyObject *t, *version, *what;
    if (!PyArg_ParseTuple(args, "OO!U:add_version", &t, &PyLong_Type, &version, &what)) return NULL;
    if (!pykiln_is_tensor(t)) return PyErr_Format(PyExc_TypeError, "add_version: expected a tensor");
    PyObject *key = PyUnicode_FromString("version"), *path = key ? PyTuple_New(0) : NULL;
    int rc = path ? add_guard((PyGuardRecorder *)self, t, key, path, version, GUARD_VERSION, what) : -1;
    Py_XDECREF(path);
    Py_XDECREF(key);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *side_effect_of_write(PyGuardRecorder *r, PyObject *write) {
    PyObject *cell, *name, *loc;
    if (!PyArg_ParseTuple(write, "OOU:side_effect", &cell, &name, &loc)) return NULL;
    PyObject *parts = PyUnicode_RPartition(loc, s_colon);
    if (!parts) return NULL;
    PyObject *line = PyTuple_GET_ITEM(parts, 2);
    int digits = PyUnicode_GET_LENGTH(line) > 0;
    for (Py_ssize_t k = 0; digits && k < PyUnicode_GET_LENGTH(line); k++)
        digits = Py_UNICODE_ISDIGIT(PyUnicode_READ_CHAR(line, k));
    PyObject *n = digits ? PyLong_FromUnicodeObject(line, 10) : PyLong_FromLong(0);
    PyObject *e = n ? PyObject_CallFunction(r->side_effect, "NOO", PyUnicode_FromFormat(
                                                "an assignment to attribute %R of a %s cell", name,
                                                _PyType_Name(Py_TYPE(cell))),
                                            PyTuple_GET_ITEM(parts, 0), n)
                    : NULL;
    Py_XDECREF(n);
    Py_DECREF(parts);
    return e;
}

/* reached_outside(obj) -> bool: whether the capture reached obj through a chain from a global, a
 * closure cell or an argument (an object from before the call: returning it, a compiled call would
 * return a copy), not only as an argument a helper was given. */
static PyObject *recorder_reached_outside(PyObject *self, PyObject *obj) {
    PyGuardRecorder *r = (PyGuardRecorder *)self;
    PyObject *id = PyLong_FromVoidPtr(obj);
    if (!id) return NULL;
    int in = PySet_Contains(r->outside, id);
    Py_DECREF(id);
    if (in < 0) return NULL;
    return PyBool_FromLong(in);
}

/* side_effect(cell_writes): the first Python side effect of the capture (a SideEffect), or None. */
static PyObject *recorder_side_effect(PyObject *self, PyObject *cell_writes) {
    PyGuardRecorder *r = (PyGuardRecorder *)self;
    if (PyList_GET_SIZE(r->effects)) return PyObject_CallObject(r->side_effect, PyList_GET_ITEM(r->effects, 0));
    PyObject *seq = PySequence_Fast(cell_writes, "side_effect: expected a sequence of cell writes");
    if (!seq) return NULL;
    PyObject *e = PySequence_Fast_GET_SIZE(seq) ? side_effect_of_write(r, PySequence_Fast_GET_ITEM(seq, 0))
                                                : Py_NewRef(Py_None);
    Py_DECREF(seq);
    Py_ssize_t pos = 0;
    PyObject *id, *w;
    while (e == Py_None && PyDict_Next(r->watched, &pos, &id, &w)) {
        PyObject *obj = PyTuple_GET_ITEM(w, 0), *code = PyTuple_GET_ITEM(w, 3), *now = snapshot(r, obj);
        int same = !now ? -1 : now == Py_None ? 1 : same_snapshot(PyTuple_GET_ITEM(w, 1), now);
        Py_XDECREF(now);
        if (same) {
            if (same < 0) Py_CLEAR(e);
            continue;
        }
        PyObject *facts = pykiln_code_facts(code), *mutations = facts ? PyObject_GetAttrString(facts, "mutations") : NULL;
        PyObject *what = PyUnicode_FromFormat("a change of %U (a %s)", PyTuple_GET_ITEM(w, 2), _PyType_Name(Py_TYPE(obj)));
        PyCodeObject *co = (PyCodeObject *)code;
        Py_CLEAR(e);
        if (mutations && what && PyTuple_GET_SIZE(mutations)) {
            PyObject *m = PyTuple_GET_ITEM(mutations, 0);
            e = PyObject_CallFunction(r->side_effect, "NOO", PyUnicode_FromFormat("%U: %U", what, PyTuple_GET_ITEM(m, 0)),
                                      co->co_filename, PyTuple_GET_ITEM(m, 1));
        } else if (mutations && what) {
            e = PyObject_CallFunction(r->side_effect, "OOi", what, co->co_filename, co->co_firstlineno);
        }
        Py_XDECREF(facts);
        Py_XDECREF(mutations);
        Py_XDECREF(what);
        break;
    }
    return e;
}

/* Whether guard entry g is kept (1, 0, -1): a contents guard is dropped when the capture itself changed the
 * container (a change at a graph break, run in Python at each call: the next call finds it changed again). */
static int contents_kept(PyObject *g) {
    if (PyLong_AsLong(PyTuple_GET_ITEM(g, 3)) != GUARD_CONTENTS) return 1;
    PyObject *v = walk_step(PyTuple_GET_ITEM(g, 0), PyTuple_GET_ITEM(PyTuple_GET_ITEM(g, 1), 0));
    if (!v) {
        if (!PyErr_Occurred()) return 0;
        PyErr_Clear();
        return 0;
    }
    PyObject *now = pykiln_guard_contents(v), *expected = PyTuple_GET_ITEM(g, 2);
    int array = now ? pykiln_is_ndarray(v) : 0; /* (its contents: values, not objects) */
    Py_DECREF(v);
    if (!now || array < 0) {
        Py_XDECREF(now);
        return -1;
    }
    int same = PyObject_RichCompareBool(now, expected, Py_EQ);
    if (same == 1 && !PyFrozenSet_Check(now) && !array) { /* (items the same objects, as the guard compares them) */
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(now); k++)
            if (PyTuple_GET_ITEM(now, k) != PyTuple_GET_ITEM(expected, k) && !PyTuple_Check(PyTuple_GET_ITEM(now, k)))
                same = 0;
    }
    Py_DECREF(now);
    return same < 0 ? (PyErr_Clear(), 0) : same;
}

/* forget_contents(obj): drops the contents guards on obj (None: on every container), which the captured code
 * changes itself (at a graph break, in Python at each call). */
static PyObject *recorder_forget_contents(PyObject *self, PyObject *obj) {
    PyGuardRecorder *r = (PyGuardRecorder *)self;
    PyObject *drop = PyList_New(0), *key, *g;
    Py_ssize_t pos = 0;
    while (drop && PyDict_Next(r->guards, &pos, &key, &g)) {
        if (PyLong_AsLong(PyTuple_GET_ITEM(g, 3)) != GUARD_CONTENTS) continue;
        PyObject *v = walk_step(PyTuple_GET_ITEM(g, 0), PyTuple_GET_ITEM(PyTuple_GET_ITEM(g, 1), 0));
        if (!v) PyErr_Clear();
        if ((obj == Py_None || v == obj) && PyList_Append(drop, key) < 0) Py_CLEAR(drop);
        Py_XDECREF(v);
    }
    for (Py_ssize_t k = 0; drop && k < PyList_GET_SIZE(drop); k++)
        if (PyDict_DelItem(r->guards, PyList_GET_ITEM(drop, k)) < 0) Py_CLEAR(drop);
    if (!drop) return NULL;
    Py_DECREF(drop);
    Py_RETURN_NONE;
}

/* guard_specs(): ([(root, path, expected, mode) of each guard recorded], [the description of each]). */
static PyObject *recorder_guard_specs(PyObject *self, PyObject *unused) {
    (void)unused;
    PyGuardRecorder *r = (PyGuardRecorder *)self;
    PyObject *specs = PyList_New(0), *names = PyList_New(0), *result = NULL;
    Py_ssize_t pos = 0;
    PyObject *key, *g;
    while (specs && names && PyDict_Next(r->guards, &pos, &key, &g)) {
        int kept = contents_kept(g);
        if (kept <= 0) {
            if (kept < 0) Py_CLEAR(specs);
            continue;
        }
        PyObject *spec = PyTuple_GetSlice(g, 0, 4);
        if (!spec || PyList_Append(specs, spec) < 0 || PyList_Append(names, PyTuple_GET_ITEM(g, 4)) < 0)
            Py_CLEAR(specs);
        Py_XDECREF(spec);
    }
    if (specs && names) result = PyTuple_Pack(2, specs, names);
    Py_XDECREF(specs);
    Py_XDECREF(names);
    return result;
}

/* guard_set(): (the GuardSet of the guards recorded, the description of each). */
static PyObject *recorder_guard_set(PyObject *self, PyObject *unused) {
    PyObject *specs = recorder_guard_specs(self, unused), *result = NULL;
    if (!specs) return NULL;
    PyObject *set = pykiln_guardset_new(PyTuple_GET_ITEM(specs, 0));
    if (set) result = PyTuple_Pack(2, set, PyTuple_GET_ITEM(specs, 1));
    Py_XDECREF(set);
    Py_DECREF(specs);
    return result;
}

static int recorder_init(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"top", "is_user_code", "rt", "cell_type", "side_effect", NULL};
    PyGuardRecorder *r = (PyGuardRecorder *)self;
    PyObject *top, *is_user_code, *rt, *cell_type, *side_effect;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOUOO:GuardRecorder", kwlist, &top, &is_user_code, &rt,
                                     &cell_type, &side_effect))
        return -1;
    Py_XSETREF(r->top, Py_NewRef(top));
    Py_XSETREF(r->is_user_code, Py_NewRef(is_user_code));
    Py_XSETREF(r->rt, Py_NewRef(rt));
    Py_XSETREF(r->cell_type, Py_NewRef(cell_type));
    Py_XSETREF(r->side_effect, Py_NewRef(side_effect));
    Py_XSETREF(r->guards, PyDict_New());
    Py_XSETREF(r->watched, PyDict_New());
    Py_XSETREF(r->outside, PySet_New(NULL));
    Py_XSETREF(r->effects, PyList_New(0));
    Py_XSETREF(r->local_codes, PySet_New(NULL));
    Py_XSETREF(r->functions_of, PyDict_New());
    return r->guards && r->watched && r->outside && r->effects && r->local_codes && r->functions_of ? 0 : -1;
}

static int recorder_traverse(PyObject *self, visitproc visit, void *arg) {
    PyGuardRecorder *r = (PyGuardRecorder *)self;
    Py_VISIT(r->top);
    Py_VISIT(r->is_user_code);
    Py_VISIT(r->rt);
    Py_VISIT(r->cell_type);
    Py_VISIT(r->side_effect);
    Py_VISIT(r->guards);
    Py_VISIT(r->watched);
    Py_VISIT(r->outside);
    Py_VISIT(r->effects);
    Py_VISIT(r->local_codes);
    Py_VISIT(r->functions_of);
    return 0;
}

static int recorder_clear(PyObject *self) {
    PyGuardRecorder *r = (PyGuardRecorder *)self;
    Py_CLEAR(r->top);
    Py_CLEAR(r->is_user_code);
    Py_CLEAR(r->rt);
    Py_CLEAR(r->cell_type);
    Py_CLEAR(r->side_effect);
    Py_CLEAR(r->guards);
    Py_CLEAR(r->watched);
    Py_CLEAR(r->outside);
    Py_CLEAR(r->effects);
    Py_CLEAR(r->local_codes);
    Py_CLEAR(r->functions_of);
    return 0;
}

static void recorder_dealloc(PyObject *self) {
    PyObject_GC_UnTrack(self);
    recorder_clear(self);
    Py_TYPE(self)->tp_free(self);
}

static PyObject *get_count(PyObject *self, void *which) {
    PyGuardRecorder *r = (PyGuardRecorder *)self;
    PyObject *d = which ? r->watched : r->guards;
    return PyLong_FromSsize_t(d ? PyDict_Size(d) : 0);
}

static PyMethodDef recorder_methods[] = {
    {"on_call", recorder_on_call, METH_O, "on_call(frame): record what a starting frame of user code reads and writes"},
    {"on_code", recorder_on_code, METH_VARARGS,
     "on_code(code, globals, locals, executed=None, function=None): on_call for code interpreted without a "
     "frame, only the instructions at the offsets in executed (bytecode capture), run by function"},
    {"add_cells", recorder_add_cells, METH_O, "add_cells(cells): guard the training mode and version of each Cell"},
    {"add_version", recorder_add_version, METH_VARARGS,
     "add_version(tensor, version, description): guard that no in-place write changed the tensor since"},
    {"add_value", recorder_add_value, METH_VARARGS,
     "add_value(root, key, value, description): guard that the dict root holds value at key"},
    {"add_contents", recorder_add_contents, METH_VARARGS,
     "add_contents(root, key, description): guard that the dict root holds the same object at key, with the "
     "same contents"},
    {"add_tensors", recorder_add_tensors, METH_O,
     "add_tensors(tensors): guard whether each tensor read from outside requires grad"},
    {"side_effect", recorder_side_effect, METH_O,
     "side_effect(cell_writes) -> the first Python side effect of the capture (SideEffect), or None"},
    {"reached_outside", recorder_reached_outside, METH_O,
     "reached_outside(obj) -> whether the capture reached obj from a global, a closure or an argument's attributes"},
    {"guard_set", recorder_guard_set, METH_NOARGS, "guard_set() -> (GuardSet, description of each guard)"},
    {"forget_contents", recorder_forget_contents, METH_O,
     "forget_contents(obj) -> None: drops the guards on obj's contents (the captured code changes them)"},
    {"guard_specs", recorder_guard_specs, METH_NOARGS,
     "guard_specs() -> ([(root, path, expected, mode) of each guard], description of each)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef recorder_getset[] = {
    {"guard_count", get_count, NULL, "how many guards are recorded", NULL},
    {"watched_count", get_count, NULL, "how many containers and objects are watched for changes", (void *)1},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PyGuardRecorder_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln._C.GuardRecorder",
    .tp_basicsize = sizeof(PyGuardRecorder),
    .tp_dealloc = recorder_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "GuardRecorder(top, is_user_code, rt, cell_type, side_effect): the guards and Python side effects "
              "of one capture.",
    .tp_traverse = recorder_traverse,
    .tp_clear = recorder_clear,
    .tp_methods = recorder_methods,
    .tp_getset = recorder_getset,
    .tp_init = recorder_init,
    .tp_new = PyType_GenericNew,
};

int pykiln_guard_recorder_init_type(PyObject *module) {
    if (!(s_kiln_original = PyUnicode_InternFromString("__kiln_original__")) ||
        !(s_defaults = PyUnicode_InternFromString("__defaults__")) ||
        !(s_kwdefaults = PyUnicode_InternFromString("__kwdefaults__")) ||
        !(s_attr = PyUnicode_InternFromString("attr")) || !(s_kiln = PyUnicode_InternFromString("kiln")) ||
        !(s_getattribute = PyUnicode_InternFromString("__getattribute__")) ||
        !(s_getattr = PyUnicode_InternFromString("__getattr__")) || !(s_get = PyUnicode_InternFromString("__get__")) ||
        !(s_colon = PyUnicode_InternFromString(":")) || !(s_item = PyUnicode_InternFromString("item")) ||
        !(s_contents = PyUnicode_InternFromString("contents")) ||
        !(cell_path = Py_BuildValue("((s))", "cell")) ||
        !(s_kiln_version = PyUnicode_InternFromString("_kiln_version")) ||
        !(s_training = PyUnicode_InternFromString("training")) || !(s_dict = PyUnicode_InternFromString("__dict__")) ||
        !(s_print = PyUnicode_InternFromString("print")) || !(s_locals = PyUnicode_InternFromString("locals")))
        return -1;
    PyObject *module_builtins = PyImport_ImportModule("builtins");
    if (!module_builtins) return -1;
    builtins = Py_NewRef(PyModule_GetDict(module_builtins));
    Py_DECREF(module_builtins);
    PyObject *functools = PyImport_ImportModule("functools");
    partial_type = functools ? PyObject_GetAttrString(functools, "partial") : NULL;
    Py_XDECREF(functools);
    if (!partial_type || !PyType_Check(partial_type)) return -1;
    if (PyType_Ready(&PyGuardRecorder_Type) < 0) return -1;
    Py_INCREF(&PyGuardRecorder_Type);
    return PyModule_AddObject(module, "GuardRecorder", (PyObject *)&PyGuardRecorder_Type);
}
