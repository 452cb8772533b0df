/*
 * _collective.c - Segment.allreduce_min (kvc_allreduce_min_ex) and
 * kvcoord.CollectiveError.
 */
#include "_kvcoord.h" /* Python.h first */

#include <math.h>
#include <string.h>

PyObject *kvcpy_CollectiveError;

int kvcpy_collective_init(PyObject *m)
{
    kvcpy_CollectiveError = PyErr_NewExceptionWithDoc(
        "kvcoord.CollectiveError",
        "A collective call (Segment.allreduce_min) failed because of a peer: a rank of the "
        "group died or left the segment (.dead True), or did not arrive within the timeout "
        "(.dead False).  .ranks: the list of those ranks; .group, .generation: the group id "
        "and the round that failed; .pid: the pid of the lowest of those ranks (0 if unknown); "
        ".code / .code_name as for every kvcoord.Error (KVC_E_PEER or KVC_E_TIMEDOUT).  Every "
        "rank of the failed call raises it, with the same ranks.  After a timeout the group's next "
        "call works again; after a death (.dead True) every later call of the group's epoch "
        "raises it too, until all of its processes died or left (then new processes re-form "
        "the group); a new process that would take a rank while some of the epoch's members "
        "live and one died or left raises it naming the gone rank.",
        kvcpy_Error, NULL);
    if (!kvcpy_CollectiveError ||
        PyModule_AddObjectRef(m, "CollectiveError", kvcpy_CollectiveError) < 0)
        return -1;
    return 0;
}

/* A group id: an int 0..2**64-1.  1, or 0 with TypeError / ValueError. */
static int conv_group(PyObject *o, uint64_t *out)
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
    *out = (uint64_t)v;
    return 1;
}

/* Raise CollectiveError for e (KVC_E_PEER, KVC_E_TIMEDOUT) from *why. */
static PyObject *raise_collective(kvc_err e, const kvc_coll_failure *why)
{
    PyObject *exc = PyObject_CallFunction(kvcpy_CollectiveError, "s", kvc_last_error());
    if (!exc)
        return NULL;
    PyObject *ranks = PyList_New(0);
    for (int r = 0; ranks && r < 64; r++) {
        if (!(why->ranks >> r & 1))
            continue;
        PyObject *v = PyLong_FromLong(r);
        if (!v || PyList_Append(ranks, v) < 0)
            Py_CLEAR(ranks);
        Py_XDECREF(v);
    }
    PyObject *attrs[][2] = {
        {PyUnicode_FromString("code"), PyLong_FromLong((long)e)},
        {PyUnicode_FromString("code_name"), PyUnicode_FromString(kvc_strerror(e))},
        {PyUnicode_FromString("ranks"), ranks},
        {PyUnicode_FromString("dead"), PyBool_FromLong(why->dead)},
        {PyUnicode_FromString("group"), PyLong_FromUnsignedLongLong(why->group)},
        {PyUnicode_FromString("generation"), PyLong_FromUnsignedLongLong(why->generation)},
        {PyUnicode_FromString("pid"), PyLong_FromLong(why->pid)},
    };
    int ok = 1;
    for (size_t i = 0; i < sizeof attrs / sizeof *attrs; i++) {
        if (!attrs[i][0] || !attrs[i][1] || PyObject_SetAttr(exc, attrs[i][0], attrs[i][1]) < 0)
            ok = 0;
        Py_XDECREF(attrs[i][0]);
        Py_XDECREF(attrs[i][1]);
    }
    if (ok)
        PyErr_SetObject(kvcpy_CollectiveError, exc);
    Py_DECREF(exc);
    return NULL;
}

/* data as a PyMem copy of its bytes: a contiguous buffer of 1-byte items
 * (bytes, bytearray, memoryview, array('B')), or a sequence of ints
 * 0..255.  -1 with an exception set. */
static int data_bytes(PyObject *data, uint8_t **out, size_t *len)
{
    if (PyObject_CheckBuffer(data)) {
        Py_buffer view;
        if (PyObject_GetBuffer(data, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
            return -1;
        if (view.itemsize != 1) {
            PyErr_Format(PyExc_TypeError,
                         "data must be a buffer of bytes (item size 1), not items of %zd bytes",
                         view.itemsize);
            PyBuffer_Release(&view);
            return -1;
        }
        *len = (size_t)view.len;
        *out = PyMem_Malloc(*len ? *len : 1);
        if (*out && *len)
            memcpy(*out, view.buf, *len);
        PyBuffer_Release(&view);
        if (!*out) {
            PyErr_NoMemory();
            return -1;
        }
        return 0;
    }
    PyObject *seq = PySequence_Fast(data, "data must be bytes, bytearray, memoryview or a "
                                          "sequence of ints 0..255");
    if (!seq)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    *len = (size_t)n;
    *out = PyMem_Malloc(n ? (size_t)n : 1);
    if (!*out) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PySequence_Fast_GET_ITEM(seq, i);
        if (PyBool_Check(o) || !PyLong_Check(o)) {
            PyErr_Format(PyExc_TypeError, "data[%zd] must be an int 0..255, not %.100s", i,
                         Py_TYPE(o)->tp_name);
            goto bad;
        }
        int overflow = 0;
        long v = PyLong_AsLongAndOverflow(o, &overflow);
        if (v == -1 && PyErr_Occurred())
            goto bad;
        if (overflow || v < 0 || v > 255) {
            PyErr_Format(kvcpy_InvalidError, "data[%zd] is %R, not in 0..255", i, o);
            goto bad;
        }
        (*out)[i] = (uint8_t)v;
    }
    Py_DECREF(seq);
    return 0;
bad:
    Py_DECREF(seq);
    PyMem_Free(*out);
    *out = NULL;
    return -1;
}

const char kvcpy_doc_allreduce_min[] =
    "allreduce_min(group, size, rank, data, timeout=30.0) -> bytes\n\n"
    "Element-wise MIN all-reduce of a vector of bytes over the `size` processes of group "
    "`group` (an int 0..2**64-1 the ranks agree on) on this node, in the segment: every "
    "rank 0..size-1 calls it with its own data of the same length, and each gets back the "
    "MIN, position by position, over all ranks' data of the same call (each rank counts its "
    "own calls from its first in the group's epoch, every call that reached the group "
    "counting, failed or not: the k-th call of every rank reduces together or fails, never "
    "with another call).  data: bytes, bytearray, memoryview (items of one byte) "
    "or a sequence of ints 0..255, any length.  size: 1..64.  timeout: seconds to wait for "
    "the others (None: no limit); the call is not interrupted by signals meanwhile.  The "
    "first call of a group creates it; a segment holds 32 groups with a live member at once.  "
    "Epochs: a call as a rank of a group none of whose processes lives any more (all died "
    "or closed their segment: a restarted TP group) re-forms it, with this size, every "
    "rank counting from 0.\n"
    "Raises CollectiveError when a rank of the group died or left the segment (.dead True) "
    "or did not arrive within the timeout (.dead False), naming it in the message and in "
    ".ranks; every rank of that call raises it.  After a timeout the group's next call "
    "works again; after a death every later call of the epoch raises at once, until all "
    "its processes died or left; a new process that would take a rank while the epoch has "
    "a gone member and live ones raises it too (the gone rank in .ranks).  "
    "InvalidArgumentError for a size, rank or group size that differ from the group's, "
    "data of another length than the other ranks' (every rank of that call raises it), or "
    "a rank held by another live process; TypeError / ValueError for bad argument types and "
    "values; FullError when 32 groups are in use.  The Segment must be open with a role "
    "other than 'none' and used by the process that opened it.  Thread-safe (one thread per "
    "rank at a time); releases the GIL while it waits (close() from another thread waits for "
    "a call in progress, at most its timeout).";

PyObject *kvcpy_allreduce_min(SegmentObject *s, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"group", "size", "rank", "data", "timeout", NULL};
    PyObject *group_o, *size_o, *rank_o, *data, *timeout_o = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO|O", kwlist, &group_o, &size_o, &rank_o, &data,
                                     &timeout_o))
        return NULL;
    uint64_t group;
    unsigned long long size, rank;
    double timeout = 30.0;
    if (!conv_group(group_o, &group) || !kvcpy_conv_uint(size_o, UINT32_MAX, "size", "", &size) ||
        !kvcpy_conv_uint(rank_o, UINT32_MAX, "rank", "", &rank) ||
        (timeout_o && !kvcpy_conv_timeout(timeout_o, &timeout)))
        return NULL;
    uint32_t timeout_ms = UINT32_MAX;
    if (timeout >= 0 && timeout * 1000.0 < (double)UINT32_MAX)
        timeout_ms = (uint32_t)ceil(timeout * 1000.0);
    uint8_t *buf = NULL;
    size_t len = 0;
    if (data_bytes(data, &buf, &len) < 0)
        return NULL;
    kvc_coll_failure why;
    int e;
    KVCPY_RUN(
        s, e,
        kvc_allreduce_min_ex(g, group, (uint32_t)size, (uint32_t)rank, buf, len, timeout_ms, &why));
    PyObject *res = NULL;
    if (e == KVC_E_PEER || e == KVC_E_TIMEDOUT)
        raise_collective((kvc_err)e, &why);
    else if (e)
        kvcpy_fail(e);
    else
        res = PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)len);
    PyMem_Free(buf);
    return res;
}
