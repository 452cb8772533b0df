/*
 * _module.c - module kvcoord._kvcoord: exceptions and the mapping of
 * kvc_err codes onto them, argument converters, the fork rule, and the
 * module-level functions (names, versions, error texts).
 */
#include "_kvcoord.h" /* Python.h first */

#include <limits.h>
#include <math.h>
#include <time.h>
#include <unistd.h>

PyObject *kvcpy_Error, *kvcpy_NotFoundError, *kvcpy_WithdrawnError, *kvcpy_InvalidError,
    *kvcpy_TimeoutError, *kvcpy_SegmentNotFoundError, *kvcpy_ForkedError, *kvcpy_FullError,
    *kvcpy_ClosedError;
PyObject *kvcpy_kvpoll[5];
volatile unsigned long kvcpy_fork_gen;

/* ---- fork rule ---------------------------------------------------------- */

/* A handle inherited across fork() belongs to the parent (its process
 * entry, its rooms' participant records): the child must open its own. */
static void after_fork_child(void) { kvcpy_fork_gen++; }

/* ---- errors ------------------------------------------------------------- */

static PyObject *error_class(kvc_err e, int open_call)
{
    switch (e) {
    case KVC_E_INVAL:
    case KVC_E_CAPACITY:
    case KVC_E_TOOBIG: return kvcpy_InvalidError;
    case KVC_E_NOENT: return open_call ? kvcpy_SegmentNotFoundError : kvcpy_NotFoundError;
    case KVC_E_WITHDRAWN: return kvcpy_WithdrawnError;
    case KVC_E_TIMEDOUT: return kvcpy_TimeoutError;
    case KVC_E_FULL: return kvcpy_FullError;
    default: return kvcpy_Error;
    }
}

PyObject *kvcpy_raise(kvc_err e, int open_call)
{
    const char *msg = kvc_last_error();
    return kvcpy_raise_msg(e, open_call, *msg ? msg : kvc_strerror(e));
}

PyObject *kvcpy_raise_msg(kvc_err e, int open_call, const char *msg)
{
    return kvcpy_raise_as(error_class(e, open_call), e, msg);
}

PyObject *kvcpy_raise_as(PyObject *cls, kvc_err e, const char *msg)
{
    /* Each step may fail (MemoryError): that exception is then the one
     * raised, and every reference taken so far is dropped. */
    PyObject *exc = PyObject_CallFunction(cls, "s", msg);
    if (!exc)
        return NULL;
    PyObject *code = PyLong_FromLong((long)e);
    PyObject *name = code ? PyUnicode_FromString(kvc_strerror(e)) : NULL;
    if (name && !PyObject_SetAttrString(exc, "code", code) &&
        !PyObject_SetAttrString(exc, "code_name", name))
        PyErr_SetObject(cls, exc);
    Py_XDECREF(code);
    Py_XDECREF(name);
    Py_DECREF(exc);
    return NULL;
}

PyObject *kvcpy_fail(int e)
{
    if (e == KVCPY_E_RAISED)
        return NULL; /* kvcpy_seg_enter raised */
    return kvcpy_raise((kvc_err)e, 0);
}

PyObject *kvcpy_listing(SegmentObject *s, kvcpy_lister fn, const void *ctx, size_t size, size_t cap,
                        PyObject *(*make)(const void *item))
{
    size_t count = 0;
    for (;;) {
        void *v = PyMem_Calloc(cap ? cap : 1, size);
        if (!v)
            return PyErr_NoMemory();
        int e;
        KVCPY_RUN(s, e, fn(g, v, cap, &count, ctx));
        if (e) {
            PyMem_Free(v);
            return kvcpy_fail(e);
        }
        if (count <= cap) {
            PyObject *list = kvcpy_list_of(v, count, size, make);
            PyMem_Free(v);
            return list;
        }
        PyMem_Free(v);
        cap = count + count / 4 + 16; /* room for what was added meanwhile */
    }
}

PyObject *kvcpy_list_of(const void *items, size_t n, size_t size,
                        PyObject *(*make)(const void *item))
{
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *o = make((const char *)items + i * size);
        if (!o) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, o);
    }
    return list;
}

PyObject *kvcpy_state(int s)
{
    if (s >= 0 && s <= 4 && kvcpy_kvpoll[s]) {
        Py_INCREF(kvcpy_kvpoll[s]);
        return kvcpy_kvpoll[s];
    }
    return PyLong_FromLong(s);
}

/* ---- argument converters ------------------------------------------------ */

int kvcpy_conv_range(PyObject *o, long long lo, long long hi, const char *what, const char *note,
                     long long *out)
{
    if (!PyLong_Check(o) || PyBool_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int%s, not %.100s", what, note,
                     Py_TYPE(o)->tp_name);
        return 0;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred())
        return 0;
    if (overflow || v < lo || v > hi) {
        PyErr_Format(PyExc_ValueError, "%s must be in %lld..%lld%s, not %R", what, lo, hi, note, o);
        return 0;
    }
    *out = v;
    return 1;
}

int kvcpy_conv_uint(PyObject *o, unsigned long long max, const char *what, const char *alt,
                    unsigned long long *out)
{
    long long v;
    if (!kvcpy_conv_range(o, 0, max > (unsigned long long)LLONG_MAX ? LLONG_MAX : (long long)max,
                          what, alt, &v))
        return 0;
    *out = (unsigned long long)v;
    return 1;
}

int kvcpy_conv_rank(PyObject *o, void *out)
{
    unsigned long long v;
    if (!kvcpy_conv_uint(o, KVC_RANK_MAX, "rank", "", &v))
        return 0;
    *(uint32_t *)out = (uint32_t)v;
    return 1;
}

int kvcpy_conv_participants(PyObject *o, void *out)
{
    unsigned long long v;
    if (!kvcpy_conv_uint(o, KVC_ROOM_MAX_PARTICIPANTS, "participants", "", &v))
        return 0;
    *(uint32_t *)out = (uint32_t)v;
    return 1;
}

int kvcpy_conv_room(PyObject *o, void *out)
{
    unsigned long long v;
    if (!kvcpy_conv_uint(o, (unsigned long long)INT64_MAX, "bootstrap room", "", &v))
        return 0;
    *(uint64_t *)out = (uint64_t)v;
    return 1;
}

int kvcpy_conv_code(PyObject *o, void *out)
{
    long long v;
    if (!kvcpy_conv_range(o, INT32_MIN, INT32_MAX, "failure code", " (an errno or RDMA status)",
                          &v))
        return 0;
    *(int *)out = (int)v;
    return 1;
}

int kvcpy_conv_state(PyObject *o, void *out)
{
    unsigned long long v;
    if (!kvcpy_conv_uint(o, 4, "KVPoll state", "", &v))
        return 0;
    *(int *)out = (int)v;
    return 1;
}

int kvcpy_conv_timeout(PyObject *o, void *out)
{
    if (o == Py_None) {
        *(double *)out = -1.0;
        return 1;
    }
    if (PyBool_Check(o) || !(PyLong_Check(o) || PyFloat_Check(o))) {
        PyErr_Format(PyExc_TypeError, "timeout must be a number of seconds or None, not %.100s",
                     Py_TYPE(o)->tp_name);
        return 0;
    }
    double t = PyFloat_AsDouble(o);
    if (t == -1.0 && PyErr_Occurred())
        return 0;
    if (isnan(t) || t < 0) {
        PyErr_Format(PyExc_ValueError, "timeout must be >= 0 seconds (or None), not %R", o);
        return 0;
    }
    *(double *)out = t;
    return 1;
}

double kvcpy_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

uint32_t kvcpy_slice_ms(double deadline)
{
    if (deadline < 0)
        return KVCPY_WAIT_SLICE_MS;
    double left = (deadline - kvcpy_now()) * 1000.0;
    if (left <= 0)
        return 0;
    if (left >= KVCPY_WAIT_SLICE_MS)
        return KVCPY_WAIT_SLICE_MS;
    return (uint32_t)ceil(left);
}

/* ---- module functions --------------------------------------------------- */

static PyObject *mod_name_for_port(PyObject *m, PyObject *arg)
{
    (void)m;
    unsigned long long port;
    if (!kvcpy_conv_uint(arg, 65535, "port", "", &port))
        return NULL;
    char buf[32];
    kvc_name_for_port((uint16_t)port, buf, sizeof buf);
    return PyUnicode_FromString(buf);
}

static PyObject *mod_name_check(PyObject *m, PyObject *arg)
{
    (void)m;
    if (!PyUnicode_Check(arg))
        return PyErr_Format(PyExc_TypeError, "segment name must be a str, not %.100s",
                            Py_TYPE(arg)->tp_name);
    Py_ssize_t n;
    const char *name = PyUnicode_AsUTF8AndSize(arg, &n);
    if (!name)
        return NULL;
    if ((size_t)n != strlen(name))
        return PyErr_Format(kvcpy_InvalidError, "segment name contains a NUL byte");
    kvc_err e = kvc_name_check(name);
    if (e)
        return kvcpy_raise(e, 0);
    Py_RETURN_NONE;
}

static PyObject *mod_unlink(PyObject *m, PyObject *arg)
{
    if (!mod_name_check(m, arg))
        return NULL;
    Py_DECREF(Py_None);
    const char *name = PyUnicode_AsUTF8(arg);
    kvc_err e;
    Py_BEGIN_ALLOW_THREADS
    e = kvc_unlink(name);
    Py_END_ALLOW_THREADS
    if (e)
        return kvcpy_raise(e, 1);
    Py_RETURN_NONE;
}

static PyObject *mod_strerror(PyObject *m, PyObject *arg)
{
    (void)m;
    long code = PyLong_AsLong(arg);
    if (code == -1 && PyErr_Occurred())
        return NULL;
    return PyUnicode_FromString(kvc_strerror((kvc_err)code));
}

static PyObject *mod_wait_status_text(PyObject *m, PyObject *arg)
{
    (void)m;
    long long status;
    if (!kvcpy_conv_range(arg, INT32_MIN, INT32_MAX, "wait status", "", &status))
        return NULL;
    char buf[96];
    return PyUnicode_FromString(kvc_wait_status_text((int)status, buf, sizeof buf));
}

/* _register_kvpoll(KVPoll): states are returned as members of that enum. */
static PyObject *mod_register_kvpoll(PyObject *m, PyObject *cls)
{
    (void)m;
    PyObject *members[5];
    for (int i = 0; i < 5; i++) {
        members[i] = PyObject_CallFunction(cls, "i", i);
        if (!members[i]) {
            while (i--)
                Py_DECREF(members[i]);
            return NULL;
        }
    }
    for (int i = 0; i < 5; i++) {
        Py_XSETREF(kvcpy_kvpoll[i], members[i]);
    }
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"name_for_port", mod_name_for_port, METH_O,
     "name_for_port(port: int) -> str\n\nThe default segment name for an HTTP port "
     "(\"kvcoord-<port>\").  ValueError outside 0..65535, TypeError for a non-int.  "
     "Thread-safe."},
    {"name_check", mod_name_check, METH_O,
     "name_check(name: str) -> None\n\nCheck a segment name as the C library does: 1..200 "
     "bytes of [A-Za-z0-9._-], not '.' or '..', not starting with '-'.  Raises "
     "InvalidArgumentError (a ValueError) naming the bad byte, TypeError for a non-str.  "
     "Thread-safe."},
    {"unlink", mod_unlink, METH_O,
     "unlink(name: str) -> None\n\nRemove segment `name` from /dev/shm (attached processes "
     "keep their mapping).  SegmentNotFoundError (a FileNotFoundError) when there is none, "
     "InvalidArgumentError for a bad name, Error otherwise.  Releases the GIL; thread-safe."},
    {"strerror", mod_strerror, METH_O,
     "strerror(code: int) -> str\n\nShort fixed description of a kvc_err code.  Thread-safe."},
    {"wait_status_text", mod_wait_status_text, METH_O,
     "wait_status_text(status: int) -> str\n\nDescribe a wait(2) status as the library does "
     "(\"exited with status N\", \"killed by signal N (NAME)\").  Thread-safe."},
    {"_register_kvpoll", mod_register_kvpoll, METH_O,
     "_register_kvpoll(KVPoll) -> None\n\nInternal: states are returned as KVPoll members."},
    {"_register_transfer_error", kvcpy_register_transfer_error, METH_O,
     "_register_transfer_error(KVTransferError) -> None\n\nInternal: the class "
     "Segment.check_room raises."},
    {"_transfer_error", kvcpy_transfer_error, METH_O,
     "_transfer_error(FailureInfo) -> KVTransferError\n\nInternal: kvcoord.transfer_error() "
     "for a FailureInfo."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "kvcoord._kvcoord",
    "C layer of the kvcoord package over libkvcoord (use the package `kvcoord`).",
    -1,
    module_methods,
    NULL,
    NULL,
    NULL,
    NULL};

/* Exception `name` (kvcoord.<name>) with bases (a new reference, stolen;
 * NULL when building it failed) added to m; stored in *out.  0, or -1 with
 * an exception set and nothing kept. */
static int new_error(PyObject *m, PyObject **out, const char *name, PyObject *bases,
                     const char *doc)
{
    if (!bases)
        return -1;
    char qual[96];
    snprintf(qual, sizeof qual, "kvcoord.%s", name);
    PyObject *cls = PyErr_NewExceptionWithDoc(qual, doc, bases, NULL);
    Py_DECREF(bases);
    if (!cls)
        return -1;
    if (PyModule_AddObjectRef(m, name, cls) < 0) {
        Py_DECREF(cls);
        return -1;
    }
    Py_XSETREF(*out, cls); /* the module and *out each hold a reference */
    return 0;
}

static int add_errors(PyObject *m)
{
    if (new_error(m, &kvcpy_Error, "Error", Py_BuildValue("(O)", PyExc_Exception),
                  "A libkvcoord failure.  .code is the kvc_err code (int), "
                  ".code_name its fixed description; str() is the library's message.") < 0)
        return -1;
    PyObject *E = kvcpy_Error;
    if (new_error(m, &kvcpy_NotFoundError, "NotFoundError",
                  Py_BuildValue("(OO)", E, PyExc_KeyError),
                  "No such rank or room (a KeyError; code KVC_E_NOENT).") < 0 ||
        new_error(m, &kvcpy_WithdrawnError, "WithdrawnError",
                  Py_BuildValue("(O)", kvcpy_NotFoundError),
                  "The rank was registered, then withdrawn (a KeyError; the "
                  "message gives the note saying why).") < 0 ||
        new_error(m, &kvcpy_InvalidError, "InvalidArgumentError",
                  Py_BuildValue("(OO)", E, PyExc_ValueError),
                  "An argument the library refused (a ValueError): bad name, "
                  "rank beyond the segment's capacity, invalid JSON, too big.") < 0 ||
        new_error(m, &kvcpy_TimeoutError, "WaitTimeoutError",
                  Py_BuildValue("(OO)", E, PyExc_TimeoutError),
                  "A wait ran out of time (a TimeoutError).") < 0 ||
        new_error(m, &kvcpy_SegmentNotFoundError, "SegmentNotFoundError",
                  Py_BuildValue("(OO)", E, PyExc_FileNotFoundError),
                  "No such segment in /dev/shm (a FileNotFoundError): kvcoordd is not running "
                  "or serves another port.") < 0 ||
        new_error(m, &kvcpy_ForkedError, "ForkedSegmentError", Py_BuildValue("(O)", E),
                  "A Segment opened before fork() was used in the child: open "
                  "a new Segment in the child.") < 0 ||
        new_error(m, &kvcpy_FullError, "FullError", Py_BuildValue("(O)", E),
                  "A table of the segment is full (code KVC_E_FULL): its "
                  "process table, its rooms or its info arena; the message says "
                  "which and how to make it larger.") < 0 ||
        new_error(m, &kvcpy_ClosedError, "SegmentClosedError",
                  Py_BuildValue("(OO)", E, PyExc_ValueError),
                  "A call on a Segment after close() started (a ValueError, as for a "
                  "closed file; code KVC_E_INVAL).") < 0)
        return -1;
    return 0;
}

static int add_constants(PyObject *m)
{
    return PyModule_AddStringConstant(m, "VERSION", KVC_VERSION) ||
                   PyModule_AddIntConstant(m, "LAYOUT_VERSION", KVC_LAYOUT_VERSION) ||
                   PyModule_AddIntConstant(m, "DEFAULT_PORT", KVC_DEFAULT_PORT) ||
                   PyModule_AddIntConstant(m, "NAME_MAX", KVC_NAME_MAX) ||
                   PyModule_AddIntConstant(m, "SESSION_ID_MAX", KVC_SESSION_ID_MAX) ||
                   PyModule_AddIntConstant(m, "REASON_MAX", KVC_REASON_MAX) ||
                   PyModule_AddIntConstant(m, "ROOM_MAX_PARTICIPANTS", KVC_ROOM_MAX_PARTICIPANTS) ||
                   PyModule_AddIntConstant(m, "FAILURE_RING", KVC_FAILURE_RING) ||
                   PyModule_AddIntConstant(m, "ORIGIN_RANK_NONE", (long)KVC_ORIGIN_RANK_NONE) ||
                   PyModule_AddIntConstant(m, "RANK_ROLES", KVC_RANK_ROLES) ||
                   PyModule_AddIntConstant(m, "COLL_GROUPS", KVC_COLL_GROUPS) ||
                   PyModule_AddIntConstant(m, "COLL_MAX_SIZE", KVC_COLL_MAX_SIZE) ||
                   PyModule_AddStringConstant(m, "DEFAULT_ROLE", KVC_DEFAULT_ROLE)
               ? -1
               : 0; /* each returns -1 on failure */
}

PyMODINIT_FUNC PyInit__kvcoord(void);

PyMODINIT_FUNC PyInit__kvcoord(void)
{
    static int atfork_done;
    if (!atfork_done && pthread_atfork(NULL, NULL, after_fork_child) == 0)
        atfork_done = 1;
    if (PyType_Ready(&kvcpy_SegmentType) < 0 || PyType_Ready(&kvcpy_RankInfoType) < 0 ||
        kvcpy_rooms_init_types() < 0 || kvcpy_pd_init() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    if (add_errors(m) < 0 || kvcpy_collective_init(m) < 0 || kvcpy_hier_init(m) < 0 ||
        kvcpy_pollcall_init(m) < 0 || kvcpy_roomset_init(m) < 0 || add_constants(m) < 0 ||
        PyModule_AddObjectRef(m, "Segment", (PyObject *)&kvcpy_SegmentType) < 0 ||
        PyModule_AddObjectRef(m, "RankInfo", (PyObject *)&kvcpy_RankInfoType) < 0 ||
        PyModule_AddObjectRef(m, "RoomInfo", (PyObject *)&kvcpy_RoomInfoType) < 0 ||
        PyModule_AddObjectRef(m, "FailureInfo", (PyObject *)&kvcpy_FailureInfoType) < 0 ||
        PyModule_AddObjectRef(m, "ProcInfo", (PyObject *)&kvcpy_ProcInfoType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
