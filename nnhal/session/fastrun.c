/* A Session's ``run`` for its bound layout's common case as one native call (see bound.py:
 * plain_fast and stateful_fast are its Python twins, and say what each check is for). The
 * feeds are a dict of exactly the bound inputs, each an ndarray of the bound dtype and shape;
 * no thread is converting feeds; the Session's lock is free; the guard still holds (the
 * binding is the Session's). Then the driver's direct call runs the arrays and its outputs
 * come back by name. Anything else, and a run the driver did not do, goes to the usual
 * ``Session.run``, which checks, waits, reports. Runs none of the caller's code. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <stddef.h>
#include <time.h>
#include <numpy/arrayobject.h>
#include "native_ext.h"

/* ---- Lock: a Session's lock, which the native run takes without a Python call ---------
 * threading.Lock's interface (acquire with blocking and timeout, release, locked, a context
 * manager), waiting with the GIL released and running signal handlers while it waits; it
 * also knows which thread holds it (``held``), so a Session finds a re-entering call
 * without noting its owner on every run. */

typedef struct {
    PyObject_HEAD
    PyThread_type_lock lock;
    unsigned long owner; /* the holding thread's ident; 0 when free */
} Lock;

static PyTypeObject LockType;

static PyObject *lock_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    if (PyTuple_GET_SIZE(args) != 0 || (kw != NULL && PyDict_GET_SIZE(kw) != 0)) {
        PyErr_SetString(PyExc_TypeError, "Lock() takes no arguments");
        return NULL;
    }
    Lock *s = (Lock *)type->tp_alloc(type, 0);
    if (s == NULL) return NULL;
    s->lock = PyThread_allocate_lock();
    if (s->lock == NULL) {
        Py_DECREF(s);
        return PyErr_NoMemory();
    }
    return (PyObject *)s;
}

static void lock_dealloc(Lock *s) {
    if (s->lock != NULL) {
        if (s->owner != 0) PyThread_release_lock(s->lock);
        PyThread_free_lock(s->lock);
    }
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static double monotonic_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Take the lock now if it is free: 1, else 0 (the GIL held, no Python code run). */
static inline int lock_try(Lock *s) {
    if (PyThread_acquire_lock(s->lock, NOWAIT_LOCK) != PY_LOCK_ACQUIRED) return 0;
    s->owner = PyThread_get_thread_ident();
    return 1;
}

static inline void lock_drop(Lock *s) {
    s->owner = 0;
    PyThread_release_lock(s->lock);
}

static PyObject *lock_acquire(Lock *s, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"blocking", "timeout", NULL};
    int blocking = 1;
    double timeout = -1.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|pd:acquire", kwlist, &blocking, &timeout))
        return NULL;
    if (!blocking && timeout != -1.0) {
        PyErr_SetString(PyExc_ValueError, "can't specify a timeout for a non-blocking call");
        return NULL;
    }
    if (timeout < 0.0 && timeout != -1.0) {
        PyErr_SetString(PyExc_ValueError, "timeout value must be a non-negative number");
        return NULL;
    }
    if (timeout * 1e6 >= (double)PY_TIMEOUT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "timeout value is too large");
        return NULL;
    }
    if (lock_try(s)) Py_RETURN_TRUE;
    if (!blocking || timeout == 0.0) Py_RETURN_FALSE;
    double deadline = timeout < 0.0 ? 0.0 : monotonic_s() + timeout;
    for (;;) {
        PY_TIMEOUT_T us = -1;
        if (timeout >= 0.0) {
            double left = deadline - monotonic_s();
            if (left <= 0.0) Py_RETURN_FALSE;
            us = (PY_TIMEOUT_T)(left * 1e6) + 1;
        }
        PyLockStatus r;
        Py_BEGIN_ALLOW_THREADS
        r = PyThread_acquire_lock_timed(s->lock, us, 1);
        Py_END_ALLOW_THREADS
        if (r == PY_LOCK_ACQUIRED) {
            s->owner = PyThread_get_thread_ident();
            Py_RETURN_TRUE;
        }
        if (r == PY_LOCK_FAILURE) Py_RETURN_FALSE;
        /* interrupted: run the signal handlers (one may raise), then wait on */
        if (Py_MakePendingCalls() < 0) return NULL;
    }
}

static PyObject *lock_release(Lock *s, PyObject *unused) {
    if (s->owner == 0) {
        PyErr_SetString(PyExc_RuntimeError, "release unlocked lock");
        return NULL;
    }
    lock_drop(s);
    Py_RETURN_NONE;
}

static PyObject *lock_exit(Lock *s, PyObject *args) { return lock_release(s, NULL); }

static PyObject *lock_locked(Lock *s, PyObject *unused) { return PyBool_FromLong(s->owner != 0); }

static PyObject *lock_held(Lock *s, PyObject *unused) {
    return PyBool_FromLong(s->owner != 0 && s->owner == PyThread_get_thread_ident());
}

static PyMethodDef lock_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))lock_acquire, METH_VARARGS | METH_KEYWORDS, NULL},
    {"release", (PyCFunction)lock_release, METH_NOARGS, NULL},
    {"locked", (PyCFunction)lock_locked, METH_NOARGS, NULL},
    {"held", (PyCFunction)lock_held, METH_NOARGS,
     "Whether the calling thread holds the lock."},
    {"__enter__", (PyCFunction)(void (*)(void))lock_acquire, METH_VARARGS | METH_KEYWORDS, NULL},
    {"__exit__", (PyCFunction)lock_exit, METH_VARARGS, NULL},
    {NULL},
};

static PyTypeObject LockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "nnhal_session_fastrun.Lock",
    .tp_basicsize = sizeof(Lock),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = lock_new,
    .tp_dealloc = (destructor)lock_dealloc,
    .tp_methods = lock_methods,
};

/* ---- FastRun -------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *names;      /* tuple of str: the inputs, in order */
    PyObject *dtypes;     /* tuple of numpy dtypes, per input */
    PyObject *converting; /* the Session's set of threads converting feeds */
    PyObject *acquire;    /* the Session's lock's acquire and release (a lock of another
                           * type than Lock) */
    PyObject *release;
    PyObject *lock;       /* the Session's Lock, or NULL */
    PyObject *state;      /* the Session's __dict__ */
    PyObject *guard_key;  /* state[guard_key] must be guard_value ... */
    PyObject *guard_value;
    PyObject *holder;     /* ... and, unless NULL, holder.runner must be runner */
    PyObject *runner;
    PyObject *call;       /* callable(list of arrays) -> list of outputs, or None */
    PyObject *on_none;    /* callable(), under the lock, when `call` answered None */
    PyObject *out_names;  /* tuple of str: the outputs `call` gives, in order */
    PyObject *usual;      /* Session.run (the function) */
    PyObject *me;         /* a weak reference to the Session */
    int note_owner;       /* whether state["_owner"] is this thread during the call */
    unsigned long ident;  /* the thread last noted, and its number as an int */
    PyObject *ident_obj;
    nnhal_shapes shapes;  /* per input: its bound dimensions */
    vectorcallfunc vectorcall;
} FastRun;

static PyObject *s_owner, *s_runner;

#define EACH(V) V(names) V(dtypes) V(converting) V(acquire) V(release) V(lock) V(state) \
    V(guard_key) \
    V(guard_value) V(holder) V(runner) V(call) V(on_none) V(out_names) V(usual) V(me) \
    V(ident_obj)

static int fast_traverse(FastRun *s, visitproc visit, void *arg) {
#define VISIT(f) Py_VISIT(s->f);
    EACH(VISIT)
    return 0;
}

static int fast_clear(FastRun *s) {
#define CLEAR(f) Py_CLEAR(s->f);
    EACH(CLEAR)
    return 0;
}

static void fast_dealloc(FastRun *s) {
    PyObject_GC_UnTrack(s);
    fast_clear(s);
    nnhal_shapes_free(&s->shapes);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

/* The feeds as a list in input order when they are the bound layout's; NULL with no error
 * set when they are not; NULL with an error set when a lookup raised. */
static PyObject *match(FastRun *s, PyObject *feeds) {
    Py_ssize_t n = PyTuple_GET_SIZE(s->names);
    if (PyDict_GET_SIZE(feeds) != n) return NULL;
    PyObject *arrays = PyList_New(n);
    if (arrays == NULL) return NULL;
    npy_intp *dims = s->shapes.dims;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *a = PyDict_GetItemWithError(feeds, PyTuple_GET_ITEM(s->names, k));
        if (a == NULL || !nnhal_has_dims(a, &dims, s->shapes.ndims[k])) goto no;
        PyArray_Descr *want = (PyArray_Descr *)PyTuple_GET_ITEM(s->dtypes, k);
        PyArray_Descr *have = PyArray_DESCR((PyArrayObject *)a);
        if (have != want && !PyArray_EquivTypes(have, want)) goto no;
        Py_INCREF(a);
        PyList_SET_ITEM(arrays, k, a);
    }
    return arrays;
no:
    Py_DECREF(arrays);
    return NULL;
}

static PyObject *as_dict(PyObject *names, PyObject *outs) {
    PyObject *d = PyDict_New();
    if (d == NULL) return NULL;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(names); k++)
        if (PyDict_SetItem(d, PyTuple_GET_ITEM(names, k), PyList_GET_ITEM(outs, k)) < 0) {
            Py_DECREF(d);
            return NULL;
        }
    return d;
}

/* Whether the binding is still the Session's: 1, 0, or -1 with an error set. */
static int guarded(FastRun *s) {
    PyObject *v = PyDict_GetItemWithError(s->state, s->guard_key);
    if (v != s->guard_value) return v == NULL && PyErr_Occurred() ? -1 : 0;
    if (s->holder == NULL) return 1;
    PyObject *r = PyObject_GetAttr(s->holder, s_runner);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return r == s->runner;
}

static PyObject *fast_call(PyObject *self, PyObject *const *args, size_t nargsf,
                           PyObject *kwnames) {
    FastRun *s = (FastRun *)self;
    if (PyVectorcall_NARGS(nargsf) != 1 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "Session.run() takes one argument: the feeds");
        return NULL;
    }
    PyObject *feeds = args[0], *arrays = NULL;
    if (PyDict_CheckExact(feeds) && PySet_GET_SIZE(s->converting) == 0) {
        arrays = match(s, feeds);
        if (arrays == NULL && PyErr_Occurred()) return NULL;
    }
    if (arrays != NULL) {
        int took;
        if (s->lock != NULL) {
            took = lock_try((Lock *)s->lock);
        } else {
            PyObject *a[2] = {NULL, Py_False};
            PyObject *got = PyObject_Vectorcall(s->acquire, a + 1,
                                                1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            if (got == NULL) { Py_DECREF(arrays); return NULL; }
            Py_DECREF(got);
            took = got == Py_True;
        }
        if (took) {
            PyObject *result = NULL;
            int failed = 0;  /* an error was raised and is to go up */
            int ok = guarded(s);
            /* A Lock knows its holder: only another lock needs the owner noted. */
            int note = s->note_owner && s->lock == NULL && ok == 1;
            if (ok < 0) failed = 1;
            if (note) {
                unsigned long me = PyThread_get_thread_ident();
                if (s->ident_obj == NULL || s->ident != me) {
                    Py_CLEAR(s->ident_obj);
                    s->ident_obj = PyLong_FromUnsignedLong(me);
                    s->ident = me;
                }
                if (s->ident_obj == NULL || PyDict_SetItem(s->state, s_owner, s->ident_obj) < 0)
                    failed = 1;
            }
            if (ok == 1 && !failed) {
                PyObject *outs = nnhal_call1(s->call, arrays);
                if (outs == NULL) {
                    failed = 1;
                } else if (PyList_CheckExact(outs) &&
                           PyList_GET_SIZE(outs) == PyTuple_GET_SIZE(s->out_names)) {
                    result = as_dict(s->out_names, outs);
                    if (result == NULL) failed = 1;
                } else {
                    PyObject *r = PyObject_CallNoArgs(s->on_none);
                    if (r == NULL) failed = 1;
                    Py_XDECREF(r);
                }
                Py_XDECREF(outs);
            }
            /* As the twin's ``finally``: the owner cleared and the lock released, an error
             * raised meanwhile kept aside. */
            if (s->lock != NULL) {  /* (no owner noted: the Lock knows its holder) */
                lock_drop((Lock *)s->lock);
            } else {
                PyObject *et, *ev, *tb;
                PyErr_Fetch(&et, &ev, &tb);
                if (note && PyDict_SetItem(s->state, s_owner, Py_None) < 0) PyErr_Clear();
                PyObject *r = PyObject_CallNoArgs(s->release);
                if (r == NULL) PyErr_Clear();
                Py_XDECREF(r);
                PyErr_Restore(et, ev, tb);
            }
            if (failed || result != NULL) {
                Py_DECREF(arrays);
                return result;
            }
        }
        Py_DECREF(arrays);
    }
    PyObject *session = PyWeakref_GetObject(s->me);
    if (session == Py_None) {
        PyErr_SetString(PyExc_RuntimeError, "the session is gone");
        return NULL;
    }
    PyObject *c[3] = {NULL, session, feeds};
    Py_INCREF(session);
    PyObject *r = PyObject_Vectorcall(s->usual, c + 1, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(session);
    return r;
}

static PyObject *fast_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"names", "dtypes", "shapes", "converting", "lock", "state",
                             "guard_key", "guard_value", "holder", "runner", "call", "on_none",
                             "out_names", "usual", "me", "note_owner", NULL};
    PyObject *names, *dtypes, *shapes, *converting, *lock, *state, *guard_key, *guard_value,
        *holder, *runner, *call, *on_none, *out_names, *usual, *me;
    int note_owner;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O!O!O!OO!UOOOOOO!OO!p", kwlist,
                                     &PyTuple_Type, &names, &PyTuple_Type, &dtypes,
                                     &PyTuple_Type, &shapes, &PySet_Type, &converting, &lock,
                                     &PyDict_Type, &state, &guard_key, &guard_value, &holder,
                                     &runner, &call, &on_none, &PyTuple_Type, &out_names,
                                     &usual, &_PyWeakref_RefType, &me, &note_owner))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    if (PyTuple_GET_SIZE(dtypes) != n || PyTuple_GET_SIZE(shapes) != n) {
        PyErr_SetString(PyExc_ValueError, "names, dtypes and shapes: one per input");
        return NULL;
    }
    for (Py_ssize_t k = 0; k < n; k++)
        if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(names, k)) ||
            !PyArray_DescrCheck(PyTuple_GET_ITEM(dtypes, k))) {
            PyErr_SetString(PyExc_TypeError, "per input: a str name, a dtype, a shape tuple");
            return NULL;
        }
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(out_names); k++)
        if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(out_names, k))) {
            PyErr_SetString(PyExc_TypeError, "out_names: str");
            return NULL;
        }
    PyObject *acquire = NULL, *release = NULL;
    int native = PyObject_TypeCheck(lock, &LockType);
    if (!native) {
        acquire = PyObject_GetAttrString(lock, "acquire");
        release = acquire ? PyObject_GetAttrString(lock, "release") : NULL;
        if (release == NULL) { Py_XDECREF(acquire); return NULL; }
    }
    FastRun *s = (FastRun *)type->tp_alloc(type, 0);
    if (s == NULL) { Py_XDECREF(acquire); Py_XDECREF(release); return NULL; }
    s->acquire = acquire;
    s->release = release;
    s->lock = native ? Py_NewRef(lock) : NULL;
    if (nnhal_shapes_read(shapes, 0, &s->shapes) < 0) {
        Py_DECREF(s);
        return NULL;
    }
    s->names = Py_NewRef(names);
    s->dtypes = Py_NewRef(dtypes);
    s->converting = Py_NewRef(converting);
    s->state = Py_NewRef(state);
    s->guard_key = Py_NewRef(guard_key);
    s->guard_value = Py_NewRef(guard_value);
    s->holder = holder == Py_None ? NULL : Py_NewRef(holder);
    s->runner = Py_NewRef(runner);
    s->call = Py_NewRef(call);
    s->on_none = Py_NewRef(on_none);
    s->out_names = Py_NewRef(out_names);
    s->usual = Py_NewRef(usual);
    s->me = Py_NewRef(me);
    s->note_owner = note_owner;
    s->vectorcall = fast_call;
    return (PyObject *)s;
}

static PyObject *fast_get_doc(PyObject *self, void *closure) {
    FastRun *s = (FastRun *)self;
    if (s->usual == NULL) Py_RETURN_NONE;
    return PyObject_GetAttrString(s->usual, "__doc__");
}

static PyGetSetDef fast_getset[] = {
    {"__doc__", fast_get_doc, NULL, NULL, NULL},
    {NULL},
};

static PyTypeObject FastRunType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "nnhal_session_fastrun.FastRun",
    .tp_basicsize = sizeof(FastRun),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = fast_new,
    .tp_dealloc = (destructor)fast_dealloc,
    .tp_traverse = (traverseproc)fast_traverse,
    .tp_clear = (inquiry)fast_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(FastRun, vectorcall),
    .tp_getset = fast_getset,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "nnhal_session_fastrun", NULL, -1,
                                    NULL};

PyMODINIT_FUNC PyInit_nnhal_session_fastrun(void) {
    import_array();
    if (PyType_Ready(&FastRunType) < 0 || PyType_Ready(&LockType) < 0) return NULL;
    if ((s_owner = PyUnicode_InternFromString("_owner")) == NULL) return NULL;
    if ((s_runner = PyUnicode_InternFromString("runner")) == NULL) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "FastRun", (PyObject *)&FastRunType) < 0 ||
        PyModule_AddObjectRef(m, "Lock", (PyObject *)&LockType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
