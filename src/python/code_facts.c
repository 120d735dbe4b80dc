/* kiln._C.code_facts(code): what one code object reads and writes, from its bytecode — the
 * globals it loads, the closure variables it reads, the attribute and constant-subscript chains
 * rooted at a global, a closure variable or a parameter (`self.scale`, `cfg.alpha`, `TABLE[0]`),
 * its writes to globals and closure variables, the lines that load print, and the statements
 * that may change a container or an object (`.append(...)`, `x.a = 1`, `x[k] = v`).
 *
 * The scanner is table driven: pykiln_decode turns the bytecode into instructions (EXTENDED_ARG
 * folded into the argument, 3.11's inline CACHE entries skipped, each with the name or constant
 * its argument designates and its source line), and one table says what each opcode means to
 * the analysis. Kiln's guard recorder (guard_recorder.c) reads the facts; bytecode capture can
 * decode with the same function. CPython 3.11 only: the opcodes and their arguments change with
 * every version, so other versions get a clear error instead of a wrong answer.
 *
 * Facts are computed once per code object and kept in the code object's co_extra slot, released
 * with the code object. Reference notes: CodeFacts owns its tuples; decoded names are borrowed
 * from the code object. */
#include "pykiln.h"

#include <opcode.h>
#include <structmember.h>

#define KILN_BYTECODE_SUPPORTED (PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000)

typedef struct {
    PyObject_HEAD
    PyObject *globals;   /* names loaded with LOAD_GLOBAL / LOAD_NAME, first use first */
    PyObject *freevars;  /* free variables read (LOAD_DEREF / LOAD_CLASSDEREF / LOAD_CLOSURE) */
    PyObject *chains;    /* (root kind "global" | "deref" | "fast" | "module", root name, steps) */
    PyObject *effects;   /* (what, line): writes to globals and closure variables */
    PyObject *prints;    /* lines that load the name print */
    PyObject *mutations; /* (what, line): statements that may change a container or an object */
    PyObject *nested;    /* the code objects among the constants */
    PyObject *appended;  /* globals and free variables only ever loaded to call a write-only method on */
} PyCodeFacts;

static PyMemberDef codefacts_members[] = {
    {"globals", T_OBJECT_EX, offsetof(PyCodeFacts, globals), READONLY, "globals loaded, in order of first use"},
    {"freevars", T_OBJECT_EX, offsetof(PyCodeFacts, freevars), READONLY, "free (closure) variables read"},
    {"chains", T_OBJECT_EX, offsetof(PyCodeFacts, chains), READONLY,
     "(root kind, root name, steps): attribute and constant-subscript chains read"},
    {"effects", T_OBJECT_EX, offsetof(PyCodeFacts, effects), READONLY,
     "(what, line): writes to globals and closure variables"},
    {"prints", T_OBJECT_EX, offsetof(PyCodeFacts, prints), READONLY, "lines that load print"},
    {"mutations", T_OBJECT_EX, offsetof(PyCodeFacts, mutations), READONLY,
     "(what, line): statements that may change a container or an object"},
    {"nested", T_OBJECT_EX, offsetof(PyCodeFacts, nested), READONLY, "code objects among the constants"},
    {"appended", T_OBJECT_EX, offsetof(PyCodeFacts, appended), READONLY,
     "globals and free variables every load of which calls a write-only method on it (LOG.append(x)): their "
     "contents are not read"},
    {NULL, 0, 0, 0, NULL},
};

static void codefacts_dealloc(PyObject *self) {
    PyCodeFacts *f = (PyCodeFacts *)self;
    Py_XDECREF(f->globals);
    Py_XDECREF(f->freevars);
    Py_XDECREF(f->chains);
    Py_XDECREF(f->appended);
    Py_XDECREF(f->effects);
    Py_XDECREF(f->prints);
    Py_XDECREF(f->mutations);
    Py_XDECREF(f->nested);
    Py_TYPE(self)->tp_free(self);
}

static PyTypeObject PyCodeFacts_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln._C.CodeFacts",
    .tp_basicsize = sizeof(PyCodeFacts),
    .tp_dealloc = codefacts_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "What one code object reads and writes, from its bytecode (kiln._C.code_facts(code)).",
    .tp_members = codefacts_members,
};

/* Method names that change a list, dict, set or object in place. */
static const char *const mutators[] = {
    "append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse", "update", "setdefault", "popitem",
    "add", "discard", "difference_update", "intersection_update", "symmetric_difference_update", "__setitem__",
    "__delitem__", "__iadd__",
};

#if KILN_BYTECODE_SUPPORTED

/* What an opcode means to the analysis, and where its argument's name comes from. */
enum action {
    ACT_NONE,
    ACT_READ_GLOBAL,  /* a chain root; a global read */
    ACT_READ_DEREF,   /* a chain root when free; a closure read */
    ACT_READ_CLOSURE, /* a closure read (passed on to a nested function), not a chain root */
    ACT_READ_FAST,    /* a chain root when a parameter never assigned */
    ACT_WRITE_FAST,
    ACT_WRITE_GLOBAL,
    ACT_WRITE_DEREF,
    ACT_ATTR,   /* a chain step */
    ACT_METHOD, /* a chain's last step */
    ACT_WRITE_ATTR,
    ACT_WRITE_SUBSCR,
    ACT_CONST,  /* a chain step when a BINARY_SUBSCR follows */
    ACT_SUBSCR, /* BINARY_SUBSCR */
};
enum name_source { NAME_NONE, NAME_NAMES, NAME_GLOBAL, NAME_LOCALSPLUS, NAME_CONST };

static const struct {
    int op;
    enum action act;
    enum name_source src;
} opcode_table[] = {
    {LOAD_GLOBAL, ACT_READ_GLOBAL, NAME_GLOBAL},       {LOAD_NAME, ACT_READ_GLOBAL, NAME_NAMES},
    {LOAD_DEREF, ACT_READ_DEREF, NAME_LOCALSPLUS},     {LOAD_CLASSDEREF, ACT_READ_DEREF, NAME_LOCALSPLUS},
    {LOAD_CLOSURE, ACT_READ_CLOSURE, NAME_LOCALSPLUS}, {LOAD_FAST, ACT_READ_FAST, NAME_LOCALSPLUS},
    {STORE_FAST, ACT_WRITE_FAST, NAME_LOCALSPLUS},     {DELETE_FAST, ACT_WRITE_FAST, NAME_LOCALSPLUS},
    {STORE_GLOBAL, ACT_WRITE_GLOBAL, NAME_NAMES},      {DELETE_GLOBAL, ACT_WRITE_GLOBAL, NAME_NAMES},
    {STORE_DEREF, ACT_WRITE_DEREF, NAME_LOCALSPLUS},   {DELETE_DEREF, ACT_WRITE_DEREF, NAME_LOCALSPLUS},
    {LOAD_ATTR, ACT_ATTR, NAME_NAMES},                 {LOAD_METHOD, ACT_METHOD, NAME_NAMES},
    {STORE_ATTR, ACT_WRITE_ATTR, NAME_NAMES},          {DELETE_ATTR, ACT_WRITE_ATTR, NAME_NAMES},
    {STORE_SUBSCR, ACT_WRITE_SUBSCR, NAME_NONE},       {DELETE_SUBSCR, ACT_WRITE_SUBSCR, NAME_NONE},
    {LOAD_CONST, ACT_CONST, NAME_CONST},               {BINARY_SUBSCR, ACT_SUBSCR, NAME_NONE},
    {IMPORT_NAME, ACT_NONE, NAME_NAMES},               {IMPORT_FROM, ACT_NONE, NAME_NAMES},
};

static struct {
    unsigned char act, src;
} by_opcode[256];

static void fill_by_opcode(void) {
    static int done;
    if (done) return;
    for (size_t k = 0; k < sizeof opcode_table / sizeof opcode_table[0]; k++) {
        by_opcode[opcode_table[k].op].act = (unsigned char)opcode_table[k].act;
        by_opcode[opcode_table[k].op].src = (unsigned char)opcode_table[k].src;
    }
    done = 1;
}


static int is_mutator(PyObject *name) {
    for (size_t k = 0; k < sizeof mutators / sizeof mutators[0]; k++)
        if (PyUnicode_CompareWithASCIIString(name, mutators[k]) == 0) return 1;
    return 0;
}

int pykiln_decode(PyCodeObject *code, pykiln_instr **out, Py_ssize_t *count) {
    fill_by_opcode();
    PyObject *bytes = PyCode_GetCode(code); /* deoptimized: base opcodes, caches zeroed */
    if (!bytes) return -1;
    const unsigned char *units = (const unsigned char *)PyBytes_AS_STRING(bytes);
    Py_ssize_t nunits = PyBytes_GET_SIZE(bytes) / 2;
    pykiln_instr *ins = PyMem_Calloc((size_t)(nunits ? nunits : 1), sizeof *ins);
    if (!ins) {
        Py_DECREF(bytes);
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t n = 0;
    int line = code->co_firstlineno, ext = 0;
    for (Py_ssize_t u = 0; u < nunits; u++) {
        int op = units[2 * u], arg = units[2 * u + 1] | ext;
        if (op == CACHE) continue;
        if (op == EXTENDED_ARG) {
            ext = arg << 8;
            continue;
        }
        ext = 0;
        int at = PyCode_Addr2Line(code, (int)(2 * u));
        if (at >= 0) line = at;
        pykiln_instr *i = &ins[n++];
        i->op = op;
        i->arg = arg;
        i->line = line;
        i->offset = (int)(2 * u);
        PyObject *table = NULL;
        int index = arg;
        switch (by_opcode[op].src) {
        case NAME_NAMES: table = code->co_names; break;
        case NAME_GLOBAL: table = code->co_names, index = arg >> 1; break;
        case NAME_LOCALSPLUS: table = code->co_localsplusnames; break;
        case NAME_CONST: table = code->co_consts; break;
        default: break;
        }
        i->name = table && index < PyTuple_GET_SIZE(table) ? PyTuple_GET_ITEM(table, index) : NULL;
    }
    Py_DECREF(bytes);
    *out = ins;
    *count = n;
    return 0;
}

/* Whether ins[k] loads the global `name` (to call it, or, in ast-converted code, to pass it to
 * the runtime's call: its arguments follow it either way). */
static int loads_global(const pykiln_instr *ins, Py_ssize_t k, const char *name) {
    return k >= 0 && ins[k].op == LOAD_GLOBAL && ins[k].name && PyUnicode_CompareWithASCIIString(ins[k].name, name) == 0;
}

static int loads_getattr(const pykiln_instr *ins, Py_ssize_t k) {
    return loads_global(ins, k, "getattr") || loads_global(ins, k, "hasattr");
}

/* Whether ins[k:] is the call that takes the arguments loaded since a builtin (argc: its count;
 * ast-converted code passes the source location and the builtin first to the runtime's
 * converted_call: two more). */
static int calls_at(const pykiln_instr *ins, Py_ssize_t n, Py_ssize_t k, int argc) {
    return k + 1 < n && ins[k].op == PRECALL && ins[k + 1].op == CALL && ins[k + 1].arg == ins[k].arg &&
           ins[k].arg >= argc && ins[k].arg <= argc + 2;
}

/* The attribute reads and constant subscripts that follow a load at ins[k:], as a tuple of
 * ("attr", name) | ("item", constant) (new reference; empty when none). A chain that is the first
 * argument of getattr or hasattr with a constant name, `getattr(cfg.opt, "scale", 1.0)`, ends with
 * that attribute (whose absence is guarded too: an attribute set later changes the result). */
static PyObject *chain_after(const pykiln_instr *ins, Py_ssize_t n, Py_ssize_t k) {
    PyObject *steps = PyList_New(0);
    if (!steps) return NULL;
    int in_getattr = loads_getattr(ins, k - 2), in_type = loads_global(ins, k - 2, "type");
again:
    while (k < n) {
        int act = by_opcode[ins[k].op].act;
        PyObject *step = NULL;
        /* an augmented assignment copies the object before reading from it: `obj.n += 1` is
         * COPY 1; LOAD_ATTR n, and `obj[c] += 1` is LOAD_CONST c; COPY 2; COPY 2; BINARY_SUBSCR */
        if (ins[k].op == COPY && ins[k].arg == 1 && k + 1 < n && by_opcode[ins[k + 1].op].act == ACT_ATTR) {
            k++;
            continue;
        }
        int copied = act == ACT_CONST && k + 3 < n && ins[k + 1].op == COPY && ins[k + 1].arg == 2 &&
                     ins[k + 2].op == COPY && ins[k + 2].arg == 2;
        int subscr_at = copied ? 3 : 1;
        if ((act == ACT_ATTR || act == ACT_METHOD) && ins[k].name) {
            step = Py_BuildValue("(sO)", "attr", ins[k].name);
        } else if (act == ACT_CONST && k + subscr_at < n && by_opcode[ins[k + subscr_at].op].act == ACT_SUBSCR &&
                   ins[k].name && (PyLong_Check(ins[k].name) || PyUnicode_Check(ins[k].name))) {
            step = Py_BuildValue("(sO)", "item", ins[k].name);
        } else {
            break;
        }
        if (!step || PyList_Append(steps, step) < 0) {
            Py_XDECREF(step);
            Py_DECREF(steps);
            return NULL;
        }
        Py_DECREF(step);
        if (act == ACT_METHOD) break;
        k += act == ACT_CONST ? subscr_at + 1 : 1;
    }
    if (in_getattr && k < n && by_opcode[ins[k].op].act == ACT_CONST && ins[k].name && PyUnicode_Check(ins[k].name) &&
        (k + 1 >= n || by_opcode[ins[k + 1].op].act != ACT_SUBSCR)) {
        PyObject *step = Py_BuildValue("(sO)", "attr", ins[k].name);
        if (!step || PyList_Append(steps, step) < 0) {
            Py_XDECREF(step);
            Py_DECREF(steps);
            return NULL;
        }
        Py_DECREF(step);
    }
    if (in_type && calls_at(ins, n, k, 1)) { /* type(obj).attr: obj.__class__.attr */
        PyObject *step = Py_BuildValue("(ss)", "attr", "__class__");
        if (!step || PyList_Append(steps, step) < 0) {
            Py_XDECREF(step);
            Py_DECREF(steps);
            return NULL;
        }
        Py_DECREF(step);
        in_type = 0;
        k += 2;
        goto again;
    }
    PyObject *t = PyList_AsTuple(steps);
    Py_DECREF(steps);
    return t;
}

static int contains(PyObject *tuple, PyObject *name) {
    return name && PySequence_Contains(tuple, name) == 1;
}

/* Appends (text, line) to list; text is a format with one %R (the name) or none. */
static int add_event(PyObject *list, const char *format, PyObject *name, int line) {
    PyObject *what = name ? PyUnicode_FromFormat(format, name) : PyUnicode_FromString(format);
    PyObject *item = what ? Py_BuildValue("(Oi)", what, line) : NULL;
    Py_XDECREF(what);
    int r = item ? PyList_Append(list, item) : -1;
    Py_XDECREF(item);
    return r;
}

/* Methods that change a container without reading anything of it into the caller. */
static const char *const write_only_methods[] = {"append", "appendleft", "extend", "extendleft", "insert", "add",
                                                 "update", "clear", "discard"};

static int is_write_only(PyObject *name) {
    for (size_t k = 0; name && k < sizeof write_only_methods / sizeof write_only_methods[0]; k++)
        if (PyUnicode_CompareWithASCIIString(name, write_only_methods[k]) == 0) return 1;
    return 0;
}

/* The globals and free variables among ins[:n] whose every load is followed at once by LOAD_METHOD of a
 * write-only method (`LOG.append(x)`): the code changes them but reads nothing of their contents. */
static PyObject *appended_names(const pykiln_instr *ins, Py_ssize_t n) {
    PyObject *seen = PyDict_New(); /* name -> True while every load of it so far was write-only */
    if (!seen) return NULL;
    for (Py_ssize_t k = 0; k < n; k++) {
        int op = ins[k].op;
        if (!ins[k].name || !(op == LOAD_GLOBAL || op == LOAD_DEREF || op == LOAD_CLASSDEREF || op == LOAD_NAME))
            continue;
        int only = !(op == LOAD_GLOBAL && (ins[k].arg & 1)) && k + 1 < n && ins[k + 1].op == LOAD_METHOD &&
                   is_write_only(ins[k + 1].name);
        PyObject *was = PyDict_GetItemWithError(seen, ins[k].name);
        if (!was && PyErr_Occurred()) goto fail;
        if (PyDict_SetItem(seen, ins[k].name, only && (!was || was == Py_True) ? Py_True : Py_False) < 0) goto fail;
    }
    PyObject *names = PyList_New(0), *key, *value;
    Py_ssize_t pos = 0;
    while (names && PyDict_Next(seen, &pos, &key, &value))
        if (value == Py_True && PyList_Append(names, key) < 0) Py_CLEAR(names);
    PyObject *t = names ? PyList_AsTuple(names) : NULL;
    Py_XDECREF(names);
    Py_DECREF(seen);
    return t;
fail:
    Py_DECREF(seen);
    return NULL;
}

/* The parameters the code never assigns (a chain on one of them reads the caller's object). */
static PyObject *unassigned_params(PyCodeObject *code, const pykiln_instr *ins, Py_ssize_t n) {
    int nargs = code->co_argcount + code->co_kwonlyargcount + !!(code->co_flags & CO_VARARGS) +
                !!(code->co_flags & CO_VARKEYWORDS);
    PyObject *params = PySet_New(NULL);
    if (!params) return NULL;
    for (int k = 0; k < nargs && k < PyTuple_GET_SIZE(code->co_localsplusnames); k++)
        if (PySet_Add(params, PyTuple_GET_ITEM(code->co_localsplusnames, k)) < 0) goto fail;
    for (Py_ssize_t k = 0; k < n; k++)
        if ((by_opcode[ins[k].op].act == ACT_WRITE_FAST || by_opcode[ins[k].op].act == ACT_WRITE_DEREF) &&
            ins[k].name && PySet_Discard(params, ins[k].name) < 0)
            goto fail;
    return params;
fail:
    Py_DECREF(params);
    return NULL;
}

/* Adds (root kind, root name, steps) to chains, steps a tuple of ("attr", name) | ("item", c). */
static int add_chain(PyObject *chains, const char *kind, PyObject *name, PyObject *steps) {
    PyObject *chain = Py_BuildValue("(sOO)", kind, name, steps);
    int rc = chain ? PyDict_SetItem(chains, chain, Py_None) : -1;
    Py_XDECREF(chain);
    return rc;
}

/* The locals an `import` inside the code binds, each assigned nowhere else: name -> (module name,
 * the steps from the module to the value). `import m` / `import m as a`: (m, ()); `import a.b`: (a,
 * ()); `from m import x [as y]`: (m, (("attr", x),)); that last read is a chain of its own, added to
 * chains. A chain read from such a local is rooted at the module (kind "module", found in
 * sys.modules when guarded): an attribute of a module imported inside the function, changed
 * between calls, is guarded like a global's. Relative imports are left out. */
static PyObject *import_aliases(const pykiln_instr *ins, Py_ssize_t n, PyObject *chains) {
    PyObject *aliases = PyDict_New(), *stores = PyDict_New();
    if (!aliases || !stores) goto fail;
    for (Py_ssize_t k = 0; k < n; k++) { /* how often each local is assigned */
        if (by_opcode[ins[k].op].act != ACT_WRITE_FAST || !ins[k].name) continue;
        PyObject *c = PyDict_GetItemWithError(stores, ins[k].name);
        if (!c && PyErr_Occurred()) goto fail;
        PyObject *more = PyLong_FromLong(c ? PyLong_AsLong(c) + 1 : 1);
        if (!more || PyDict_SetItem(stores, ins[k].name, more) < 0) {
            Py_XDECREF(more);
            goto fail;
        }
        Py_DECREF(more);
    }
    for (Py_ssize_t k = 2; k + 1 < n; k++) {
        if (ins[k].op != IMPORT_NAME || !ins[k].name || ins[k - 2].op != LOAD_CONST || !ins[k - 2].name ||
            !PyLong_Check(ins[k - 2].name) || PyLong_AsLong(ins[k - 2].name) != 0 || ins[k - 1].op != LOAD_CONST)
            continue;
        PyObject *module = ins[k].name;
        if (ins[k + 1].op == STORE_FAST && ins[k - 1].name == Py_None) { /* import m [as a], import a.b */
            Py_ssize_t dot = PyUnicode_FindChar(module, '.', 0, PyUnicode_GET_LENGTH(module), 1);
            if (dot < -1) goto fail;
            PyObject *root = dot >= 0 ? PyUnicode_Substring(module, 0, dot) : Py_NewRef(module);
            PyObject *local = ins[k + 1].name, *c = PyDict_GetItemWithError(stores, local);
            PyObject *entry = root ? Py_BuildValue("(O())", root) : NULL;
            int rc = entry && c && PyLong_AsLong(c) == 1 && (dot < 0 || PyUnicode_Compare(local, root) == 0)
                         ? PyDict_SetItem(aliases, local, entry) : (entry ? 0 : -1);
            Py_XDECREF(root);
            Py_XDECREF(entry);
            if (rc < 0) goto fail;
            continue;
        }
        for (Py_ssize_t j = k + 1; j + 1 < n && ins[j].op == IMPORT_FROM && ins[j].name && ins[j + 1].op == STORE_FAST;
             j += 2) { /* from m import x [as y], ... */
            PyObject *steps = Py_BuildValue("((sO))", "attr", ins[j].name), *local = ins[j + 1].name;
            PyObject *entry = steps ? PyTuple_Pack(2, module, steps) : NULL;
            PyObject *c = local ? PyDict_GetItemWithError(stores, local) : NULL;
            int rc = entry ? add_chain(chains, "module", module, steps) : -1;
            if (rc == 0 && c && PyLong_AsLong(c) == 1) rc = PyDict_SetItem(aliases, local, entry);
            Py_XDECREF(steps);
            Py_XDECREF(entry);
            if (rc < 0) goto fail;
        }
    }
    Py_DECREF(stores);
    return aliases;
fail:
    Py_XDECREF(aliases);
    Py_XDECREF(stores);
    return NULL;
}

static int scan(PyCodeObject *code, const pykiln_instr *ins, Py_ssize_t n, PyObject *params, PyObject *globals,
                PyObject *freevars, PyObject *chains, PyObject *lists[3]) {
    PyObject *effects = lists[0], *prints = lists[1], *mutations = lists[2];
    PyObject *free_names = code->co_nfreevars ? PyCode_GetFreevars(code) : PyTuple_New(0);
    if (!free_names) return -1;
    PyObject *imported = import_aliases(ins, n, chains);
    if (!imported) {
        Py_DECREF(free_names);
        return -1;
    }
    int r = -1;
    for (Py_ssize_t k = 0; k < n; k++) {
        const pykiln_instr *i = &ins[k];
        int act = by_opcode[i->op].act;
        PyObject *name = i->name;
        int is_free = contains(free_names, name);
        const char *kind = NULL;
        if (act == ACT_READ_GLOBAL) {
            if (PyDict_SetItem(globals, name, Py_None) < 0) goto done;
            if (PyUnicode_CompareWithASCIIString(name, "print") == 0) {
                PyObject *line = PyLong_FromLong(i->line);
                int failed = !line || PyList_Append(prints, line) < 0;
                Py_XDECREF(line);
                if (failed) goto done;
            }
            kind = "global";
        } else if ((act == ACT_READ_DEREF || act == ACT_READ_CLOSURE) && is_free) {
            if (PyDict_SetItem(freevars, name, Py_None) < 0) goto done;
            kind = act == ACT_READ_DEREF ? "deref" : NULL;
        } else if (act == ACT_READ_FAST && name && PyDict_GetItemWithError(imported, name)) {
            PyObject *alias = PyDict_GetItemWithError(imported, name); /* (module, steps to the value) */
            PyObject *more = chain_after(ins, n, k + 1);
            PyObject *steps = more ? PySequence_Concat(PyTuple_GET_ITEM(alias, 1), more) : NULL;
            int rc = steps ? (PyTuple_GET_SIZE(steps) ? add_chain(chains, "module", PyTuple_GET_ITEM(alias, 0), steps) : 0)
                           : -1;
            Py_XDECREF(more);
            Py_XDECREF(steps);
            if (rc < 0) goto done;
        } else if (PyErr_Occurred()) {
            goto done;
        } else if ((act == ACT_READ_FAST || act == ACT_READ_DEREF) && name && PySet_Contains(params, name) == 1) {
            kind = "fast"; /* (through its cell when a nested function closes over the parameter) */
        } else if (act == ACT_WRITE_GLOBAL) {
            if (add_event(effects, "a write to the global %R", name, i->line) < 0) goto done;
        } else if (act == ACT_WRITE_DEREF && is_free) {
            if (add_event(effects, "a write to the closure variable %R (nonlocal)", name, i->line) < 0) goto done;
        } else if ((act == ACT_ATTR || act == ACT_METHOD) && name && is_mutator(name)) {
            if (add_event(mutations, ".%U(...)", name, i->line) < 0) goto done;
        } else if (act == ACT_WRITE_ATTR) {
            if (add_event(mutations, "an assignment to attribute %R", name, i->line) < 0) goto done;
        } else if (act == ACT_WRITE_SUBSCR) {
            if (add_event(mutations, "an item assignment", NULL, i->line) < 0) goto done;
        }
        Py_ssize_t after = k + 1;
        if (act == ACT_READ_GLOBAL && loads_global(ins, k, "globals") && calls_at(ins, n, k + 1, 0) && k + 4 < n &&
            by_opcode[ins[k + 3].op].act == ACT_CONST && ins[k + 3].name && PyUnicode_Check(ins[k + 3].name) &&
            by_opcode[ins[k + 4].op].act == ACT_SUBSCR) { /* globals()["X"]: the global X, read by name */
            name = ins[k + 3].name;
            if (PyDict_SetItem(globals, name, Py_None) < 0) goto done;
            after = k + 5;
        }
        if (kind && name) {
            PyObject *steps = chain_after(ins, n, after);
            if (!steps) goto done;
            if (PyTuple_GET_SIZE(steps)) {
                PyObject *chain = Py_BuildValue("(sOO)", kind, name, steps);
                if (!chain || PyDict_SetItem(chains, chain, Py_None) < 0) {
                    Py_XDECREF(chain);
                    Py_DECREF(steps);
                    goto done;
                }
                Py_DECREF(chain);
            }
            Py_DECREF(steps);
        }
    }
    r = 0;
done:
    Py_DECREF(free_names);
    Py_DECREF(imported);
    return r;
}

static PyObject *nested_codes(PyCodeObject *code) {
    PyObject *list = PyList_New(0);
    if (!list) return NULL;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(code->co_consts); k++) {
        PyObject *c = PyTuple_GET_ITEM(code->co_consts, k);
        if (PyCode_Check(c) && PyList_Append(list, c) < 0) {
            Py_DECREF(list);
            return NULL;
        }
    }
    PyObject *t = PyList_AsTuple(list);
    Py_DECREF(list);
    return t;
}

static PyObject *keys_tuple(PyObject *dict) {
    PyObject *keys = PyDict_Keys(dict);
    PyObject *t = keys ? PyList_AsTuple(keys) : NULL;
    Py_XDECREF(keys);
    return t;
}

/* Adds to chains, as chains on the parameter itself ("fast"), the chains that nested code reads
 * through a closure variable naming one of the outer code's unassigned parameters (names: those
 * still meaning the parameter at this depth). A lambda or an ast-converted branch reading
 * self.cfg.scale is made anew by each call, so the parameter is the root that stays to guard. */
static int lift_nested_chains(PyCodeObject *code, PyObject *names, PyObject *chains) {
    int rc = 0;
    for (Py_ssize_t c = 0; rc == 0 && c < PyTuple_GET_SIZE(code->co_consts); c++) {
        PyObject *nested = PyTuple_GET_ITEM(code->co_consts, c);
        if (!PyCode_Check(nested)) continue;
        PyObject *free = PyCode_GetFreevars((PyCodeObject *)nested), *here = PySet_New(NULL);
        for (Py_ssize_t k = 0; free && here && rc == 0 && k < PyTuple_GET_SIZE(free); k++) {
            int in = PySet_Contains(names, PyTuple_GET_ITEM(free, k));
            rc = in < 0 ? -1 : in ? PySet_Add(here, PyTuple_GET_ITEM(free, k)) : 0;
        }
        pykiln_instr *ins = NULL;
        Py_ssize_t n = 0;
        if (!free || !here || rc < 0 || pykiln_decode((PyCodeObject *)nested, &ins, &n) < 0) rc = -1;
        for (Py_ssize_t k = 0; rc == 0 && PySet_GET_SIZE(here) && k < n; k++) /* (a nonlocal write: not stable) */
            if (by_opcode[ins[k].op].act == ACT_WRITE_DEREF && ins[k].name) rc = PySet_Discard(here, ins[k].name) < 0 ? -1 : 0;
        for (Py_ssize_t k = 0; rc == 0 && PySet_GET_SIZE(here) && k < n; k++) {
            if (by_opcode[ins[k].op].act != ACT_READ_DEREF || !ins[k].name) continue;
            int in = PySet_Contains(here, ins[k].name);
            PyObject *steps = in == 1 ? chain_after(ins, n, k + 1) : NULL;
            if (in < 0 || (in == 1 && !steps)) rc = -1;
            if (steps && PyTuple_GET_SIZE(steps)) {
                PyObject *chain = Py_BuildValue("(sOO)", "fast", ins[k].name, steps);
                if (!chain || PyDict_SetItem(chains, chain, Py_None) < 0) rc = -1;
                Py_XDECREF(chain);
            }
            Py_XDECREF(steps);
        }
        PyMem_Free(ins);
        if (rc == 0 && PySet_GET_SIZE(here)) rc = lift_nested_chains((PyCodeObject *)nested, here, chains);
        Py_XDECREF(free);
        Py_XDECREF(here);
    }
    return rc;
}

/* The facts of code, or of its instructions at the offsets in `executed` (a set) when not NULL:
 * what one run of part of the code read (parameters count as assigned from the whole code). */
static PyObject *compute_facts(PyCodeObject *code, PyObject *executed) {
    pykiln_instr *ins;
    Py_ssize_t n;
    if (pykiln_decode(code, &ins, &n) < 0) return NULL;
    PyCodeFacts *f = NULL;
    PyObject *params = unassigned_params(code, ins, n);
    if (params && executed) {
        Py_ssize_t kept = 0;
        for (Py_ssize_t k = 0; k < n; k++) {
            PyObject *at = PyLong_FromLong(ins[k].offset);
            int in = at ? PySet_Contains(executed, at) : -1;
            Py_XDECREF(at);
            if (in < 0) Py_CLEAR(params);
            if (in < 0) break;
            if (in) ins[kept++] = ins[k];
        }
        n = kept;
    }
    PyObject *globals = PyDict_New(), *freevars = PyDict_New(), *chains = PyDict_New();
    PyObject *lists[3] = {PyList_New(0), PyList_New(0), PyList_New(0)};
    if (!params || !globals || !freevars || !chains || !lists[0] || !lists[1] || !lists[2]) goto done;
    if (scan(code, ins, n, params, globals, freevars, chains, lists) < 0 ||
        lift_nested_chains(code, params, chains) < 0)
        goto done;
    f = PyObject_New(PyCodeFacts, &PyCodeFacts_Type);
    if (!f) goto done;
    f->globals = keys_tuple(globals);
    f->freevars = keys_tuple(freevars);
    f->chains = keys_tuple(chains);
    f->effects = PyList_AsTuple(lists[0]);
    f->prints = PyList_AsTuple(lists[1]);
    f->mutations = PyList_AsTuple(lists[2]);
    f->nested = nested_codes(code);
    f->appended = appended_names(ins, n);
    if (!f->globals || !f->freevars || !f->chains || !f->effects || !f->prints || !f->mutations || !f->nested ||
        !f->appended)
        Py_CLEAR(f);
done:
    PyMem_Free(ins);
    Py_XDECREF(params);
    Py_XDECREF(globals);
    Py_XDECREF(freevars);
    Py_XDECREF(chains);
    for (int k = 0; k < 3; k++) Py_XDECREF(lists[k]);
    return (PyObject *)f;
}

/* Adds to loads[0] the globals (LOAD_GLOBAL) and to loads[1] the cell variables (LOAD_DEREF,
 * LOAD_CLASSDEREF) code and its nested code read, and to stores the names they write. */
static int scan_reads(PyCodeObject *code, PyObject *loads[2], PyObject *stores) {
    pykiln_instr *ins;
    Py_ssize_t n;
    if (pykiln_decode(code, &ins, &n) < 0) return -1;
    int rc = 0;
    for (Py_ssize_t k = 0; rc == 0 && k < n; k++) {
        int act = by_opcode[ins[k].op].act;
        if (!ins[k].name) continue;
        if (ins[k].op == LOAD_GLOBAL || act == ACT_READ_DEREF)
            rc = PySet_Add(loads[ins[k].op == LOAD_GLOBAL ? 0 : 1], ins[k].name);
        else if (act == ACT_WRITE_GLOBAL || act == ACT_WRITE_DEREF)
            rc = PySet_Add(stores, ins[k].name);
    }
    PyMem_Free(ins);
    for (Py_ssize_t k = 0; rc == 0 && k < PyTuple_GET_SIZE(code->co_consts); k++) {
        PyObject *c = PyTuple_GET_ITEM(code->co_consts, k);
        if (PyCode_Check(c)) rc = scan_reads((PyCodeObject *)c, loads, stores);
    }
    return rc;
}

PyObject *pykiln_read_names(PyObject *code) {
    if (!PyCode_Check(code))
        return PyErr_Format(PyExc_TypeError, "read_names: expected a code object, got %s", Py_TYPE(code)->tp_name);
    PyObject *loads[2] = {PySet_New(NULL), PySet_New(NULL)}, *stores = PySet_New(NULL), *result = NULL;
    if (loads[0] && loads[1] && stores && scan_reads((PyCodeObject *)code, loads, stores) == 0) {
        PyObject *g = PyNumber_Subtract(loads[0], stores), *f = g ? PyNumber_Subtract(loads[1], stores) : NULL;
        result = f ? PyTuple_Pack(2, g, f) : NULL;
        Py_XDECREF(g);
        Py_XDECREF(f);
    }
    Py_XDECREF(loads[0]);
    Py_XDECREF(loads[1]);
    Py_XDECREF(stores);
    return result;
}

static void release_facts(void *facts) { Py_XDECREF((PyObject *)facts); }

PyObject *pykiln_code_facts(PyObject *code) {
    static Py_ssize_t slot = -1;
    if (!PyCode_Check(code)) {
        PyErr_Format(PyExc_TypeError, "code_facts: expected a code object, got %s", Py_TYPE(code)->tp_name);
        return NULL;
    }
    if (slot < 0 && (slot = _PyEval_RequestCodeExtraIndex(release_facts)) < 0) return NULL;
    void *cached = NULL;
    if (_PyCode_GetExtra(code, slot, &cached) < 0) return NULL;
    if (cached) {
        Py_INCREF((PyObject *)cached);
        return cached;
    }
    PyObject *facts = compute_facts((PyCodeObject *)code, NULL);
    if (!facts) return NULL;
    if (_PyCode_SetExtra(code, slot, facts) < 0) {
        Py_DECREF(facts);
        return NULL;
    }
    Py_INCREF(facts); /* one for the code object's slot, one for the caller */
    return facts;
}

/* kiln._C.decode(code): the instructions as a tuple of (opcode, arg, offset, line, name), name
 * the name or constant the argument designates (None when the table names none): what
 * bytecode capture (kiln/jit/bytecode.py) interprets. */
static PyObject *decode_tuple(PyObject *code) {
    if (!PyCode_Check(code)) {
        PyErr_Format(PyExc_TypeError, "decode: expected a code object, got %s", Py_TYPE(code)->tp_name);
        return NULL;
    }
    pykiln_instr *ins;
    Py_ssize_t n;
    if (pykiln_decode((PyCodeObject *)code, &ins, &n) < 0) return NULL;
    PyObject *out = PyTuple_New(n);
    for (Py_ssize_t k = 0; out && k < n; k++) {
        PyObject *item = Py_BuildValue("(iiiiO)", ins[k].op, ins[k].arg, ins[k].offset, ins[k].line,
                                       ins[k].name ? ins[k].name : Py_None);
        if (!item) Py_CLEAR(out);
        else PyTuple_SET_ITEM(out, k, item);
    }
    PyMem_Free(ins);
    return out;
}

PyObject *pykiln_code_facts_executed(PyObject *code, PyObject *executed) {
    if (!PyCode_Check(code) || !PyAnySet_Check(executed))
        return PyErr_Format(PyExc_TypeError, "code_facts: expected a code object and a set of offsets");
    return compute_facts((PyCodeObject *)code, executed);
}

#else

PyObject *pykiln_code_facts_executed(PyObject *code, PyObject *executed) {
    (void)executed;
    return pykiln_code_facts(code);
}

static PyObject *decode_tuple(PyObject *code) {
    (void)code;
    return PyErr_Format(PyExc_RuntimeError, "kiln reads bytecode of CPython 3.11 only; this is Python %s",
                        Py_GetVersion());
}

int pykiln_decode(PyCodeObject *code, pykiln_instr **out, Py_ssize_t *count) {
    (void)code, (void)out, (void)count;
    PyErr_Format(PyExc_RuntimeError, "kiln reads bytecode of CPython 3.11 only; this is Python %s", Py_GetVersion());
    return -1;
}

PyObject *pykiln_code_facts(PyObject *code) {
    (void)code;
    return PyErr_Format(PyExc_RuntimeError, "kiln reads bytecode of CPython 3.11 only; this is Python %s",
                        Py_GetVersion());
}

PyObject *pykiln_read_names(PyObject *code) { return pykiln_code_facts(code); }

#endif

static PyObject *py_code_facts(PyObject *module, PyObject *code) {
    (void)module;
    return pykiln_code_facts(code);
}

static PyObject *py_read_names(PyObject *module, PyObject *code) {
    (void)module;
    return pykiln_read_names(code);
}

/* kiln._C.mutator_names(): the method names that change a list, dict, set or object in place. */
static PyObject *py_mutator_names(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    size_t n = sizeof mutators / sizeof mutators[0];
    PyObject *out = PyTuple_New((Py_ssize_t)n);
    for (size_t k = 0; out && k < n; k++) {
        PyObject *name = PyUnicode_FromString(mutators[k]);
        if (!name) Py_CLEAR(out);
        else PyTuple_SET_ITEM(out, (Py_ssize_t)k, name);
    }
    return out;
}

static PyObject *py_decode(PyObject *module, PyObject *code) {
    (void)module;
    return decode_tuple(code);
}

static PyMethodDef pykiln_code_facts_functions[] = {
    {"mutator_names", py_mutator_names, METH_NOARGS,
     "mutator_names() -> the method names that change a list, dict, set or object in place"},
    {"decode", py_decode, METH_O,
     "decode(code) -> ((opcode, arg, offset, line, name), ...): the instructions, EXTENDED_ARG folded, CACHE skipped"},
    {"code_facts", py_code_facts, METH_O, "code_facts(code) -> CodeFacts: what the code object reads and writes"},
    {"read_names", py_read_names, METH_O,
     "read_names(code) -> (globals, cell variables): what code and its nested code load and never store"},
    {NULL, NULL, 0, NULL},
};

int pykiln_code_facts_init_type(PyObject *module) {
    if (PyType_Ready(&PyCodeFacts_Type) < 0) return -1;
    Py_INCREF(&PyCodeFacts_Type);
    if (PyModule_AddObject(module, "CodeFacts", (PyObject *)&PyCodeFacts_Type) < 0) return -1;
    return PyModule_AddFunctions(module, pykiln_code_facts_functions);
}
