/*
 * _rooms.c - Segment methods for bootstrap rooms (KVPoll states, failure
 * records), the node-local poll agreement (room_sync) and the process
 * table.  RoomInfo, FailureInfo and ProcInfo are struct sequences (named
 * tuples).
 */
#include "_kvcoord.h" /* Python.h first */

#include <string.h>

PyTypeObject kvcpy_RoomInfoType, kvcpy_FailureInfoType;
PyTypeObject kvcpy_ProcInfoType;

static PyStructSequence_Field room_fields[] = {
    {"room", "bootstrap room id (int)"},
    {"state", "the room's KVPoll: minimum over participants, terminal states sticky"},
    {"participants", "participant count (int)"},
    {"joined", "participants that opened the room"},
    {"released", "participants that released it"},
    {"opened_ns", "creation time, ns since the Unix epoch"},
    {"updated_ns", "last change, ns since the Unix epoch"},
    {"local", "tuple: each participant's own KVPoll, None where unwritten"},
    {"failure", "FailureInfo, or None"},
    {NULL, NULL}};
static PyStructSequence_Desc room_desc = {"kvcoord.RoomInfo",
                                          "A bootstrap room as one rank reads it.", room_fields, 9};

static PyStructSequence_Field failure_fields[] = {
    {"room", "bootstrap room id"},
    {"origin_rank", "rank that recorded the failure; ORIGIN_RANK_NONE when the room timed out"},
    {"origin_pid", "process that recorded it (0 when recorded over HTTP)"},
    {"code", "errno, RDMA work-completion status, or 0"},
    {"reason", "the first reason recorded (str, at most 255 bytes)"},
    {"time_ns", "when it was recorded, ns since the Unix epoch"},
    {"is_from_another_rank", "True unless the asking rank is the origin"},
    {"text", "the library's error text naming the room, origin rank and reason"},
    {"origin_node", "the node it was recorded on (str; '' outside a cluster)"},
    {"from_another_node", "True when mirrored from another node by kvcoordd's cluster view"},
    {NULL, NULL}};
static PyStructSequence_Desc failure_desc = {
    "kvcoord.FailureInfo", "A room's failure record as one rank sees it.", failure_fields, 10};

static PyStructSequence_Field proc_fields[] = {
    {"pid", "process id"},
    {"role", "'worker', 'daemon', 'client' or 'none'"},
    {"rank", "last rank it registered or declared, or None"},
    {"start", "start time, clock ticks since boot"},
    {"attached_ns", "when it attached, ns since the Unix epoch"},
    {"alive", "the pid exists with that start time and is not a zombie"},
    {NULL, NULL}};
static PyStructSequence_Desc proc_desc = {"kvcoord.ProcInfo", "An attached process of the segment.",
                                          proc_fields, 6};

int kvcpy_rooms_init_types(void)
{
    if (kvcpy_RoomInfoType.tp_name)
        return 0;
    if (PyStructSequence_InitType2(&kvcpy_RoomInfoType, &room_desc) < 0 ||
        PyStructSequence_InitType2(&kvcpy_FailureInfoType, &failure_desc) < 0 ||
        PyStructSequence_InitType2(&kvcpy_ProcInfoType, &proc_desc) < 0)
        return -1;
    return 0;
}

/* ---- building results --------------------------------------------------- */

/* Fill the n items of struct sequence o with v (each stolen; a NULL one,
 * whose making failed with an exception set, becomes None there).  o, or
 * NULL once o is released when any v[i] was NULL. */
static PyObject *seq_fill(PyObject *o, PyObject *const v[], int n)
{
    int bad = 0;
    for (int i = 0; i < n; i++) {
        bad |= v[i] == NULL;
        PyStructSequence_SET_ITEM(o, i, v[i] ? v[i] : (Py_INCREF(Py_None), Py_None));
    }
    if (bad)
        Py_CLEAR(o);
    return o;
}

static PyObject *failure_build(const kvc_failure_info *f)
{
    PyObject *o = PyStructSequence_New(&kvcpy_FailureInfoType);
    if (!o)
        return NULL;
    char text[KVC_REASON_MAX + 160];
    kvc_failure_text(f, text, sizeof text);
    PyObject *v[10] = {
        PyLong_FromUnsignedLongLong(f->room),
        PyLong_FromUnsignedLong(f->origin_rank),
        PyLong_FromLong(f->origin_pid),
        PyLong_FromLong(f->code),
        PyUnicode_DecodeUTF8(f->reason, (Py_ssize_t)strlen(f->reason), "replace"),
        PyLong_FromUnsignedLongLong(f->time_ns),
        PyBool_FromLong(f->is_from_another_rank),
        PyUnicode_DecodeUTF8(text, (Py_ssize_t)strlen(text), "replace"),
        PyUnicode_DecodeUTF8(f->origin_node, (Py_ssize_t)strlen(f->origin_node), "replace"),
        PyBool_FromLong(f->from_another_node),
    };
    return seq_fill(o, v, 10);
}

/* The last FailureInfo built and the record it was built from (GIL held).
 * A failure record never changes once kept (the first one wins), and a rank
 * that polls a failed room reads the same one again and again: it then gets
 * the same immutable object instead of a new one (eight objects and a
 * formatted text each time). */
static kvc_failure_info last_failure;
static PyObject *last_failure_obj;

static PyObject *failure_new(const kvc_failure_info *f)
{
    if (last_failure_obj && !memcmp(f, &last_failure, sizeof *f))
        return Py_NewRef(last_failure_obj);
    PyObject *o = failure_build(f);
    if (o) {
        Py_XSETREF(last_failure_obj, Py_NewRef(o));
        last_failure = *f;
    }
    return o;
}

static PyObject *local_tuple(const kvc_room_info *r)
{
    PyObject *t = PyTuple_New(r->participants);
    for (uint32_t i = 0; t && i < r->participants; i++) {
        PyObject *v;
        if (r->local[i] < 0) {
            Py_INCREF(Py_None);
            v = Py_None;
        } else if (!(v = kvcpy_state(r->local[i]))) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

static PyObject *room_new(const kvc_room_info *r)
{
    PyObject *o = PyStructSequence_New(&kvcpy_RoomInfoType);
    if (!o)
        return NULL;
    PyObject *fail;
    if (r->has_failure)
        fail = failure_new(&r->failure);
    else {
        Py_INCREF(Py_None);
        fail = Py_None;
    }
    PyObject *v[9] = {
        PyLong_FromUnsignedLongLong(r->room),
        kvcpy_state(r->state),
        PyLong_FromUnsignedLong(r->participants),
        PyLong_FromUnsignedLong(r->joined),
        PyLong_FromUnsignedLong(r->released),
        PyLong_FromUnsignedLongLong(r->opened_ns),
        PyLong_FromUnsignedLongLong(r->updated_ns),
        local_tuple(r),
        fail,
    };
    return seq_fill(o, v, 9);
}

/* kvcpy_list_of() makers: failure records, rooms, processes. */
static PyObject *failure_item(const void *item) { return failure_new(item); }
static PyObject *room_item(const void *item) { return room_new(item); }

/* ---- argument helpers ------------------------------------------------------ */

/* The asking rank: an int rank, or None for an outside observer (-1). */
static int conv_asking(PyObject *o, void *out)
{
    if (o == Py_None) {
        *(int32_t *)out = -1;
        return 1;
    }
    unsigned long long r;
    if (!kvcpy_conv_uint(o, INT32_MAX, "rank", " or None", &r))
        return 0;
    *(int32_t *)out = (int32_t)r;
    return 1;
}

static int conv_role(PyObject *o, void *out)
{
    static const char *names[] = {"unspecified", "prefill", "decode"};
    if (PyUnicode_Check(o)) {
        const char *s = PyUnicode_AsUTF8(o);
        for (int i = 0; s && i < 3; i++)
            if (!strcmp(s, names[i])) {
                *(kvc_room_role *)out = (kvc_room_role)i;
                return 1;
            }
        if (s)
            PyErr_Format(PyExc_ValueError,
                         "room role must be 'prefill', 'decode' or 'unspecified', not %R", o);
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "room role must be a str, not %.100s", Py_TYPE(o)->tp_name);
    return 0;
}

/* Run a room call (KVCPY_RUN) and return NULL after raising if it failed. */
#define ROOM_CALL(s, call)         \
    do {                           \
        int e_;                    \
        KVCPY_RUN(s, e_, call);    \
        if (e_)                    \
            return kvcpy_fail(e_); \
    } while (0)

#define THREADS "Thread- and process-safe; releases the GIL while in the library."

const char kvcpy_doc_room_open[] =
    "room_open(room, rank, participants=0, role='unspecified') -> None\n\nOpen bootstrap "
    "room `room` (int, 0..2**63-1) as participant `rank` (0..participants-1); participants "
    "0 means the segment's world size.  The first opener creates it; opening again is a "
    "no-op.  This process is recorded as the rank's participant: if it dies, the room fails "
    "naming the rank and how it died.  role: 'prefill', 'decode' or 'unspecified'.\nErrors: "
    "InvalidArgumentError (rank out of range, a count differing from the room's), Error "
    "(room table full, lock busy), ValueError (participants not 0..32), TypeError/ValueError. "
    " " THREADS;

PyObject *kvcpy_room_open(SegmentObject *s, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"room", "rank", "participants", "role", NULL};
    uint64_t room;
    uint32_t rank, participants = 0;
    kvc_room_role role = KVC_ROOM_ROLE_UNSPECIFIED;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&|O&O&", kwlist, kvcpy_conv_room, &room,
                                     kvcpy_conv_rank, &rank, kvcpy_conv_participants, &participants,
                                     conv_role, &role))
        return NULL;
    ROOM_CALL(s, kvc_room_open(g, room, participants, rank, role));
    Py_RETURN_NONE;
}

const char kvcpy_doc_room_set_state[] =
    "room_set_state(room, rank, state) -> None\n\nSet rank's own KVPoll state (0..4) in the "
    "room.  Failed without a failure record records one (\"rank N reported Failed\").  "
    "Writes to a terminal room are ignored.\nErrors: NotFoundError (a KeyError: no such "
    "room), InvalidArgumentError (rank out of range), ValueError (state not 0..4), Error "
    "(lock busy).  " THREADS;

PyObject *kvcpy_room_set_state(SegmentObject *s, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"room", "rank", "state", NULL};
    uint64_t room;
    uint32_t rank;
    int state;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&O&", kwlist, kvcpy_conv_room, &room,
                                     kvcpy_conv_rank, &rank, kvcpy_conv_state, &state))
        return NULL;
    ROOM_CALL(s, kvc_room_set_state(g, room, rank, (kvc_poll)state));
    Py_RETURN_NONE;
}

const char kvcpy_doc_room_fail[] =
    "room_fail(room, rank, reason, code=0) -> bool\n\nRecord a failure of the room from "
    "origin rank `rank`: reason (str or None; at most 255 bytes kept, cut on a character "
    "boundary) and code (errno or RDMA status, int32).  The first record wins: True when "
    "this call's record is the one kept.  Creates the room when it does not exist.\nErrors: "
    "InvalidArgumentError (rank not a participant: >= the room's participants, or the "
    "world size for a room not there yet; or >= max ranks), Error (room table full, lock "
    "busy), TypeError/ValueError.  " THREADS;

PyObject *kvcpy_room_fail(SegmentObject *s, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"room", "rank", "reason", "code", NULL};
    uint64_t room;
    uint32_t rank;
    const char *reason = NULL;
    PyObject *ro;
    Py_ssize_t rlen = 0;
    int code = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&O|O&", kwlist, kvcpy_conv_room, &room,
                                     kvcpy_conv_rank, &rank, &ro, kvcpy_conv_code, &code))
        return NULL;
    if (PyUnicode_Check(ro)) {
        if (!(reason = PyUnicode_AsUTF8AndSize(ro, &rlen)))
            return NULL; /* not encodable (a lone surrogate) */
    } else if (PyBytes_Check(ro)) {
        reason = PyBytes_AS_STRING(ro), rlen = PyBytes_GET_SIZE(ro);
    } else if (ro != Py_None) {
        return PyErr_Format(PyExc_TypeError, "reason must be str, bytes or None, not %.80s",
                            Py_TYPE(ro)->tp_name);
    }
    if (reason && (size_t)rlen != strlen(reason))
        return PyErr_Format(kvcpy_InvalidError, "failure reason contains a NUL byte");
    int kept = 0;
    ROOM_CALL(s, kvc_room_fail(g, room, rank, code, reason, &kept));
    return PyBool_FromLong(kept);
}

const char kvcpy_doc_room_get[] =
    "room_get(room, rank=None) -> RoomInfo\n\nRead the room as `rank` sees it (None: an "
    "outside observer; only failure.is_from_another_rank depends on it).  Checks the "
    "liveness of every participant first: a dead one fails the room naming its rank, pid "
    "and how it ended.\nErrors: NotFoundError (a KeyError: no such room, or reclaimed), "
    "Error (lock busy).  " THREADS;

/* room_get's and check_room's read: (room, rank=None) into *ri; 0, or -1
 * with an exception set. */
static int room_read(SegmentObject *s, PyObject *args, PyObject *kw, kvc_room_info *ri)
{
    static char *kwlist[] = {"room", "rank", NULL};
    uint64_t room;
    int32_t asking = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|O&", kwlist, kvcpy_conv_room, &room, conv_asking,
                                     &asking))
        return -1;
    int e;
    KVCPY_RUN(s, e, kvc_room_get(g, room, asking, ri));
    if (e) {
        kvcpy_fail(e);
        return -1;
    }
    return 0;
}

PyObject *kvcpy_room_get(SegmentObject *s, PyObject *args, PyObject *kw)
{
    kvc_room_info ri;
    return room_read(s, args, kw, &ri) < 0 ? NULL : room_new(&ri);
}

/* kvcoord.KVTransferError, registered by the package (_register_transfer_error). */
static PyObject *transfer_error_cls;

PyObject *kvcpy_register_transfer_error(PyObject *m, PyObject *cls)
{
    (void)m;
    if (!PyType_Check(cls) ||
        !PyType_IsSubtype((PyTypeObject *)cls, (PyTypeObject *)PyExc_Exception))
        return PyErr_Format(PyExc_TypeError, "an exception class is needed, not %R", cls);
    Py_XSETREF(transfer_error_cls, Py_NewRef(cls));
    Py_RETURN_NONE;
}

/* Attribute names of KVTransferError, interned once (GIL held). */
static PyObject *te_names[6];
static const char *const te_name_str[6] = {
    "bootstrap_room", "failure_reason", "is_from_another_rank", "origin_rank", "code", "time_ns"};

/* A new KVTransferError as KVTransferError(room, reason, from_another) and
 * then origin_rank, code, time_ns would make it (python/kvcoord/__init__.py:
 * args == (reason,) and these six attributes; keep the two in step), built
 * without running the Python __init__ (1.3 us of the 2 us a raise cost).
 * v: the six attribute values, stolen (any NULL: its error is set). */
static PyObject *transfer_error_new(PyObject *v[6])
{
    PyObject *exc = NULL;
    int ok = 1;
    for (int i = 0; i < 6; i++)
        ok = ok && v[i];
    if (!ok)
        goto out;
    if (!transfer_error_cls) {
        PyErr_SetString(PyExc_RuntimeError, "kvcoord.KVTransferError is not registered");
        goto out;
    }
    for (int i = 0; i < 6; i++)
        if (!te_names[i] && !(te_names[i] = PyUnicode_InternFromString(te_name_str[i])))
            goto out;
    PyObject *args = PyTuple_Pack(1, v[1]); /* what Exception.__init__(reason) stores */
    if (!args)
        goto out;
    PyTypeObject *t = (PyTypeObject *)transfer_error_cls;
    exc = t->tp_new(t, args, NULL);
    Py_DECREF(args);
    for (int i = 0; exc && i < 6; i++)
        if (PyObject_SetAttr(exc, te_names[i], v[i]) < 0)
            Py_CLEAR(exc);
out:
    for (int i = 0; i < 6; i++)
        Py_XDECREF(v[i]);
    return exc;
}

/* Raise the KVTransferError for failure record f; NULL. */
static PyObject *raise_transfer_error(const kvc_failure_info *f)
{
    PyObject *v[6] = {
        PyLong_FromUnsignedLongLong(f->room),
        PyUnicode_DecodeUTF8(f->reason, (Py_ssize_t)strlen(f->reason), "replace"),
        PyBool_FromLong(f->is_from_another_rank),
        PyLong_FromUnsignedLong(f->origin_rank),
        PyLong_FromLong(f->code),
        PyLong_FromUnsignedLongLong(f->time_ns),
    };
    PyObject *exc = transfer_error_new(v);
    if (exc) {
        PyErr_SetObject(transfer_error_cls, exc);
        Py_DECREF(exc);
    }
    return NULL;
}

PyObject *kvcpy_transfer_error(PyObject *m, PyObject *fi)
{
    (void)m;
    if (!PyObject_TypeCheck(fi, &kvcpy_FailureInfoType))
        return PyErr_Format(PyExc_TypeError, "a kvcoord.FailureInfo is needed, not %.100s",
                            Py_TYPE(fi)->tp_name);
    /* FailureInfo fields: room 0, origin_rank 1, code 3, reason 4, time_ns 5,
     * is_from_another_rank 6 (failure_fields above) */
    static const int at[6] = {0, 4, 6, 1, 3, 5};
    PyObject *v[6];
    for (int i = 0; i < 6; i++)
        v[i] = Py_NewRef(PyStructSequence_GET_ITEM(fi, at[i]));
    return transfer_error_new(v);
}

const char kvcpy_doc_check_room[] =
    "check_room(room, rank=None) -> RoomInfo\n\nRaise KVTransferError (the origin rank's "
    "reason, origin_rank, code, time_ns) if the room failed, else return its RoomInfo as "
    "room_get() does (one read of the room; no RoomInfo is built for a failed one).\nErrors: "
    "those of room_get().  " THREADS;

PyObject *kvcpy_check_room(SegmentObject *s, PyObject *args, PyObject *kw)
{
    kvc_room_info ri;
    if (room_read(s, args, kw, &ri) < 0)
        return NULL;
    return ri.has_failure ? raise_transfer_error(&ri.failure) : room_new(&ri);
}

const char kvcpy_doc_room_wait[] =
    "room_wait(room, known, rank=None, timeout=None, *, check=False) -> RoomInfo\n\nWait "
    "until the room's state differs from `known` (a KVPoll) or it gains a failure record, up "
    "to timeout seconds (None: no limit), sleeping on a shared futex; Ctrl-C interrupts.  "
    "check=True: a failed room raises KVTransferError (as check_room) instead of being "
    "returned, straight from the wake-up (no RoomInfo built, no second read).\nErrors: "
    "WaitTimeoutError (a TimeoutError), KVTransferError (check=True), those of room_get(). "
    " " THREADS;

PyObject *kvcpy_room_wait(SegmentObject *s, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"room", "known", "rank", "timeout", "check", NULL};
    uint64_t room;
    int known, check = 0;
    int32_t asking = -1;
    double timeout = -1.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&|O&O&$p", kwlist, kvcpy_conv_room, &room,
                                     kvcpy_conv_state, &known, conv_asking, &asking,
                                     kvcpy_conv_timeout, &timeout, &check))
        return NULL;
    double deadline = timeout < 0 ? -1.0 : kvcpy_now() + timeout;
    kvc_room_info ri;
    for (;;) {
        uint32_t ms = kvcpy_slice_ms(deadline);
        int e;
        KVCPY_RUN(s, e, kvc_room_wait(g, room, asking, (kvc_poll)known, ms, &ri));
        if (e == KVC_OK) /* check: straight from the wake-up to the raise */
            return check && ri.has_failure ? raise_transfer_error(&ri.failure) : room_new(&ri);
        if (e != KVC_E_TIMEDOUT)
            return kvcpy_fail(e);
        if (deadline >= 0 && kvcpy_now() >= deadline) {
            char msg[160];
            snprintf(msg, sizeof msg, "room %llu still %s after %g s", (unsigned long long)room,
                     kvc_poll_name((kvc_poll)known), timeout);
            return kvcpy_raise_msg(KVC_E_TIMEDOUT, 0, msg);
        }
        if (PyErr_CheckSignals() < 0)
            return NULL;
    }
}

const char kvcpy_doc_room_release[] =
    "room_release(room, rank) -> None\n\nRelease the room for rank; once every participant "
    "released it the room is reclaimed.\nErrors: NotFoundError (a KeyError), "
    "InvalidArgumentError, Error.  " THREADS;

PyObject *kvcpy_room_release(SegmentObject *s, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"room", "rank", NULL};
    uint64_t room;
    uint32_t rank;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O&", kwlist, kvcpy_conv_room, &room,
                                     kvcpy_conv_rank, &rank))
        return NULL;
    ROOM_CALL(s, kvc_room_release(g, room, rank));
    Py_RETURN_NONE;
}

/* ---- room_sync: the node-local poll agreement ------------------------------ */

/* Convert the sequences into C arrays (PyMem); -1 with an exception. */
static int sync_args(PyObject *rooms_o, PyObject *states_o, size_t *n, uint64_t **rooms,
                     kvc_poll **states)
{
    PyObject *rs = PySequence_Fast(rooms_o, "rooms must be a sequence of room ids");
    PyObject *ss = NULL;
    if (!rs)
        return -1;
    if (states_o != Py_None &&
        !(ss = PySequence_Fast(states_o, "states must be a sequence of KVPoll states"))) {
        Py_DECREF(rs);
        return -1;
    }
    *n = (size_t)PySequence_Fast_GET_SIZE(rs);
    int rc = -1;
    if (ss && (size_t)PySequence_Fast_GET_SIZE(ss) != *n) {
        PyErr_Format(PyExc_ValueError, "%zu rooms but %zd states", *n,
                     PySequence_Fast_GET_SIZE(ss));
        goto out;
    }
    *rooms = PyMem_Malloc((*n ? *n : 1) * sizeof **rooms);
    *states = ss ? PyMem_Malloc((*n ? *n : 1) * sizeof **states) : NULL;
    if (!*rooms || (ss && !*states)) {
        PyErr_NoMemory();
        goto out;
    }
    for (size_t i = 0; i < *n; i++) {
        int st = 0;
        if (!kvcpy_conv_room(PySequence_Fast_GET_ITEM(rs, i), &(*rooms)[i]) ||
            (ss && !kvcpy_conv_state(PySequence_Fast_GET_ITEM(ss, i), &st)))
            goto out;
        if (ss)
            (*states)[i] = (kvc_poll)st;
    }
    rc = 0;
out:
    Py_DECREF(rs);
    Py_XDECREF(ss);
    return rc;
}

const char kvcpy_doc_room_sync[] =
    "room_sync(rank, rooms, states=None) -> list[KVPoll]\n\nThe node-local replacement for "
    "sglang's poll all-reduce: for each room (in order) set this rank's own state from "
    "`states` (when given), then read the room's state, the minimum over its participants "
    "(Failed from any rank wins, Success needs all).  One library call (kvc_room_sync: each "
    "update under its room's stripe lock, each read lock-free), the GIL released once.  "
    "Unlike an all-reduce it does not wait for the other ranks: a rank reads what they "
    "have written so far: each rank's state is the last it wrote (sglang's senders and "
    "receivers only move theirs forward; the library does not refuse a lower one), Failed is "
    "sticky, and once the room is terminal further writes are ignored.\nErrors: those of "
    "room_set_state() and room_get() (the message names the room), TypeError/ValueError "
    "for bad sequences.  " THREADS;

PyObject *kvcpy_room_sync(SegmentObject *s, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"rank", "rooms", "states", NULL};
    uint32_t rank;
    PyObject *rooms_o, *states_o = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O|O", kwlist, kvcpy_conv_rank, &rank, &rooms_o,
                                     &states_o))
        return NULL;
    size_t n = 0, failed_at = 0;
    uint64_t *rooms = NULL;
    kvc_poll *states = NULL, *out = NULL;
    PyObject *list = NULL;
    if (sync_args(rooms_o, states_o, &n, &rooms, &states) < 0)
        goto done;
    if (!(out = PyMem_Malloc((n ? n : 1) * sizeof *out))) {
        PyErr_NoMemory();
        goto done;
    }
    int e;
    KVCPY_RUN(s, e, kvc_room_sync(g, rank, n, rooms, states, out, &failed_at));
    if (e) {
        kvcpy_fail(e);
        goto done;
    }
    list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *v = kvcpy_state(out[i]);
        if (!v) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, v);
    }
done:
    PyMem_Free(rooms);
    PyMem_Free(states);
    PyMem_Free(out);
    return list;
}

/* ---- listings ---------------------------------------------------------------- */

const char kvcpy_doc_room_list[] =
    "rooms(state=None) -> list[RoomInfo]\n\nLive rooms (no liveness check), optionally only "
    "those in one KVPoll state.\nErrors: ValueError (state not 0..4), Error (lock "
    "busy).  " THREADS;

static kvc_err list_rooms(kvc_segment *g, void *buf, size_t cap, size_t *count, const void *ctx)
{
    return kvc_room_list(g, *(const int *)ctx, buf, cap, count);
}

PyObject *kvcpy_room_list(SegmentObject *s, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"state", NULL};
    PyObject *st = Py_None;
    int filter = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", kwlist, &st))
        return NULL;
    if (st != Py_None && !kvcpy_conv_state(st, &filter))
        return NULL;
    return kvcpy_listing(s, list_rooms, &filter, sizeof(kvc_room_info), 256, room_item);
}

const char kvcpy_doc_failures[] =
    "failures(limit=100) -> list[FailureInfo]\n\nThe most recent failure records, newest "
    "first (the last 1024 are kept, whatever happened to their rooms).\nErrors: ValueError "
    "(limit not 0..1024), Error (lock busy).  " THREADS;

PyObject *kvcpy_failures(SegmentObject *s, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"limit", NULL};
    PyObject *lo = NULL;
    long long limit = 100;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", kwlist, &lo))
        return NULL;
    if (lo && !kvcpy_conv_range(lo, 0, KVC_FAILURE_RING, "limit", "", &limit))
        return NULL;
    kvc_failure_info *v = PyMem_Malloc((size_t)(limit ? limit : 1) * sizeof *v);
    if (!v)
        return PyErr_NoMemory();
    size_t count = 0;
    int e;
    KVCPY_RUN(s, e, kvc_failures_recent(g, v, (size_t)limit, &count));
    PyObject *list = e ? kvcpy_fail(e) : kvcpy_list_of(v, count, sizeof *v, failure_item);
    PyMem_Free(v);
    return list;
}

static PyObject *proc_new(const kvc_proc_info *p)
{
    PyObject *o = PyStructSequence_New(&kvcpy_ProcInfoType);
    if (!o)
        return NULL;
    PyObject *rank = p->rank < 0 ? (Py_INCREF(Py_None), Py_None) : PyLong_FromLong(p->rank);
    PyObject *v[6] = {
        PyLong_FromLong(p->pid),
        PyUnicode_FromString(kvc_role_name(p->role)),
        rank,
        PyLong_FromUnsignedLongLong(p->start),
        PyLong_FromUnsignedLongLong(p->attached_ns),
        PyBool_FromLong(p->alive),
    };
    return seq_fill(o, v, 6);
}

static PyObject *proc_item(const void *item) { return proc_new(item); }

const char kvcpy_doc_procs[] =
    "procs() -> list[ProcInfo]\n\nThe segment's process table (pid, role, rank, start, "
    "attached_ns, alive).  " THREADS;

static kvc_err list_procs(kvc_segment *g, void *buf, size_t cap, size_t *count, const void *ctx)
{
    (void)ctx;
    return kvc_proc_list(g, buf, cap, count);
}

PyObject *kvcpy_procs(SegmentObject *s, PyObject *unused)
{
    (void)unused;
    return kvcpy_listing(s, list_procs, NULL, sizeof(kvc_proc_info), 64, proc_item);
}

const char kvcpy_doc_reap_dead[] =
    "reap_dead() -> int\n\nHandle every attached process that is no longer alive, as "
    "kvcoordd does: its non-terminal rooms fail naming its rank, pid and how it ended, its "
    "ranks are withdrawn.  Returns how many were reaped.  Errors: Error (lock "
    "busy).  " THREADS;

PyObject *kvcpy_reap_dead(SegmentObject *s, PyObject *unused)
{
    (void)unused;
    size_t n = 0;
    ROOM_CALL(s, kvc_proc_reap_dead(g, &n));
    return PyLong_FromSize_t(n);
}

const char kvcpy_doc_room_sweep[] =
    "room_sweep() -> int\n\nReclaim rooms idle for longer than the segment's room TTL (a "
    "non-terminal one fails with a timeout reason first); returns how many.  " THREADS;

PyObject *kvcpy_room_sweep(SegmentObject *s, PyObject *unused)
{
    (void)unused;
    size_t n = 0;
    ROOM_CALL(s, kvc_room_sweep(g, &n));
    return PyLong_FromSize_t(n);
}
