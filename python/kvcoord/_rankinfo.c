/*
 * _rankinfo.c - RankInfo: one rank's entry as read from the rank table.
 * weights_info_dict is decoded from the stored JSON on first access only
 * (a lookup that needs just the session_id never parses megabytes).
 */
#include "_kvcoord.h" /* Python.h first */

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
    PyObject *raw;     /* bytes, or None (from ranks()) */
    PyObject *decoded; /* weights_info_dict once decoded, else NULL */
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
    RankInfoObject *o = PyObject_New(RankInfoObject, &kvcpy_RankInfoType);
    if (!o)
        return NULL;
    o->rank = ri->rank;
    o->generation = ri->generation;
    o->registered_ns = ri->registered_ns;
    o->pid = ri->pid;
    o->entries = ri->entries;
    o->decoded = NULL;
    o->state = PyUnicode_FromString(state_name(ri->state));
    o->session_id =
        PyUnicode_DecodeUTF8(ri->session_id, (Py_ssize_t)strlen(ri->session_id), "surrogateescape");
    o->note = PyUnicode_DecodeUTF8(ri->note, (Py_ssize_t)strlen(ri->note), "replace");
    o->origin = PyUnicode_FromString(ri->origin); /* [A-Za-z0-9._-] */
    o->origin_generation = ri->origin_generation;
    if (with_info)
        o->raw = PyBytes_FromStringAndSize(ri->info ? ri->info : "", (Py_ssize_t)ri->info_len);
    else {
        Py_INCREF(Py_None);
        o->raw = Py_None;
    }
    if (!o->state || !o->session_id || !o->note || !o->origin || !o->raw) {
        Py_DECREF(o);
        return NULL;
    }
    return (PyObject *)o;
}

static void ri_dealloc(RankInfoObject *o)
{
    Py_XDECREF(o->state);
    Py_XDECREF(o->session_id);
    Py_XDECREF(o->note);
    Py_XDECREF(o->origin);
    Py_XDECREF(o->raw);
    Py_XDECREF(o->decoded);
    PyObject_Free(o);
}

static PyObject *ri_weights(RankInfoObject *o, void *c)
{
    (void)c;
    if (o->decoded) {
        Py_INCREF(o->decoded);
        return o->decoded;
    }
    if (o->raw == Py_None)
        Py_RETURN_NONE;
    if (!json_loads) {
        PyObject *json = PyImport_ImportModule("json");
        if (!json)
            return NULL;
        json_loads = PyObject_GetAttrString(json, "loads");
        Py_DECREF(json);
        if (!json_loads)
            return NULL;
    }
    o->decoded = PyObject_CallOneArg(json_loads, o->raw);
    Py_XINCREF(o->decoded);
    return o->decoded;
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
     "The weights_info_dict (dict), decoded from raw on first access and cached.", NULL},
    {"info", (getter)ri_info, NULL,
     "(session_id, weights_info_dict), the tuple sglang's bootstrap server keeps.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject kvcpy_RankInfoType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvcoord._kvcoord.RankInfo",
    .tp_basicsize = sizeof(RankInfoObject),
    .tp_dealloc = (destructor)ri_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A rank's entry as read from the rank table (immutable snapshot; thread-safe to "
              "share).",
    .tp_repr = (reprfunc)ri_repr,
    .tp_members = ri_members,
    .tp_getset = ri_getset,
};
