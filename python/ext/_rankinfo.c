/*
 * _rankinfo.c - RankInfo: one rank's entry as read from the rank table.
 *
 * weights_info_dict is decoded from the stored JSON on first access only (a
 * lookup that needs just the session_id never parses megabytes), and once
 * per object: json.loads is Python code, so the interpreter may switch
 * threads in the middle of it; a second thread asking meanwhile waits for
 * the first one's dict instead of decoding its own.  The rule (every field
 * is read and written with the GIL held):
 *
 *   - `decoder` is the thread decoding, 0 when none; it is set, and `once`
 *     acquired, in one step under the GIL (no Python code between them);
 *   - only the decoder holds `once` for longer than an acquire-release pair
 *     made with the GIL released, so a thread may block on it holding the
 *     GIL without deadlock;
 *   - the decoder stores `decoded` (or leaves it NULL on an error), clears
 *     `decoder` and releases `once`; a waiter then finds `decoded` set, or
 *     decodes itself when the first attempt failed.
 *
 * The dict is mutable and handed out as is, so a RankInfo may end up in a
 * reference cycle through it: the type supports the cyclic GC, and an
 * object is tracked from its first decode (before that it holds only str
 * and bytes, which cannot form a cycle).
 */
#include "_kvcoord.h" /* Python.h first */

#include <pythread.h>
#include <structmember.h>

typedef struct {
    PyObject_HEAD unsigned long rank;
    unsigned long long generation;
    unsigned long long registered_ns;
    long pid;
    unsigned long entries;
    PyObject *state;      /* "registered" / "withdrawn" / "empty" */
    PyObject *session_id; /* str */
    PyObject *note;       /* str */
    PyObject *origin;     /* str: "" local, else the node a mirrored rank comes from */
    unsigned long long origin_generation;
    PyObject *raw;           /* bytes, or None (from ranks()) */
    PyObject *decoded;       /* weights_info_dict once decoded, else NULL */
    PyThread_type_lock once; /* held by `decoder` while it decodes; NULL until a first decode */
    unsigned long decoder;   /* PyThread_get_thread_ident() of the decoding thread, 0 if none */
} RankInfoObject;

static PyObject *json_loads;

static const char *state_name(kvc_rank_state st)
{
    switch (st) {
    case KVC_RANK_REGISTERED: return "registered";
    case KVC_RANK_WITHDRAWN: return "withdrawn";
    default: return "empty";
    }
}

PyObject *kvcpy_rankinfo_new(const kvc_rank_info *ri, int with_info)
{
    /* Not tracked by the GC until it holds a dict (see the top). */
    RankInfoObject *o = PyObject_GC_New(RankInfoObject, &kvcpy_RankInfoType);
    if (!o)
        return NULL;
    o->rank = ri->rank;
    o->generation = ri->generation;
    o->registered_ns = ri->registered_ns;
    o->pid = ri->pid;
    o->entries = ri->entries;
    o->origin_generation = ri->origin_generation;
    o->decoded = NULL;
    o->once = NULL;
    o->decoder = 0;
    /* Each may fail (MemoryError set); all are assigned before the check,
     * so ri_dealloc sees NULL or a reference in each field. */
    o->state = PyUnicode_FromString(state_name(ri->state));
    o->session_id =
        PyUnicode_DecodeUTF8(ri->session_id, (Py_ssize_t)strlen(ri->session_id), "surrogateescape");
    o->note = PyUnicode_DecodeUTF8(ri->note, (Py_ssize_t)strlen(ri->note), "replace");
    o->origin = PyUnicode_FromString(ri->origin); /* [A-Za-z0-9._-] */
    if (with_info)
        o->raw = PyBytes_FromStringAndSize(ri->info ? ri->info : "", (Py_ssize_t)ri->info_len);
    else
        o->raw = Py_NewRef(Py_None);
    if (!o->state || !o->session_id || !o->note || !o->origin || !o->raw) {
        Py_DECREF(o);
        return NULL;
    }
    return (PyObject *)o;
}

static int ri_traverse(RankInfoObject *o, visitproc visit, void *arg)
{
    Py_VISIT(o->decoded); /* the only field that can lead back to o */
    return 0;
}

static int ri_clear(RankInfoObject *o)
{
    Py_CLEAR(o->decoded);
    return 0;
}

static void ri_dealloc(RankInfoObject *o)
{
    PyObject_GC_UnTrack(o); /* a no-op when it never was */
    Py_XDECREF(o->state);
    Py_XDECREF(o->session_id);
    Py_XDECREF(o->note);
    Py_XDECREF(o->origin);
    Py_XDECREF(o->raw);
    Py_XDECREF(o->decoded);
    if (o->once) /* nobody waits on it: a waiter holds a reference to o */
        PyThread_free_lock(o->once);
    PyObject_GC_Del(o);
}

/* json.loads, imported on first use (GIL held). */
static PyObject *loads_fn(void)
{
    if (!json_loads) {
        PyObject *json = PyImport_ImportModule("json");
        if (!json)
            return NULL;
        PyObject *f = PyObject_GetAttrString(json, "loads");
        Py_DECREF(json);
        if (!f)
            return NULL;
        if (json_loads) /* the import ran Python code: another thread got there first */
            Py_DECREF(f);
        else
            json_loads = f;
    }
    return json_loads;
}

/* Decode raw as the decoder (see the rule at the top): 0, or -1 with an
 * exception set and decoded left NULL. */
static int ri_decode(RankInfoObject *o)
{
    PyObject *loads = loads_fn();
    if (!loads)
        return -1;
    if (!o->once && !(o->once = PyThread_allocate_lock())) {
        PyErr_NoMemory();
        return -1;
    }
    o->decoder = PyThread_get_thread_ident();
    /* Free, or held for an instant by a waiter of an earlier attempt that
     * does not need the GIL to release it. */
    PyThread_acquire_lock(o->once, WAIT_LOCK);
    PyObject *d = PyObject_CallOneArg(loads, o->raw);
    if (!d && PyErr_ExceptionMatches(PyExc_RecursionError)) {
        /* kvcoordd and the library take up to 2048 levels (json_scan.h);
         * Python's decoder stops at its recursion limit (1000 frames by
         * default): said as what it is, the bytes still readable. */
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError,
                     "weights_info_dict (%zd bytes) nests deeper than Python's json decoder "
                     "allows at this recursion limit (sys.getrecursionlimit() = %d); its bytes "
                     "are in .raw",
                     PyBytes_Check(o->raw) ? PyBytes_GET_SIZE(o->raw) : (Py_ssize_t)-1,
                     Py_GetRecursionLimit());
    }
    if (d) {
        o->decoded = d;
        if (!PyObject_GC_IsTracked((PyObject *)o))
            PyObject_GC_Track(o);
    }
    o->decoder = 0;
    PyThread_release_lock(o->once);
    return d ? 0 : -1;
}

static PyObject *ri_weights(RankInfoObject *o, void *c)
{
    (void)c;
    for (;;) {
        if (o->decoded)
            return Py_NewRef(o->decoded);
        if (o->raw == Py_None)
            Py_RETURN_NONE;
        if (!o->decoder)
            return ri_decode(o) < 0 ? NULL : Py_NewRef(o->decoded);
        if (o->decoder == PyThread_get_thread_ident()) {
            /* e.g. a finalizer run by the GC inside json.loads */
            PyErr_SetString(PyExc_RuntimeError,
                            "RankInfo.weights_info_dict read again by the thread decoding it");
            return NULL;
        }
        /* Another thread is decoding: wait for it without the GIL. */
        PyThread_type_lock l = o->once;
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(l, WAIT_LOCK);
        PyThread_release_lock(l);
        Py_END_ALLOW_THREADS
    }
}

static PyObject *ri_info(RankInfoObject *o, void *c)
{
    /* (session_id, weights_info_dict): what sglang's server keeps per rank */
    PyObject *w = ri_weights(o, c);
    if (!w)
        return NULL;
    PyObject *t = PyTuple_Pack(2, o->session_id, w);
    Py_DECREF(w);
    return t;
}

static PyObject *ri_repr(RankInfoObject *o)
{
    /* ranks() lists entries without their info: no size to show then. */
    if (o->raw == Py_None)
        return PyUnicode_FromFormat("RankInfo(rank=%lu, state=%R, session_id=%R, "
                                    "generation=%llu, entries=%lu)",
                                    o->rank, o->state, o->session_id, o->generation, o->entries);
    return PyUnicode_FromFormat("RankInfo(rank=%lu, state=%R, session_id=%R, generation=%llu, "
                                "entries=%lu, bytes=%zd)",
                                o->rank, o->state, o->session_id, o->generation, o->entries,
                                PyBytes_GET_SIZE(o->raw));
}

static PyMemberDef ri_members[] = {
    {"rank", T_ULONG, offsetof(RankInfoObject, rank), READONLY, "The rank (int)."},
    {"generation", T_ULONGLONG, offsetof(RankInfoObject, generation), READONLY,
     "Bumped by every change of the entry (int)."},
    {"registered_ns", T_ULONGLONG, offsetof(RankInfoObject, registered_ns), READONLY,
     "Time of the last registration or withdrawal, ns since the Unix epoch."},
    {"pid", T_LONG, offsetof(RankInfoObject, pid), READONLY,
     "Process that made the last change (kvcoordd's pid for a registration over HTTP)."},
    {"entries", T_ULONG, offsetof(RankInfoObject, entries), READONLY,
     "Top-level keys of weights_info_dict."},
    {"state", T_OBJECT, offsetof(RankInfoObject, state), READONLY,
     "'registered' or 'withdrawn' (str)."},
    {"session_id", T_OBJECT, offsetof(RankInfoObject, session_id), READONLY,
     "\"host:port\" of the rank's transfer engine (str)."},
    {"note", T_OBJECT, offsetof(RankInfoObject, note), READONLY,
     "Why the rank was withdrawn, else '' (str)."},
    {"origin", T_OBJECT, offsetof(RankInfoObject, origin), READONLY,
     "'' for a registration made on this node; for a rank mirrored from another node "
     "(kvcoordd --etcd), that node's name (str)."},
    {"origin_generation", T_ULONGLONG, offsetof(RankInfoObject, origin_generation), READONLY,
     "The rank's generation on its origin node; 0 for a local registration (int)."},
    {"raw", T_OBJECT, offsetof(RankInfoObject, raw), READONLY,
     "weights_info_dict JSON as stored (bytes; None from ranks())."},
    {NULL, 0, 0, 0, NULL}};

static PyGetSetDef ri_getset[] = {
    {"weights_info_dict", (getter)ri_weights, NULL,
     "The weights_info_dict (dict; None from ranks()), decoded from raw on first access, "
     "once per RankInfo: every access, from any thread, returns that same dict object.  It is "
     "an ordinary mutable dict shared by every holder of this RankInfo: copy it before "
     "changing it.  json's errors (MemoryError) propagate; a later access retries.",
     NULL},
    {"info", (getter)ri_info, NULL,
     "(session_id, weights_info_dict), the tuple sglang's bootstrap server keeps (a new tuple "
     "each time; the dict is the shared one).",
     NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject kvcpy_RankInfoType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvcoord._kvcoord.RankInfo",
    .tp_basicsize = sizeof(RankInfoObject),
    .tp_dealloc = (destructor)ri_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A rank's entry as read from the rank table when it was looked up: a snapshot, "
              "unchanged by later changes of the table.  Its attributes are read-only; "
              "weights_info_dict is decoded once (the first access, whichever thread makes it) "
              "and the same mutable dict is returned to every caller.  Safe to share between "
              "threads as any Python object is; reference cycles through the dict are "
              "collected by the cyclic GC.  Not created by Python code (no constructor).",
    .tp_traverse = (traverseproc)ri_traverse,
    .tp_clear = (inquiry)ri_clear,
    .tp_repr = (reprfunc)ri_repr,
    .tp_members = ri_members,
    .tp_getset = ri_getset,
};
