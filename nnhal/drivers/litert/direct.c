/* The LiteRT driver's bound runs as one native call (see direct.py): set each input, invoke,
 * get each output, on an interpreter fitted to the bound layout, with no Python frame around
 * ai-edge-litert's own calls. Everything that is not the common case (a profiled run, no
 * free interpreter of this layout, an output of another shape) goes to the Python twin, and
 * a failed call is reported to it; so this file holds no policy, only the steps. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <numpy/arrayobject.h>
#include "native_ext.h"

typedef struct {
    PyObject_HEAD
    PyObject *pool;     /* list of free engines, or NULL: the calls are fixed (`calls`) */
    PyObject *calls;    /* (SetTensor, Invoke, GetTensor), when fixed */
    PyObject *shapes;   /* the input shapes an engine of the pool must be fitted to */
    PyObject *inputs;   /* tuple: the input tensors' indexes */
    PyObject *outputs;  /* tuple: the output tensors' indexes */
    PyObject *general;  /* callable(arrays) -> outs or None: every other case */
    PyObject *failed;   /* callable(exception, arrays) -> outs or None: a call raised */
    PyObject *fix;      /* callable(outs) -> outs or None: an output of another shape */
    PyObject *profile;  /* module whose ACTIVE is not None while a profile is taken */
    PyObject *zero;     /* the subgraph index 0 */
    PyObject *bools;    /* tuple: the boolean inputs' positions (bytes other than 0, 1: general) */
    nnhal_shapes known; /* per output: its known dimensions (-1: not known, `fix` decides) */
    vectorcallfunc vectorcall;
} Calls;

static PyObject *s_active, *s_shapes, *s_calls, *s_interpreter, *s_wrapper, *s_set, *s_invoke,
    *s_get;

static int calls_traverse(Calls *s, visitproc visit, void *arg) {
    Py_VISIT(s->pool); Py_VISIT(s->calls); Py_VISIT(s->shapes); Py_VISIT(s->inputs);
    Py_VISIT(s->outputs); Py_VISIT(s->general); Py_VISIT(s->failed); Py_VISIT(s->fix);
    Py_VISIT(s->profile); Py_VISIT(s->bools);
    return 0;
}

static int calls_clear(Calls *s) {
    Py_CLEAR(s->pool); Py_CLEAR(s->calls); Py_CLEAR(s->shapes); Py_CLEAR(s->inputs);
    Py_CLEAR(s->outputs); Py_CLEAR(s->general); Py_CLEAR(s->failed); Py_CLEAR(s->fix);
    Py_CLEAR(s->profile); Py_CLEAR(s->zero); Py_CLEAR(s->bools);
    return 0;
}

static void calls_dealloc(Calls *s) {
    PyObject_GC_UnTrack(s);
    calls_clear(s);
    nnhal_shapes_free(&s->known);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

/* The engine's calls when it is fitted to `shapes`: (SetTensor, Invoke, GetTensor, key), kept
 * on the engine, `key` being the `shapes` object of the Calls that found the engine fitted to
 * them. Engine.fit drops them before resizing (ai-edge-litert counts the wrapper's
 * references, and the engine's shapes change only there), so calls found keyed by this
 * Calls' `shapes` tell, with no comparison, that the engine is still fitted to them. New
 * reference; NULL with no error set when the engine is fitted to other shapes or has no
 * wrapper to call; NULL with an error set when a comparison raised. */
static PyObject *engine_calls(PyObject *engine, PyObject *want) {
    PyObject *calls = PyObject_GetAttr(engine, s_calls);
    if (calls == NULL) { PyErr_Clear(); return NULL; }
    if (PyTuple_CheckExact(calls) && PyTuple_GET_SIZE(calls) == 4 &&
        PyTuple_GET_ITEM(calls, 3) == want)
        return calls;
    Py_DECREF(calls);
    PyObject *shapes = PyObject_GetAttr(engine, s_shapes);
    int same = shapes ? PyObject_RichCompareBool(shapes, want, Py_EQ) : -1;
    Py_XDECREF(shapes);
    if (same != 1) return NULL;
    PyObject *interp = PyObject_GetAttr(engine, s_interpreter);
    PyObject *w = interp ? PyObject_GetAttr(interp, s_wrapper) : NULL;
    Py_XDECREF(interp);
    calls = NULL;
    if (w != NULL) {
        PyObject *a = PyObject_GetAttr(w, s_set), *b = PyObject_GetAttr(w, s_invoke),
                 *c = PyObject_GetAttr(w, s_get);
        if (a && b && c) calls = PyTuple_Pack(4, a, b, c, want);
        Py_XDECREF(a); Py_XDECREF(b); Py_XDECREF(c);
        Py_DECREF(w);
    }
    if (calls == NULL || PyObject_SetAttr(engine, s_calls, calls) < 0) {
        Py_XDECREF(calls);
        PyErr_Clear();
        return NULL;
    }
    return calls;
}

static PyObject *calls_call(PyObject *self, PyObject *const *args, size_t nargsf,
                            PyObject *kwnames) {
    Calls *s = (Calls *)self;
    if (PyVectorcall_NARGS(nargsf) != 1 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "a bound run takes one sequence of arrays");
        return NULL;
    }
    PyObject *arrays = args[0];
    Py_ssize_t n_in = PyTuple_GET_SIZE(s->inputs), n_out = PyTuple_GET_SIZE(s->outputs);
    if (!PyList_CheckExact(arrays) || PyList_GET_SIZE(arrays) != n_in)
        return nnhal_call1(s->general, arrays);
    PyObject *active = PyObject_GetAttr(s->profile, s_active);
    if (active == NULL) return NULL;
    Py_DECREF(active);
    if (active != Py_None) return nnhal_call1(s->general, arrays);

    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(s->bools); j++) {
        /* A boolean input's bytes, each 0 or 1 (numpy reads any other as true; TFLite would
         * read the byte): else, or not one block of bytes, the general way normalises it. */
        Py_ssize_t k = PyLong_AsSsize_t(PyTuple_GET_ITEM(s->bools, j));
        PyObject *a = k >= 0 && k < n_in ? PyList_GET_ITEM(arrays, k) : NULL;
        if (a == NULL || !PyArray_CheckExact(a) ||
            PyArray_ITEMSIZE((PyArrayObject *)a) != 1 ||
            !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)a)) {
            if (PyErr_Occurred()) return NULL;
            return nnhal_call1(s->general, arrays);
        }
        const unsigned char *p = PyArray_DATA((PyArrayObject *)a);
        npy_intp n = PyArray_SIZE((PyArrayObject *)a);
        unsigned char any = 0;
        for (npy_intp i = 0; i < n; i++) any |= p[i];
        if (any > 1) return nnhal_call1(s->general, arrays);
    }

    PyObject *engine = NULL, *calls;
    if (s->pool != NULL) {
        Py_ssize_t n = PyList_GET_SIZE(s->pool);
        if (n == 0) return nnhal_call1(s->general, arrays);
        /* As list.pop(): the last item's reference moves to here, the list one shorter
         * (its storage kept for the append that gives the engine back). */
        engine = PyList_GET_ITEM(s->pool, n - 1);
        Py_SET_SIZE(s->pool, n - 1);
        calls = engine_calls(engine, s->shapes);
        if (calls == NULL) {
            int raised = PyErr_Occurred() != NULL;
            int err = PyList_Append(s->pool, engine);
            Py_DECREF(engine);
            if (raised || err < 0) return NULL;
            return nnhal_call1(s->general, arrays);
        }
    } else {
        calls = s->calls;
        Py_INCREF(calls);
    }
    PyObject *set = PyTuple_GET_ITEM(calls, 0), *invoke = PyTuple_GET_ITEM(calls, 1),
             *get = PyTuple_GET_ITEM(calls, 2);
    PyObject *outs = NULL, *r, *cargs[3];
    for (Py_ssize_t k = 0; k < n_in; k++) {
        cargs[1] = PyTuple_GET_ITEM(s->inputs, k);
        cargs[2] = PyList_GET_ITEM(arrays, k);
        r = PyObject_Vectorcall(set, cargs + 1, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (r == NULL) goto failed;
        Py_DECREF(r);
    }
    r = PyObject_Vectorcall(invoke, NULL, 0, NULL);
    if (r == NULL) goto failed;
    Py_DECREF(r);
    outs = PyList_New(n_out);
    if (outs == NULL) goto failed;
    cargs[2] = s->zero;
    for (Py_ssize_t k = 0; k < n_out; k++) {
        cargs[1] = PyTuple_GET_ITEM(s->outputs, k);
        r = PyObject_Vectorcall(get, cargs + 1, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (r == NULL) goto failed;
        PyList_SET_ITEM(outs, k, r);
    }
    Py_DECREF(calls);
    if (engine != NULL) {
        int err = PyList_Append(s->pool, engine);
        Py_DECREF(engine);
        if (err < 0) { Py_DECREF(outs); return NULL; }
    }
    npy_intp *dims = s->known.dims;
    for (Py_ssize_t k = 0; k < n_out; k++)
        if (!nnhal_has_dims(PyList_GET_ITEM(outs, k), &dims, s->known.ndims[k])) {
            r = nnhal_call1(s->fix, outs);
            Py_DECREF(outs);
            return r;
        }
    return outs;

failed:
    /* As the twin: a call that raised leaves the engine out of the pool (not trusted
     * again) and is reported, with the inputs (the twin may run them another way: its
     * answer is this call's); an exception that is not an Exception goes up. */
    Py_XDECREF(outs);
    Py_DECREF(calls);
    Py_XDECREF(engine);
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return NULL;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL) PyException_SetTraceback(value, tb);
    r = PyObject_CallFunctionObjArgs(s->failed, value ? value : Py_None, arrays, NULL);
    Py_XDECREF(type); Py_XDECREF(value); Py_XDECREF(tb);
    return r;
}

static int check_indexes(PyObject *t, const char *what) {
    if (!PyTuple_CheckExact(t)) {
        PyErr_Format(PyExc_TypeError, "%s: a tuple of tensor indexes", what);
        return -1;
    }
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(t); k++)
        if (!PyLong_CheckExact(PyTuple_GET_ITEM(t, k))) {
            PyErr_Format(PyExc_TypeError, "%s: a tuple of tensor indexes", what);
            return -1;
        }
    return 0;
}

static PyObject *calls_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *names[] = {"pool", "calls", "shapes", "inputs", "outputs", "known", "general",
                            "failed", "fix", "profile", "bools", NULL};
    PyObject *pool, *calls, *shapes, *inputs, *outputs, *known, *general, *failed, *fix,
        *profile, *bools;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOOOOOOO", names, &pool, &calls, &shapes,
                                     &inputs, &outputs, &known, &general, &failed, &fix,
                                     &profile, &bools))
        return NULL;
    if (pool == Py_None) {
        if (!PyTuple_CheckExact(calls) || PyTuple_GET_SIZE(calls) != 3) {
            PyErr_SetString(PyExc_TypeError, "calls: (SetTensor, Invoke, GetTensor)");
            return NULL;
        }
    } else if (!PyList_CheckExact(pool)) {
        PyErr_SetString(PyExc_TypeError, "pool: a list of engines, or None");
        return NULL;
    }
    if (check_indexes(inputs, "inputs") < 0 || check_indexes(outputs, "outputs") < 0 ||
        check_indexes(bools, "bools") < 0)
        return NULL;
    Py_ssize_t n_out = PyTuple_GET_SIZE(outputs);
    if (!PyTuple_CheckExact(known) || PyTuple_GET_SIZE(known) != n_out) {
        PyErr_SetString(PyExc_TypeError, "known: a tuple of shapes (or None), one per output");
        return NULL;
    }
    Calls *s = (Calls *)type->tp_alloc(type, 0);
    if (s == NULL) return NULL;
    s->zero = PyLong_FromLong(0);
    if (s->zero == NULL || nnhal_shapes_read(known, 1, &s->known) < 0) {
        Py_DECREF(s);
        return NULL;
    }
    s->pool = pool == Py_None ? NULL : Py_NewRef(pool);
    s->calls = pool == Py_None ? Py_NewRef(calls) : NULL;
    s->shapes = Py_NewRef(shapes);
    s->inputs = Py_NewRef(inputs);
    s->outputs = Py_NewRef(outputs);
    s->general = Py_NewRef(general);
    s->failed = Py_NewRef(failed);
    s->fix = Py_NewRef(fix);
    s->profile = Py_NewRef(profile);
    s->bools = Py_NewRef(bools);
    s->vectorcall = calls_call;
    return (PyObject *)s;
}

static PyTypeObject CallsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "nnhal_litert_direct.Calls",
    .tp_doc = "A bound run's calls into ai-edge-litert, as one native call.",
    .tp_basicsize = sizeof(Calls),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = calls_new,
    .tp_dealloc = (destructor)calls_dealloc,
    .tp_traverse = (traverseproc)calls_traverse,
    .tp_clear = (inquiry)calls_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Calls, vectorcall),
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "nnhal_litert_direct", NULL, -1,
                                    NULL};

PyMODINIT_FUNC PyInit_nnhal_litert_direct(void) {
    import_array();
    if (PyType_Ready(&CallsType) < 0) return NULL;
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(s_active, "ACTIVE"); INTERN(s_shapes, "shapes"); INTERN(s_calls, "calls");
    INTERN(s_interpreter, "interpreter"); INTERN(s_wrapper, "_interpreter");
    INTERN(s_set, "SetTensor"); INTERN(s_invoke, "Invoke"); INTERN(s_get, "GetTensor");
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Calls", (PyObject *)&CallsType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
