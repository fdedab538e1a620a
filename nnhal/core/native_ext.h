/* What nnhal's CPython extensions (core.native.build_extension) share: a one-argument call,
 * and bound shapes as plain dimensions, read once at construction and compared per call.
 * Include after <Python.h> and <numpy/arrayobject.h> (the functions use the including
 * module's numpy API table). */
#ifndef NNHAL_NATIVE_EXT_H
#define NNHAL_NATIVE_EXT_H

/* f(a), with no tuple made. */
static inline PyObject *nnhal_call1(PyObject *f, PyObject *a) {
    PyObject *args[2] = {NULL, a};
    return PyObject_Vectorcall(f, args + 1, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* Bound shapes: per entry its dimensions, concatenated in `dims`, and their count in
 * `ndims` (-1: not known, when `none_ok` lets an entry be None). */
typedef struct {
    npy_intp *dims;
    int *ndims;
} nnhal_shapes;

/* `shapes`, a tuple of int tuples (or None where `none_ok`), into `out`; 0, or -1 with an
 * error set (nothing left allocated). */
static inline int nnhal_shapes_read(PyObject *shapes, int none_ok, nnhal_shapes *out) {
    out->dims = NULL;
    out->ndims = NULL;
    if (!PyTuple_CheckExact(shapes)) {
        PyErr_SetString(PyExc_TypeError, "shapes: a tuple of shape tuples");
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(shapes), total = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *shape = PyTuple_GET_ITEM(shapes, k);
        if (shape == Py_None && none_ok) continue;
        if (!PyTuple_CheckExact(shape) || PyTuple_GET_SIZE(shape) > NPY_MAXDIMS) {
            PyErr_SetString(PyExc_TypeError, "shapes: a tuple of shape tuples");
            return -1;
        }
        total += PyTuple_GET_SIZE(shape);
    }
    out->dims = PyMem_Calloc((size_t)total + 1, sizeof(npy_intp));
    out->ndims = PyMem_Calloc((size_t)n + 1, sizeof(int));
    if (out->dims == NULL || out->ndims == NULL) goto fail;
    npy_intp *dims = out->dims;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *shape = PyTuple_GET_ITEM(shapes, k);
        out->ndims[k] = -1;
        if (shape == Py_None) continue;
        Py_ssize_t nd = PyTuple_GET_SIZE(shape);
        for (Py_ssize_t j = 0; j < nd; j++) {
            dims[j] = (npy_intp)PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, j));
            if (dims[j] == -1 && PyErr_Occurred()) goto fail;
        }
        out->ndims[k] = (int)nd;
        dims += nd;
    }
    return 0;
fail:
    if (!PyErr_Occurred()) PyErr_NoMemory();
    PyMem_Free(out->dims);
    PyMem_Free(out->ndims);
    out->dims = NULL;
    out->ndims = NULL;
    return -1;
}

static inline void nnhal_shapes_free(nnhal_shapes *s) {
    PyMem_Free(s->dims);
    PyMem_Free(s->ndims);
    s->dims = NULL;
    s->ndims = NULL;
}

/* Whether `a` is an ndarray exactly (no subclass) of the dimensions at `*dims` (`nd` of
 * them; -1: never), `*dims` moved past them either way. */
static inline int nnhal_has_dims(PyObject *a, npy_intp **dims, int nd) {
    npy_intp *want = *dims;
    if (nd < 0) return 0;
    *dims += nd;
    return PyArray_CheckExact(a) && PyArray_NDIM((PyArrayObject *)a) == nd &&
           memcmp(PyArray_DIMS((PyArrayObject *)a), want, (size_t)nd * sizeof(npy_intp)) == 0;
}

#endif
