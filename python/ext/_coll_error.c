/*
 * _coll_error.c - what the two collectives of the extension (_collective.c:
 * Segment.allreduce_min and friends; _hier.c: HierGroup) share: a group id
 * argument, and raising kvcoord.CollectiveError with its attributes.
 */
#include "_kvcoord.h" /* Python.h first */

int kvcpy_conv_group(PyObject *o, void *out)
{
    if (!PyLong_Check(o) || PyBool_Check(o)) {
        PyErr_Format(PyExc_TypeError, "group must be an int, not %.100s", Py_TYPE(o)->tp_name);
        return 0;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "group must be in 0..2**64-1, not %R", o);
        return 0;
    }
    *(uint64_t *)out = (uint64_t)v;
    return 1;
}

/* The list of the ranks whose bits are set in mask, lowest first (a new
 * reference), or NULL with an exception set. */
static PyObject *rank_list(uint64_t mask)
{
    PyObject *ranks = PyList_New(0);
    for (int r = 0; ranks && r < 64; r++) {
        if (!(mask >> r & 1))
            continue;
        PyObject *v = PyLong_FromLong(r);
        if (!v || PyList_Append(ranks, v) < 0)
            Py_CLEAR(ranks);
        Py_XDECREF(v);
    }
    return ranks;
}

PyObject *kvcpy_raise_coll(kvc_err e, uint64_t ranks, const kvcpy_attr *extra, size_t n)
{
    PyObject *exc = PyObject_CallFunction(kvcpy_CollectiveError, "s", kvc_last_error());
    if (!exc) {
        for (size_t i = 0; i < n; i++)
            Py_XDECREF(extra[i].value);
        return NULL;
    }
    const kvcpy_attr common[] = {
        {"code", PyLong_FromLong((long)e)},
        {"code_name", PyUnicode_FromString(kvc_strerror(e))},
        {"ranks", rank_list(ranks)},
    };
    const size_t nc = sizeof common / sizeof *common;
    int ok = 1;
    for (size_t i = 0; i < nc + n; i++) {
        const kvcpy_attr *a = i < nc ? &common[i] : &extra[i - nc];
        if (!a->value || PyObject_SetAttrString(exc, a->name, a->value) < 0)
            ok = 0;
        Py_XDECREF(a->value);
    }
    if (ok)
        PyErr_SetObject(kvcpy_CollectiveError, exc);
    Py_DECREF(exc);
    return NULL;
}
