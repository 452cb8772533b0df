/*
 * _collective.c - Segment.allreduce_min (kvc_allreduce_min_opt),
 * Segment.poll_allreduce (kvc_poll_allreduce), Segment.allreduce_join
 * (kvc_coll_join) and kvcoord.CollectiveError.
 *
 * A collective waits with the GIL released; its stop hook (stop_hook)
 * makes it give up at once when close() starts (kvcpy_coll_closing wakes
 * it) and, in the main thread, when a signal handler raises (Ctrl-C:
 * KeyboardInterrupt).
 */
#include "_kvcoord.h" /* Python.h first */

#include <math.h>
#include <signal.h>
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

/* Raise CollectiveError for e (KVC_E_PEER, KVC_E_TIMEDOUT) from *why. */
static PyObject *raise_collective(kvc_err e, const kvc_coll_failure *why)
{
    const kvcpy_attr attrs[] = {
        {"dead", PyBool_FromLong(why->dead)},
        {"group", PyLong_FromUnsignedLongLong(why->group)},
        {"generation", PyLong_FromUnsignedLongLong(why->generation)},
        {"pid", PyLong_FromLong(why->pid)},
    };
    return kvcpy_raise_coll(e, why->ranks, attrs, sizeof attrs / sizeof *attrs);
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

/* ---- waiting: close() and signals --------------------------------------- */

typedef struct stop_ctx {
    SegmentObject *s;
    int main;        /* the main thread: signal handlers run here */
    int interrupted; /* a SIGINT arrived while it waited */
} stop_ctx;

/* kvc_coll_opts.stop: 1 once close() started, or (main thread) once a
 * SIGINT arrived.  The SIGINT is only noted and tripped again: its handler
 * runs after the call left the library (after_wait), never inside it,
 * where a handler that closes this Segment would wait for itself. */
static int stop_hook(void *arg)
{
    stop_ctx *c = arg;
    if (__atomic_load_n(&c->s->closing, __ATOMIC_ACQUIRE))
        return 1;
    if (!c->main)
        return 0;
    PyGILState_STATE st = PyGILState_Ensure();
    if (PyOS_InterruptOccurred()) {
        PyErr_SetInterruptEx(SIGINT);
        c->interrupted = 1;
    }
    PyGILState_Release(st);
    return c->interrupted;
}

/* After a collective left the library: run the signal handlers of a SIGINT
 * that stopped it (Ctrl-C: KeyboardInterrupt).  -1 with the exception. */
static int after_wait(const stop_ctx *c) { return c->interrupted ? PyErr_CheckSignals() : 0; }

void kvcpy_coll_closing(kvc_segment *g) { kvc_coll_wake(g); }

static uint32_t timeout_to_ms(double timeout)
{
    if (timeout >= 0 && timeout * 1000.0 < (double)UINT32_MAX)
        return (uint32_t)ceil(timeout * 1000.0);
    return UINT32_MAX;
}

/* The Python result of a collective that returned e: NULL with the
 * exception set unless e is KVC_OK and nothing was raised meanwhile. */
static int coll_failed(SegmentObject *s, int e, const kvc_coll_failure *why, const char *what)
{
    if (PyErr_Occurred()) /* a signal handler raised (after_wait: Ctrl-C) */
        return 1;
    if (e == KVCPY_E_RAISED)
        return 1;
    if (e && __atomic_load_n(&s->closing, __ATOMIC_ACQUIRE)) {
        PyErr_Format(kvcpy_ClosedError,
                     "Segment.%s: the segment was closed while the call waited (the round was "
                     "given up: its peers fail it at once; the segment is closed)",
                     what);
        return 1;
    }
    if (e == KVC_E_PEER || e == KVC_E_TIMEDOUT) {
        raise_collective((kvc_err)e, why);
        return 1;
    }
    if (e) {
        kvcpy_fail(e);
        return 1;
    }
    return 0;
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
    "the others (None: no limit).  kind: 0..65535, what the call is (every rank of a call "
    "must give the same kind; kvcoord.sglang's polls use their own).  While it waits, "
    "close() from another thread makes it give up at once (SegmentClosedError), and so "
    "does a SIGINT in the main thread (Ctrl-C: its handler runs once the call gave up, "
    "outside the library: KeyboardInterrupt by default); a "
    "round given up so fails at once on the other ranks (CollectiveError, .dead False), "
    "the next round works.  The "
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
    "InvalidArgumentError for a size, rank or group size that differ from the group's (a "
    "size mismatch breaks the group's epoch: every rank's call in progress and later raises "
    "it at once, naming the mismatch), data of another length or a call of another kind "
    "than rank 0's in the same round (every rank of that call raises it, naming the first "
    "rank that differs), or a rank held by another live process; TypeError / ValueError for bad "
    "argument types and "
    "values; FullError when 32 groups are in use.  The Segment must be open with a role "
    "other than 'none' and used by the process that opened it.  Thread-safe (one thread per "
    "rank at a time); releases the GIL while it waits.";

PyObject *kvcpy_allreduce_min(SegmentObject *s, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"group", "size", "rank", "data", "timeout", "kind", NULL};
    PyObject *group_o, *size_o, *rank_o, *data, *timeout_o = NULL, *kind_o = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO|OO", kwlist, &group_o, &size_o, &rank_o, &data,
                                     &timeout_o, &kind_o))
        return NULL;
    uint64_t group;
    unsigned long long size, rank, kind = 0;
    double timeout = 30.0;
    if (!kvcpy_conv_group(group_o, &group) ||
        !kvcpy_conv_uint(size_o, UINT32_MAX, "size", "", &size) ||
        !kvcpy_conv_uint(rank_o, UINT32_MAX, "rank", "", &rank) ||
        (kind_o && !kvcpy_conv_uint(kind_o, 0xffff, "kind", "", &kind)) ||
        (timeout_o && !kvcpy_conv_timeout(timeout_o, &timeout)))
        return NULL;
    uint8_t *buf = NULL;
    size_t len = 0;
    if (data_bytes(data, &buf, &len) < 0)
        return NULL;
    stop_ctx sc = {s, _PyOS_IsMainThread(), 0};
    kvc_coll_opts o = {.timeout_ms = timeout_to_ms(timeout),
                       .kind = (uint32_t)kind,
                       .stop = stop_hook,
                       .stop_arg = &sc};
    kvc_coll_failure why;
    int e;
    KVCPY_RUN(s, e,
              kvc_allreduce_min_opt(g, group, (uint32_t)size, (uint32_t)rank, buf, len, &o, &why));
    PyObject *res = NULL;
    if (after_wait(&sc) == 0 && !coll_failed(s, e, &why, "allreduce_min"))
        res = PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)len);
    PyMem_Free(buf);
    return res;
}

const char kvcpy_doc_allreduce_join[] =
    "allreduce_join(group, size, rank) -> None\n\nTake rank `rank` of group `group` (of "
    "`size` ranks) as the first allreduce_min call would, without a round: the ranks of a "
    "group learn before their first round whether each can take part, and can agree on "
    "another path when one cannot (kvcoord.sglang's handshake does).  Errors: those of "
    "allreduce_min's joining: FullError (32 groups in use), InvalidArgumentError (a size "
    "mismatch, a rank held by another live process), CollectiveError (the epoch has a gone "
    "member and live ones).  "
    "Thread-safe.";

PyObject *kvcpy_allreduce_join(SegmentObject *s, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"group", "size", "rank", NULL};
    PyObject *group_o, *size_o, *rank_o;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO", kwlist, &group_o, &size_o, &rank_o))
        return NULL;
    uint64_t group;
    unsigned long long size, rank;
    if (!kvcpy_conv_group(group_o, &group) ||
        !kvcpy_conv_uint(size_o, UINT32_MAX, "size", "", &size) ||
        !kvcpy_conv_uint(rank_o, UINT32_MAX, "rank", "", &rank))
        return NULL;
    int e;
    KVCPY_RUN(s, e, kvc_coll_join(g, group, (uint32_t)size, (uint32_t)rank));
    if (e == KVC_E_PEER) {
        kvc_coll_failure why = {.group = group, .dead = 1};
        return raise_collective(KVC_E_PEER, &why);
    }
    if (e)
        return kvcpy_fail(e);
    Py_RETURN_NONE;
}

/* ---- poll_allreduce ------------------------------------------------------ */

#define POLL_STACK 256 /* rooms polled without allocating */

/* rooms[i] for poller i: its bootstrap_room when `follows` (a dict, set or
 * RoomSet) holds it, else KVC_ROOM_NONE.  -1 with an exception (a bad
 * follows). */
static int followed_room(PyObject *poller, PyObject *follows, uint64_t *room)
{
    static PyObject *attr;
    *room = KVC_ROOM_NONE;
    if (!attr && !(attr = PyUnicode_InternFromString("bootstrap_room")))
        return -1;
    PyObject *r = PyObject_GetAttr(poller, attr);
    if (!r) {
        PyErr_Clear(); /* no room: nothing to fold */
        return 0;
    }
    if (Py_IS_TYPE(follows, &kvcpy_RoomSetType)) { /* ids in C: no Python hashing */
        unsigned long long v = PyLong_Check(r) ? PyLong_AsUnsignedLongLong(r) : 0;
        if (!PyLong_Check(r) || (v == (unsigned long long)-1 && PyErr_Occurred()))
            PyErr_Clear(); /* not a room id: not followed */
        else if (kvcpy_roomset_has(follows, (uint64_t)v))
            *room = (uint64_t)v;
        Py_DECREF(r);
        return 0;
    }
    int in = PyDict_Check(follows) ? PyDict_Contains(follows, r) : PySet_Contains(follows, r);
    if (in > 0 && PyLong_Check(r)) {
        unsigned long long v = PyLong_AsUnsignedLongLong(r);
        if (v == (unsigned long long)-1 && PyErr_Occurred())
            PyErr_Clear();
        else
            *room = (uint64_t)v;
    }
    Py_DECREF(r);
    if (in < 0) {
        PyErr_Clear(); /* unhashable: not followed */
        return 0;
    }
    return 0;
}

/* polls[i]: this rank's poll of one room as int() makes it (an int, or an
 * object int() accepts when called: what pollers[i].poll() returned), in
 * 0..4.  -1 with an exception. */
static int poll_value(PyObject *o, Py_ssize_t i, int called, uint8_t *out)
{
    long v = -2;
    int overflow = 0; /* out of range too */
    if (PyLong_CheckExact(o) ||
        (called && PyLong_Check(o) && Py_TYPE(o)->tp_as_number &&
         Py_TYPE(o)->tp_as_number->nb_int == PyLong_Type.tp_as_number->nb_int)) {
        /* an int, or an int subclass whose int() is int's own (sglang's
         * KVPoll, an IntEnum): int() of it is its value */
        v = PyLong_AsLongAndOverflow(o, &overflow);
    } else if (called) { /* int(poller.poll()), as sglang's list comprehension */
        PyObject *iv = PyNumber_Long(o);
        if (!iv)
            return -1;
        v = PyLong_AsLongAndOverflow(iv, &overflow);
        Py_DECREF(iv);
    } else if (PyLong_Check(o) && !PyBool_Check(o)) {
        v = PyLong_AsLongAndOverflow(o, &overflow);
    }
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (overflow || v < 0 || v > 4) {
        if (called)
            PyErr_Format(kvcpy_InvalidError,
                         "pollers[%zd].poll() returned %R, not a KVPoll int 0..4", i, o);
        else
            PyErr_Format(kvcpy_InvalidError, "polls[%zd] is %R, not a KVPoll int 0..4", i, o);
        return -1;
    }
    *out = (uint8_t)v;
    return 0;
}

/* After poll_allreduce polled the pollers itself and then failed: the
 * polls it made, as a list, in the exception's .polls (a caller that falls
 * back to another reduction must not poll again: a poll() has effects). */
static void attach_polls(const uint8_t *polls, Py_ssize_t n)
{
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    PyObject *l = v ? PyList_New(n) : NULL;
    for (Py_ssize_t i = 0; l && i < n; i++)
        PyList_SET_ITEM(l, i, PyLong_FromLong(polls[i]));
    if (!l || PyObject_SetAttrString(v, "polls", l) < 0)
        PyErr_Clear(); /* the original exception goes on without them */
    Py_XDECREF(l);
    PyErr_Restore(t, v, tb);
}

/* The arguments of poll_allreduce, positional (the fast path: no tuple or
 * dict is made) or by keyword (parsed as by PyArg_ParseTupleAndKeywords).
 * 0, or -1 with an exception. */
static int poll_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **o)
{
    static char *kwlist[] = {"group",   "size",    "rank", "polls", "pollers",
                             "follows", "timeout", "kind", NULL};
    if (!kwnames && nargs >= 4 && nargs <= 8) {
        for (Py_ssize_t i = 0; i < nargs; i++)
            o[i] = args[i];
        return 0;
    }
    PyObject *t = PyTuple_New(nargs), *kw = NULL;
    int ok = 0;
    if (!t)
        return -1;
    for (Py_ssize_t i = 0; i < nargs; i++)
        PyTuple_SET_ITEM(t, i, Py_NewRef(args[i]));
    Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nk && !(kw = PyDict_New()))
        goto out;
    for (Py_ssize_t i = 0; i < nk; i++)
        if (PyDict_SetItem(kw, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0)
            goto out;
    /* borrowed from t and kw, which the caller's arguments keep alive */
    ok = PyArg_ParseTupleAndKeywords(t, kw, "OOOO|OOOO", kwlist, &o[0], &o[1], &o[2], &o[3], &o[4],
                                     &o[5], &o[6], &o[7]);
out:
    Py_DECREF(t);
    Py_XDECREF(kw);
    return ok ? 0 : -1;
}

const char kvcpy_doc_poll_allreduce[] =
    "poll_allreduce(group, size, rank, polls, pollers=None, follows=None, timeout=30.0, "
    "kind=0) -> list[int]\n\nsglang's poll agreement in one call (kvc_poll_allreduce): "
    "polls is this rank's list of KVPoll ints (0..4) for the step, or None: then each "
    "pollers[i].poll() is called here, in order, and taken as int() takes it (what "
    "sglang's [int(p.poll()) for p in pollers] gives; an exception it raises propagates "
    "before any reduction); for each i whose poll is "
    "not Failed and whose pollers[i].bootstrap_room is in `follows` (a dict, set or RoomSet of the "
    "rooms this process follows in the segment), a room kvcoord itself failed (a "
    "participant died, the room TTL passed) makes polls[i] Failed; then the element-wise "
    "MIN over the group's ranks, as allreduce_min (same group, rounds and errors; kind "
    "names the caller's variant), returned as a new list of ints.  Allocates nothing but "
    "the result for up to 256 polls.  Errors: those of allreduce_min; TypeError / "
    "ValueError for bad arguments (polls not ints, pollers of another length, neither "
    "given), InvalidArgumentError for a poll outside 0..4.  When it polled the pollers "
    "itself and fails after the polls, the exception's .polls is the list of them "
    "(before the fold).";

PyObject *kvcpy_poll_allreduce(SegmentObject *s, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames)
{
    PyObject *o[8] = {NULL, NULL, NULL, NULL, Py_None, Py_None, NULL, NULL};
    if (poll_args(args, nargs, kwnames, o) < 0)
        return NULL;
    uint64_t group;
    unsigned long long size, rank, kind = 0;
    double timeout = 30.0;
    if (!kvcpy_conv_group(o[0], &group) || !kvcpy_conv_uint(o[1], UINT32_MAX, "size", "", &size) ||
        !kvcpy_conv_uint(o[2], UINT32_MAX, "rank", "", &rank) ||
        (o[7] && !kvcpy_conv_uint(o[7], 0xffff, "kind", "", &kind)) ||
        (o[6] && !kvcpy_conv_timeout(o[6], &timeout)))
        return NULL;
    return kvcpy_poll_run(s, group, (uint32_t)size, (uint32_t)rank, o[3], o[4], o[5], timeout,
                          (uint32_t)kind);
}

PyObject *kvcpy_poll_run(SegmentObject *s, uint64_t group, uint32_t size, uint32_t rank,
                         PyObject *polls_o, PyObject *pollers_o, PyObject *follows, double timeout,
                         uint32_t kind)
{
    static PyObject *s_poll;
    int roomset = Py_IS_TYPE(follows, &kvcpy_RoomSetType);
    if (follows != Py_None && !PyDict_Check(follows) && !PyAnySet_Check(follows) && !roomset) {
        PyErr_Format(PyExc_TypeError,
                     "follows must be a dict, a set, a kvcoord._kvcoord.RoomSet or None, not "
                     "%.100s",
                     Py_TYPE(follows)->tp_name);
        return NULL;
    }
    int call = polls_o == Py_None; /* poll the pollers here */
    if (call && pollers_o == Py_None) {
        PyErr_SetString(PyExc_TypeError, "poll_allreduce: polls and pollers are both None");
        return NULL;
    }
    if (call && !s_poll && !(s_poll = PyUnicode_InternFromString("poll")))
        return NULL;
    PyObject *pl = NULL, *pv = NULL, *res = NULL;
    int polled = 0;
    if (!call && !(pl = PySequence_Fast(polls_o, "polls must be a sequence of ints 0..4")))
        return NULL;
    int fold = follows != Py_None && pollers_o != Py_None &&
               (roomset                 ? kvcpy_roomset_len(follows)
                : PyDict_Check(follows) ? PyDict_GET_SIZE(follows)
                                        : PySet_GET_SIZE(follows)) > 0;
    if ((call || fold) && !(pv = PySequence_Fast(pollers_o, "pollers must be a sequence")))
        goto out0;
    Py_ssize_t n = call ? PySequence_Fast_GET_SIZE(pv) : PySequence_Fast_GET_SIZE(pl);
    /* polls, then (when polled here) a copy of them as polled: n bytes each */
    uint8_t pstack[2 * POLL_STACK], *polls = pstack;
    uint64_t rstack[POLL_STACK], *rooms = NULL;
    if (n > POLL_STACK && !(polls = PyMem_Malloc(2 * (size_t)n))) {
        PyErr_NoMemory();
        goto out;
    }
    if (fold) {
        if (PySequence_Fast_GET_SIZE(pv) != n) {
            PyErr_Format(PyExc_ValueError, "%zd polls but %zd pollers", n,
                         PySequence_Fast_GET_SIZE(pv));
            goto out;
        }
        rooms = n > POLL_STACK ? PyMem_Malloc((size_t)n * sizeof *rooms) : rstack;
        if (!rooms) {
            PyErr_NoMemory();
            goto out;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int bad;
        if (call) {
            /* a poll() may change the list: sglang's loop would stop early */
            if (i >= PySequence_Fast_GET_SIZE(pv)) {
                PyErr_SetString(PyExc_RuntimeError, "pollers changed size during the polls");
                goto out;
            }
            kvc_poll_prefetch(s->seg, (size_t)i); /* the fold's room i, while sglang's poll runs */
            PyObject *argv[2] = {NULL, PySequence_Fast_GET_ITEM(pv, i)};
            Py_INCREF(argv[1]);
            PyObject *r = PyObject_VectorcallMethod(s_poll, argv + 1,
                                                    1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            Py_DECREF(argv[1]);
            if (!r)
                goto out;
            bad = poll_value(r, i, 1, &polls[i]);
            Py_DECREF(r);
        } else {
            bad = poll_value(PySequence_Fast_GET_ITEM(pl, i), i, 0, &polls[i]);
        }
        if (bad)
            goto out;
        if (rooms) { /* the poller just polled: its attributes are in cache */
            rooms[i] = KVC_ROOM_NONE;
            if (i >= PySequence_Fast_GET_SIZE(pv)) { /* a poll() or getattr shrank it */
                PyErr_SetString(PyExc_RuntimeError, "pollers changed size during the polls");
                goto out;
            }
            if (polls[i] != 0 &&
                followed_room(PySequence_Fast_GET_ITEM(pv, i), follows, &rooms[i]) < 0)
                goto out;
        }
    }
    if (call) { /* from here, a failure tells the polls made (attach_polls) */
        memcpy(polls + n, polls, (size_t)n);
        polled = 1;
    }
    stop_ctx sc = {s, _PyOS_IsMainThread(), 0};
    kvc_coll_opts co = {
        .timeout_ms = timeout_to_ms(timeout), .kind = kind, .stop = stop_hook, .stop_arg = &sc};
    kvc_coll_failure why;
    int e;
    KVCPY_RUN(s, e, kvc_poll_allreduce(g, group, size, rank, polls, rooms, (size_t)n, &co, &why));
    if (after_wait(&sc) < 0 || coll_failed(s, e, &why, "poll_allreduce"))
        goto out;
    if (!(res = PyList_New(n)))
        goto out;
    for (Py_ssize_t i = 0; i < n; i++)
        PyList_SET_ITEM(res, i, PyLong_FromLong(polls[i])); /* small ints: cached */
    polled = 0;
out:
    if (polled)
        attach_polls(polls + n, n);
    if (polls != pstack)
        PyMem_Free(polls);
    if (rooms && rooms != rstack)
        PyMem_Free(rooms);
out0:
    Py_XDECREF(pv);
    Py_XDECREF(pl);
    return res;
}
