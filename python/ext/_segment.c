/*
 * _segment.c - the Segment type: open/close, the fork rule's checks, and
 * the rank table (register, lookup, wait, list, withdraw).
 */
#include "_kvcoord.h" /* Python.h first */

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

/* json.JSONEncoder(separators=(",", ":"), ensure_ascii=False,
 * allow_nan=False).encode: the compact form kvcoordd stores
 * (jansson's JSON_COMPACT) for what sglang sends. */
static PyObject *json_encode;

/* ---- entering and leaving calls ------------------------------------------ */

static PyObject *closed_error(void)
{
    return kvcpy_raise_as(kvcpy_ClosedError, KVC_E_INVAL, "operation on a closed kvcoord.Segment");
}

/* A pthread_rwlock_* failure rc (never seen: EAGAIN past the reader limit,
 * EDEADLK) as kvcoord.Error; NULL. */
static PyObject *lock_error(const char *call, int rc)
{
    char msg[160];
    snprintf(msg, sizeof msg, "kvcoord.Segment: %s failed: %s", call, strerror(rc));
    return kvcpy_raise_msg(KVC_E_SYS, 0, msg);
}

kvc_segment *kvcpy_seg_enter(SegmentObject *s)
{
    if (s->fork_gen != kvcpy_fork_gen) {
        PyErr_Format(kvcpy_ForkedError,
                     "this Segment was opened by process %ld before fork(); process %ld must "
                     "open its own kvcoord.Segment",
                     s->owner_pid, (long)getpid());
        return NULL;
    }
    /* `closing` and `seg` are written with the GIL held, as here: once
     * close() has started, no call gets past this line. */
    if (!s->seg || s->closing)
        return (kvc_segment *)closed_error();
    int rc = pthread_rwlock_tryrdlock(&s->use);
    if (rc == EBUSY) {
        /* close() holds it: wait without the GIL (close needs it to finish) */
        Py_BEGIN_ALLOW_THREADS
        rc = pthread_rwlock_rdlock(&s->use);
        Py_END_ALLOW_THREADS
    }
    if (rc)
        return (kvc_segment *)lock_error("pthread_rwlock_rdlock", rc);
    if (!s->seg || s->closing) {
        pthread_rwlock_unlock(&s->use);
        return (kvc_segment *)closed_error();
    }
    return s->seg;
}

void kvcpy_seg_leave(SegmentObject *s) { pthread_rwlock_unlock(&s->use); }

/* ---- lifetime ---------------------------------------------------------------- */

static PyObject *seg_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    (void)args;
    (void)kw;
    SegmentObject *s = (SegmentObject *)type->tp_alloc(type, 0);
    if (!s)
        return NULL;
    int rc = pthread_rwlock_init(&s->use, NULL);
    if (rc) {
        Py_DECREF(s); /* lock_ready is 0: dealloc leaves the lock alone */
        return lock_error("pthread_rwlock_init", rc);
    }
    s->lock_ready = 1;
    s->rank = -1;
    s->fork_gen = kvcpy_fork_gen;
    return (PyObject *)s;
}

/* Close the handle (GIL held on entry and exit): 0, or -1 with an
 * exception set when the lock failed (the handle is then left mapped, never
 * freed under a call).  From the moment it starts no call enters (see
 * kvcpy_seg_enter), so it waits only for the calls already inside, each
 * bounded (lock timeout, wait slice), however many threads keep calling. */
static int seg_close_handle(SegmentObject *s)
{
    if (!s->seg)
        return 0;
    __atomic_store_n(&s->closing, 1, __ATOMIC_RELEASE); /* read without the GIL by waits */
    if (s->fork_gen != kvcpy_fork_gen) {
        /* A fork child: the handle is the parent's; kvc_close only unmaps
         * it here (it leaves the parent's entries alone).  Its lock may
         * have been copied held by a thread that does not exist here. */
        kvc_segment *g = s->seg;
        s->seg = NULL;
        kvc_close(g);
        return 0;
    }
    int rc;
    kvcpy_coll_closing(s->seg); /* a collective waiting gives up at once */
    Py_BEGIN_ALLOW_THREADS
    rc = pthread_rwlock_wrlock(&s->use);
    Py_END_ALLOW_THREADS
    if (rc) {
        lock_error("pthread_rwlock_wrlock", rc);
        return -1;
    }
    kvc_segment *g = s->seg; /* NULL when another thread's close() won */
    s->seg = NULL;
    Py_BEGIN_ALLOW_THREADS
    if (g)
        kvc_close(g);
    pthread_rwlock_unlock(&s->use);
    Py_END_ALLOW_THREADS
    return 0;
}

static void seg_dealloc(SegmentObject *s)
{
    PyObject_GC_UnTrack(s);
    if (s->weakrefs)
        PyObject_ClearWeakRefs((PyObject *)s);
    if (seg_close_handle(s) < 0)
        PyErr_WriteUnraisable((PyObject *)s); /* the lock stays: a call may hold it */
    else if (s->lock_ready)
        pthread_rwlock_destroy(&s->use);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static int seg_traverse(SegmentObject *s, visitproc visit, void *arg)
{
    (void)s;
    (void)visit;
    (void)arg;
    return 0;
}

/* Options from keywords: role (str), mode (str) and capacities. */
static int parse_role(const char *role, PyObject *rank, kvc_role *out)
{
    if (!role)
        *out = rank != Py_None ? KVC_ROLE_WORKER : KVC_ROLE_CLIENT;
    else if (!strcmp(role, "worker"))
        *out = KVC_ROLE_WORKER;
    else if (!strcmp(role, "client"))
        *out = KVC_ROLE_CLIENT;
    else if (!strcmp(role, "none"))
        *out = KVC_ROLE_NONE;
    else {
        PyErr_Format(PyExc_ValueError, "role must be 'worker', 'client' or 'none', not '%s'", role);
        return -1;
    }
    return 0;
}

static int parse_mode(const char *mode, kvc_open_mode *out)
{
    if (!mode || !strcmp(mode, "attach"))
        *out = KVC_OPEN_ATTACH;
    else if (!strcmp(mode, "create"))
        *out = KVC_OPEN_CREATE;
    else if (!strcmp(mode, "fresh"))
        *out = KVC_OPEN_FRESH;
    else if (!strcmp(mode, "force_fresh"))
        *out = KVC_OPEN_FRESH_FORCE;
    else {
        PyErr_Format(PyExc_ValueError,
                     "mode must be 'attach', 'create', 'fresh' or 'force_fresh', not '%s'", mode);
        return -1;
    }
    return 0;
}

/* A capacity keyword: None keeps the default. */
static int opt_u64(PyObject *o, const char *what, unsigned long long max, uint64_t *out)
{
    if (!o || o == Py_None)
        return 0;
    long long v;
    if (!kvcpy_conv_range(o, 1, max > (unsigned long long)LLONG_MAX ? LLONG_MAX : (long long)max,
                          what, "", &v))
        return -1;
    *out = (uint64_t)v;
    return 0;
}

/* Seconds (None keeps the default) into milliseconds. */
/* Seconds o into *out ms, 1..max_ms. */
static int opt_ms(PyObject *o, const char *what, uint32_t max_ms, uint32_t *out)
{
    if (!o || o == Py_None)
        return 0;
    double t;
    if (!kvcpy_conv_timeout(o, &t))
        return -1;
    if (t * 1000.0 < 1.0 || t * 1000.0 > (double)max_ms) {
        PyErr_Format(PyExc_ValueError, "%s must be between 0.001 and %u seconds, not %R", what,
                     max_ms / 1000, o);
        return -1;
    }
    *out = (uint32_t)(t * 1000.0 + 0.5);
    return 0;
}

static int fill_capacities(kvc_options *o, PyObject *mr, PyObject *mi, PyObject *ab, PyObject *mp,
                           PyObject *ws, PyObject *mro, PyObject *lt, PyObject *ttl)
{
    uint64_t v;
    v = o->max_ranks;
    if (opt_u64(mr, "max_ranks", UINT32_MAX - 1ull, &v))
        return -1;
    o->max_ranks = (uint32_t)v;
    if (opt_u64(mi, "max_info_bytes", UINT64_MAX >> 1, &o->max_info_bytes) ||
        opt_u64(ab, "arena_bytes", UINT64_MAX >> 1, &o->arena_bytes))
        return -1;
    v = o->max_procs;
    if (opt_u64(mp, "max_procs", UINT32_MAX, &v))
        return -1;
    o->max_procs = (uint32_t)v;
    v = o->world_size;
    if (opt_u64(ws, "world_size", KVC_ROOM_MAX_PARTICIPANTS, &v))
        return -1;
    o->world_size = (uint32_t)v;
    v = o->max_rooms;
    if (opt_u64(mro, "max_rooms", UINT32_MAX, &v))
        return -1;
    o->max_rooms = (uint32_t)v;
    return opt_ms(lt, "lock_timeout", KVC_LIMIT_LOCK_TIMEOUT_MS, &o->lock_timeout_ms) ||
                   opt_ms(ttl, "room_ttl", UINT32_MAX, &o->room_ttl_ms)
               ? -1
               : 0;
}

static int seg_init(SegmentObject *s, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"name",      "port",       "role",           "rank",
                             "mode",      "max_ranks",  "max_info_bytes", "arena_bytes",
                             "max_procs", "world_size", "max_rooms",      "lock_timeout",
                             "room_ttl",  NULL};
    PyObject *name = Py_None, *port = NULL, *rank = Py_None, *mr = NULL, *mi = NULL, *ab = NULL,
             *mp = NULL, *ws = NULL, *mro = NULL, *lt = NULL, *ttl = NULL;
    const char *role = NULL, *mode = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O$OzOzOOOOOOOO", kwlist, &name, &port, &role,
                                     &rank, &mode, &mr, &mi, &ab, &mp, &ws, &mro, &lt, &ttl))
        return -1;
    if (s->seg) {
        PyErr_SetString(PyExc_RuntimeError, "kvcoord.Segment is already open");
        return -1;
    }
    kvc_options o;
    kvc_options_init(&o);
    char buf[KVC_NAME_MAX + 1];
    if (name != Py_None) {
        if (!PyUnicode_Check(name)) {
            PyErr_Format(PyExc_TypeError, "segment name must be a str or None, not %.100s",
                         Py_TYPE(name)->tp_name);
            return -1;
        }
        Py_ssize_t n;
        const char *nm = PyUnicode_AsUTF8AndSize(name, &n);
        if (!nm)
            return -1;
        if ((size_t)n != strlen(nm)) {
            PyErr_SetString(kvcpy_InvalidError, "segment name contains a NUL byte");
            return -1;
        }
        o.name = nm;
    } else {
        uint64_t p = KVC_DEFAULT_PORT;
        if (port && port != Py_None && opt_u64(port, "port", 65535, &p))
            return -1;
        kvc_name_for_port((uint16_t)p, buf, sizeof buf);
        o.name = buf;
    }
    if (parse_role(role, rank, &o.role) || parse_mode(mode, &o.mode) ||
        fill_capacities(&o, mr, mi, ab, mp, ws, mro, lt, ttl))
        return -1;
    unsigned long long r = 0;
    if (rank != Py_None) { /* kvc_options.rank is an int32_t */
        if (!kvcpy_conv_uint(rank, INT32_MAX, "rank", " or None", &r))
            return -1;
        o.rank = (int32_t)r;
    }
    kvc_segment *g = NULL;
    kvc_err e;
    Py_BEGIN_ALLOW_THREADS
    e = kvc_open(&o, &g);
    Py_END_ALLOW_THREADS
    if (e) {
        kvcpy_raise(e, 1);
        return -1;
    }
    s->seg = g;
    s->closing = 0; /* __init__ again after close() */
    s->fork_gen = kvcpy_fork_gen;
    s->owner_pid = (long)getpid();
    s->rank = o.rank;
    s->role = o.role;
    return 0;
}

static PyObject *seg_close(SegmentObject *s, PyObject *unused)
{
    (void)unused;
    if (seg_close_handle(s) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *seg_enter_ctx(SegmentObject *s, PyObject *unused)
{
    (void)unused;
    if (!s->seg || s->closing)
        return closed_error();
    Py_INCREF(s);
    return (PyObject *)s;
}

static PyObject *seg_exit_ctx(SegmentObject *s, PyObject *args)
{
    (void)args;
    if (seg_close_handle(s) < 0)
        return NULL;
    Py_RETURN_FALSE;
}

/* ---- rank table ------------------------------------------------------------ */

/* weights_info_dict as JSON bytes: a dict is encoded, bytes-like taken as
 * is.  On success *view holds the bytes (release with PyBuffer_Release). */
static int info_bytes(PyObject *o, Py_buffer *view)
{
    if (PyDict_Check(o)) {
        PyObject *txt = PyObject_CallOneArg(json_encode, o);
        if (!txt)
            return -1; /* TypeError (not serialisable) or ValueError (NaN) */
        PyObject *b = PyUnicode_AsUTF8String(txt);
        Py_DECREF(txt);
        if (!b)
            return -1;
        int rc = PyObject_GetBuffer(b, view, PyBUF_SIMPLE);
        Py_DECREF(b); /* the view keeps it */
        return rc;
    }
    if (PyObject_CheckBuffer(o) && !PyUnicode_Check(o))
        return PyObject_GetBuffer(o, view, PyBUF_SIMPLE);
    PyErr_Format(PyExc_TypeError,
                 "weights_info_dict must be a dict or bytes holding a JSON object, not %.100s",
                 Py_TYPE(o)->tp_name);
    return -1;
}

/* session_id as UTF-8 without NUL bytes (the library's rules do the rest). */
static const char *session_id_str(PyObject *o)
{
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "session_id must be a str, not %.100s", Py_TYPE(o)->tp_name);
        return NULL;
    }
    Py_ssize_t n;
    const char *sid = PyUnicode_AsUTF8AndSize(o, &n);
    if (sid && (size_t)n != strlen(sid)) {
        PyErr_SetString(kvcpy_InvalidError, "session_id contains a NUL byte");
        return NULL;
    }
    return sid;
}

/* kvc_role_register(), noting in *held the pid of another process that
 * held rank (a local registration) and still runs, else 0: the library
 * replaces it silently (last writer wins, and the rank is then withdrawn
 * when this process ends), so the binding says so (seg_register). */
static kvc_err register_noting(kvc_segment *g, const char *role, uint32_t rank, const char *sid,
                               const void *info, size_t len, uint64_t *gen, int32_t *held)
{
    kvc_rank_info prev = {0};
    *held = 0;
    if (kvc_role_lookup(g, role, rank, &prev) == KVC_OK && prev.pid > 0 &&
        prev.pid != (int32_t)getpid() && !prev.origin[0] &&
        (kill(prev.pid, 0) == 0 || errno == EPERM))
        *held = prev.pid;
    kvc_rank_info_free(&prev);
    kvc_err e = kvc_role_register(g, role, rank, sid, info, len, gen);
    if (e)
        *held = 0;
    return e;
}

/* A warning on the "kvcoord" logger that rank, held by live process pid,
 * was replaced; returns -1 with an exception set when logging raised. */
static int warn_replaced(uint32_t rank, const char *role, int32_t pid)
{
    PyObject *logging = PyImport_ImportModule("logging");
    PyObject *logger = logging ? PyObject_CallMethod(logging, "getLogger", "s", "kvcoord") : NULL;
    PyObject *r = logger ? PyObject_CallMethod(logger, "warning", "sIssi",
                                               "rank %d%s%s was registered by process %d, which "
                                               "still runs: this registration replaces it, and "
                                               "this process's exit will withdraw the rank (the "
                                               "other process's registration is not restored)",
                                               (unsigned)rank, role && *role ? " role " : "",
                                               role ? role : "", (int)pid)
                         : NULL;
    Py_XDECREF(r);
    Py_XDECREF(logger);
    Py_XDECREF(logging);
    return r ? 0 : -1;
}

static PyObject *seg_register(SegmentObject *s, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"rank", "session_id", "weights_info_dict", "role", NULL};
    uint32_t rank;
    PyObject *sido, *info;
    const char *role = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&OO|$z", kwlist, kvcpy_conv_rank, &rank, &sido,
                                     &info, &role))
        return NULL;
    const char *sid = session_id_str(sido);
    Py_buffer view;
    if (!sid || info_bytes(info, &view) < 0)
        return NULL;
    uint64_t gen = 0;
    int32_t held = 0;
    int e;
    KVCPY_RUN(s, e, register_noting(g, role, rank, sid, view.buf, (size_t)view.len, &gen, &held));
    PyBuffer_Release(&view);
    if (e)
        return kvcpy_fail(e);
    if (held && warn_replaced(rank, role, held) < 0)
        return NULL;
    return PyLong_FromUnsignedLongLong(gen);
}

/* One lookup of rank into *ri (GIL released); raises on failure. */
static int lookup(SegmentObject *s, uint32_t rank, kvc_rank_info *ri)
{
    int e;
    KVCPY_RUN(s, e, kvc_rank_lookup(g, rank, ri));
    if (e) {
        kvcpy_fail(e);
        return -1;
    }
    return 0;
}

/* Lookup under a role (kind 0) or of a parallelism config (kind 1). */
static PyObject *lookup_kind(SegmentObject *s, PyObject *args, PyObject *kw, int kind)
{
    static char *kwlist[] = {"rank", "role", NULL};
    uint32_t rank;
    const char *role = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|z", kwlist, kvcpy_conv_rank, &rank, &role))
        return NULL;
    kvc_rank_info ri = {0};
    int e;
    KVCPY_RUN(s, e,
              kind ? kvc_parallelism_lookup(g, role, rank, &ri)
                   : kvc_role_lookup(g, role, rank, &ri));
    PyObject *r = e ? kvcpy_fail(e) : kvcpy_rankinfo_new(&ri, 1);
    kvc_rank_info_free(&ri);
    return r;
}

static PyObject *seg_role_lookup(SegmentObject *s, PyObject *args, PyObject *kw)
{
    return lookup_kind(s, args, kw, 0);
}

static PyObject *seg_parallelism_lookup(SegmentObject *s, PyObject *args, PyObject *kw)
{
    return lookup_kind(s, args, kw, 1);
}

static PyObject *seg_parallelism_register(SegmentObject *s, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"rank", "parallelism_config", "role", NULL};
    uint32_t rank;
    PyObject *cfg;
    const char *role = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&O|z", kwlist, kvcpy_conv_rank, &rank, &cfg,
                                     &role))
        return NULL;
    Py_buffer view;
    if (info_bytes(cfg, &view) < 0)
        return NULL;
    uint64_t gen = 0;
    int e;
    KVCPY_RUN(s, e, kvc_parallelism_register(g, role, rank, view.buf, (size_t)view.len, &gen));
    PyBuffer_Release(&view);
    if (e)
        return kvcpy_fail(e);
    return PyLong_FromUnsignedLongLong(gen);
}

static PyObject *seg_roles(SegmentObject *s, PyObject *unused)
{
    (void)unused;
    char names[KVC_RANK_ROLES][KVC_ROLE_NAME_MAX + 1];
    size_t n = 0;
    int e;
    KVCPY_RUN(s, e, kvc_role_names(g, names, KVC_RANK_ROLES, &n));
    if (e)
        return kvcpy_fail(e);
    PyObject *list = PyList_New(0);
    for (size_t i = 0; list && i < n && i < KVC_RANK_ROLES; i++) {
        PyObject *o = PyUnicode_FromString(names[i]);
        if (!o || PyList_Append(list, o) < 0)
            Py_CLEAR(list);
        Py_XDECREF(o);
    }
    return list;
}

static PyObject *seg_lookup(SegmentObject *s, PyObject *arg)
{
    uint32_t rank;
    if (!kvcpy_conv_rank(arg, &rank))
        return NULL;
    kvc_rank_info ri = {0};
    PyObject *r = lookup(s, rank, &ri) ? NULL : kvcpy_rankinfo_new(&ri, 1);
    kvc_rank_info_free(&ri);
    return r;
}

static PyObject *seg_lookup_raw(SegmentObject *s, PyObject *arg)
{
    uint32_t rank;
    if (!kvcpy_conv_rank(arg, &rank))
        return NULL;
    kvc_rank_info ri = {0};
    PyObject *r =
        lookup(s, rank, &ri) ? NULL : PyBytes_FromStringAndSize(ri.info, (Py_ssize_t)ri.info_len);
    kvc_rank_info_free(&ri);
    return r;
}

/* Wait for rank in slices, checking for signals between them. */
static int wait_rank(SegmentObject *s, uint32_t rank, double timeout, kvc_rank_info *ri)
{
    double deadline = timeout < 0 ? -1.0 : kvcpy_now() + timeout;
    for (;;) {
        uint32_t ms = kvcpy_slice_ms(deadline);
        int e;
        KVCPY_RUN(s, e, kvc_rank_wait(g, rank, ms, ri));
        if (e == KVC_OK)
            return 0;
        if (e != KVC_E_TIMEDOUT && e != KVC_E_NOENT && e != KVC_E_WITHDRAWN) {
            kvcpy_fail(e);
            return -1;
        }
        if (deadline >= 0 && kvcpy_now() >= deadline) {
            char msg[160];
            snprintf(msg, sizeof msg, "rank %u was not registered within %g s", rank, timeout);
            kvcpy_raise_msg(KVC_E_TIMEDOUT, 0, msg);
            return -1;
        }
        if (PyErr_CheckSignals() < 0)
            return -1;
    }
}

static PyObject *seg_wait(SegmentObject *s, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"rank", "timeout", NULL};
    uint32_t rank;
    double timeout = -1.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|O&", kwlist, kvcpy_conv_rank, &rank,
                                     kvcpy_conv_timeout, &timeout))
        return NULL;
    kvc_rank_info ri = {0};
    PyObject *r = wait_rank(s, rank, timeout, &ri) ? NULL : kvcpy_rankinfo_new(&ri, 1);
    kvc_rank_info_free(&ri);
    return r;
}

/* A listing's entry: without its info (kvc_rank_list leaves it out). */
static PyObject *listed_rank(const void *item) { return kvcpy_rankinfo_new(item, 0); }

static kvc_err list_ranks(kvc_segment *g, void *buf, size_t cap, size_t *count, const void *ctx)
{
    return kvc_rank_list(g, buf, cap, count, *(const int *)ctx);
}

static PyObject *seg_ranks(SegmentObject *s, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"include_withdrawn", NULL};
    int withdrawn = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|p", kwlist, &withdrawn))
        return NULL;
    return kvcpy_listing(s, list_ranks, &withdrawn, sizeof(kvc_rank_info), 64, listed_rank);
}

static PyObject *seg_withdraw(SegmentObject *s, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"rank", "note", "role", NULL};
    uint32_t rank;
    const char *note = NULL, *role = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|z$z", kwlist, kvcpy_conv_rank, &rank, &note,
                                     &role))
        return NULL;
    int e;
    KVCPY_RUN(s, e,
              kvc_role_withdraw(g, role, rank, note ? note : "withdrawn by Segment.withdraw()"));
    if (e)
        return kvcpy_fail(e);
    Py_RETURN_NONE;
}

static PyObject *seg_epoch(SegmentObject *s, PyObject *unused)
{
    (void)unused;
    kvc_segment *g = kvcpy_seg_enter(s);
    if (!g)
        return NULL;
    uint32_t ep = kvc_rank_epoch(g);
    kvcpy_seg_leave(s);
    return PyLong_FromUnsignedLong(ep);
}

static PyObject *seg_wait_change(SegmentObject *s, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"seen", "timeout", NULL};
    unsigned long seen;
    double timeout = -1.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "k|O&", kwlist, &seen, kvcpy_conv_timeout, &timeout))
        return NULL;
    double deadline = timeout < 0 ? -1.0 : kvcpy_now() + timeout;
    for (;;) {
        uint32_t ms = kvcpy_slice_ms(deadline);
        int e;
        KVCPY_RUN(s, e, kvc_rank_wait_change(g, (uint32_t)seen, ms));
        if (e == KVC_OK)
            Py_RETURN_TRUE;
        if (e != KVC_E_TIMEDOUT)
            return kvcpy_fail(e);
        if (deadline >= 0 && kvcpy_now() >= deadline)
            Py_RETURN_FALSE;
        if (PyErr_CheckSignals() < 0)
            return NULL;
    }
}

#define SET_U(d, k, v) \
    ok = ok && set_item(d, k, PyLong_FromUnsignedLongLong((unsigned long long)(v)))

static int set_item(PyObject *d, const char *k, PyObject *v)
{
    int rc = v ? PyDict_SetItemString(d, k, v) : -1;
    Py_XDECREF(v);
    return rc == 0;
}

static PyObject *seg_stat(SegmentObject *s, PyObject *unused)
{
    (void)unused;
    kvc_segment_info si;
    int e;
    KVCPY_RUN(s, e, kvc_segment_stat(g, &si));
    if (e)
        return kvcpy_fail(e);
    PyObject *d = PyDict_New();
    int ok = d != NULL;
    SET_U(d, "layout_version", si.layout_version);
    SET_U(d, "max_ranks", si.max_ranks);
    SET_U(d, "max_procs", si.max_procs);
    SET_U(d, "world_size", si.world_size);
    SET_U(d, "max_info_bytes", si.max_info_bytes);
    SET_U(d, "arena_bytes", si.arena_bytes);
    SET_U(d, "arena_used", si.arena_used);
    SET_U(d, "total_bytes", si.total_bytes);
    ok = ok && set_item(d, "creator_pid", PyLong_FromLong(si.creator_pid));
    SET_U(d, "created_ns", si.created_ns);
    SET_U(d, "updated_ns", si.updated_ns);
    SET_U(d, "lock_recoveries", si.lock_recoveries);
    SET_U(d, "ranks_registered", si.ranks_registered);
    SET_U(d, "max_rooms", si.max_rooms);
    SET_U(d, "rooms_live", si.rooms_live);
    SET_U(d, "room_ttl_ms", si.room_ttl_ms);
    SET_U(d, "failures_total", si.failures_total);
    SET_U(d, "rooms_evicted", si.rooms_evicted);
    if (!ok)
        Py_CLEAR(d);
    return d;
}

/* ---- attributes -------------------------------------------------------------- */

static PyObject *get_name(SegmentObject *s, void *c)
{
    (void)c;
    if (!s->seg)
        Py_RETURN_NONE;
    return PyUnicode_FromString(kvc_segment_name(s->seg));
}

static PyObject *get_closed(SegmentObject *s, void *c)
{
    (void)c;
    return PyBool_FromLong(s->seg == NULL);
}

static PyObject *get_rank(SegmentObject *s, void *c)
{
    (void)c;
    if (s->rank < 0)
        Py_RETURN_NONE;
    return PyLong_FromLong(s->rank);
}

static PyObject *get_role(SegmentObject *s, void *c)
{
    (void)c;
    return PyUnicode_FromString(kvc_role_name(s->role));
}

static PyObject *get_forked(SegmentObject *s, void *c)
{
    (void)c;
    return PyBool_FromLong(s->fork_gen != kvcpy_fork_gen);
}

static PyGetSetDef seg_getset[] = {
    {"name", (getter)get_name, NULL, "Segment name (str; None once closed).", NULL},
    {"closed", (getter)get_closed, NULL, "True once close() ran.", NULL},
    {"rank", (getter)get_rank, NULL, "Rank declared at open (int or None).", NULL},
    {"role", (getter)get_role, NULL, "Role in the process table: 'worker', 'client', 'none'.",
     NULL},
    {"forked", (getter)get_forked, NULL,
     "True in a child of fork(): every call then raises ForkedSegmentError.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

#define THREADS "Thread-safe; releases the GIL while in the library."
#define KW (PyCFunction)(void (*)(void))

static PyMethodDef seg_methods[] = {
    {"close", (PyCFunction)seg_close, METH_NOARGS,
     "close() -> None\n\nDetach: on a worker's last handle its ranks are withdrawn, and rooms "
     "this process opened and did not release fail.  From the moment it starts, every new "
     "call on this Segment (any thread) raises SegmentClosedError; it waits only for the "
     "calls already in progress (each at most the lock timeout or one 0.2 s slice of a "
     "wait), however many threads keep calling.  Idempotent.  In a fork child only unmaps "
     "the parent's handle.  Raises kvcoord.Error only if its pthread lock fails (never "
     "seen; the handle then stays mapped)."},
    {"__enter__", (PyCFunction)seg_enter_ctx, METH_NOARGS,
     "Return self (SegmentClosedError, a ValueError, if closed)."},
    {"__exit__", (PyCFunction)seg_exit_ctx, METH_VARARGS, "close()."},
    {"register", KW seg_register, METH_VARARGS | METH_KEYWORDS,
     "register(rank, session_id, weights_info_dict, *, role=None) -> int\n\nPublish rank's "
     "transfer-engine info under role (None or 'target': the default role, i.e. the rank "
     "table; another name, e.g. 'draft', is claimed on first use, at most 3 per segment); "
     "returns the entry's generation (unchanged by an identical re-registration).  "
     "weights_info_dict: a dict (encoded as compact JSON, as kvcoordd stores what it "
     "receives) or bytes already holding a JSON object.\nErrors: TypeError (wrong types, "
     "values json cannot encode), ValueError (negative or huge rank, NaN), "
     "InvalidArgumentError (not a JSON object, empty session_id, rank >= max ranks, too "
     "big), Error (arena full, lock busy).  Replacing a rank that another process registered "
     "and that still runs succeeds (last writer wins) and logs a warning on the 'kvcoord' "
     "logger: this process's exit will withdraw the rank, the other's no longer does.  " THREADS},
    {"lookup", (PyCFunction)seg_lookup, METH_O,
     "lookup(rank) -> RankInfo\n\nRead rank's entry (lock-free): session_id, generation, raw "
     "JSON; weights_info_dict is decoded on first access.\nErrors: NotFoundError (a "
     "KeyError: never registered), WithdrawnError (a KeyError naming why), "
     "InvalidArgumentError (rank >= max ranks), TypeError/ValueError (not a rank).  " THREADS},
    {"lookup_raw", (PyCFunction)seg_lookup_raw, METH_O,
     "lookup_raw(rank) -> bytes\n\nrank's weights_info_dict JSON, byte for byte.  Errors as "
     "lookup().  " THREADS},
    {"wait", KW seg_wait, METH_VARARGS | METH_KEYWORDS,
     "wait(rank, timeout=None) -> RankInfo\n\nAs lookup(), waiting up to timeout seconds "
     "(float; None: no limit) for rank to be registered (shared futex, no polling; Ctrl-C "
     "interrupts).\nErrors: WaitTimeoutError (a TimeoutError), those of lookup().  " THREADS},
    {"ranks", KW seg_ranks, METH_VARARGS | METH_KEYWORDS,
     "ranks(include_withdrawn=False) -> list[RankInfo]\n\nRegistered entries ascending by rank, "
     "without their weights_info_dict (raw is None).  " THREADS},
    {"withdraw", KW seg_withdraw, METH_VARARGS | METH_KEYWORDS,
     "withdraw(rank, note=None, *, role=None) -> None\n\nWithdraw rank (under role): "
     "lookups then raise WithdrawnError with note (at most 127 bytes kept).\nErrors: NotFoundError "
     "(not registered), "
     "InvalidArgumentError, Error.  " THREADS},
    {"role_lookup", KW seg_role_lookup, METH_VARARGS | METH_KEYWORDS,
     "role_lookup(rank, role=None) -> RankInfo\n\nlookup() of rank's transfer-engine info "
     "under role (None: the default role).\nErrors: those of lookup(); NotFoundError also for "
     "a role no registration used, InvalidArgumentError for a bad role name.  " THREADS},
    {"parallelism_register", KW seg_parallelism_register, METH_VARARGS | METH_KEYWORDS,
     "parallelism_register(rank, parallelism_config, role=None) -> int\n\nStore rank's "
     "parallelism config (a dict, or bytes holding a JSON object) under role; returns the "
     "entry's generation.  Stored in the segment like rank info: kvcoordd serves it at GET "
     "/get_parallelism_config.  A worker's configs are withdrawn with its ranks.\nErrors: as "
     "register().  " THREADS},
    {"parallelism_lookup", KW seg_parallelism_lookup, METH_VARARGS | METH_KEYWORDS,
     "parallelism_lookup(rank, role=None) -> RankInfo\n\nrank's parallelism config under "
     "role: .weights_info_dict is the config (dict, decoded on first access), .raw its JSON, "
     ".session_id ''.\nErrors: NotFoundError (a KeyError: none stored), WithdrawnError, "
     "InvalidArgumentError.  " THREADS},
    {"roles", (PyCFunction)seg_roles, METH_NOARGS,
     "roles() -> list[str]\n\nRole names in use in the segment, the default role "
     "('target') first.  Thread-safe."},
    {"epoch", (PyCFunction)seg_epoch, METH_NOARGS,
     "epoch() -> int\n\nThe rank table's change counter (32 bits, wrapping).  Thread-safe."},
    {"wait_change", KW seg_wait_change, METH_VARARGS | METH_KEYWORDS,
     "wait_change(seen, timeout=None) -> bool\n\nSleep until the rank table's epoch differs "
     "from seen (True) or timeout seconds pass (False).  " THREADS},
    {"stat", (PyCFunction)seg_stat, METH_NOARGS,
     "stat() -> dict\n\nCapacities and counters from the segment header (bytes, ns, ms as "
     "the keys say).  Thread-safe."},
    {"room_open", KW kvcpy_room_open, METH_VARARGS | METH_KEYWORDS, kvcpy_doc_room_open},
    {"room_set_state", KW kvcpy_room_set_state, METH_VARARGS | METH_KEYWORDS,
     kvcpy_doc_room_set_state},
    {"room_fail", KW kvcpy_room_fail, METH_VARARGS | METH_KEYWORDS, kvcpy_doc_room_fail},
    {"room_get", KW kvcpy_room_get, METH_VARARGS | METH_KEYWORDS, kvcpy_doc_room_get},
    {"check_room", KW kvcpy_check_room, METH_VARARGS | METH_KEYWORDS, kvcpy_doc_check_room},
    {"room_wait", KW kvcpy_room_wait, METH_VARARGS | METH_KEYWORDS, kvcpy_doc_room_wait},
    {"room_release", KW kvcpy_room_release, METH_VARARGS | METH_KEYWORDS, kvcpy_doc_room_release},
    {"room_sync", KW kvcpy_room_sync, METH_VARARGS | METH_KEYWORDS, kvcpy_doc_room_sync},
    {"rooms", KW kvcpy_room_list, METH_VARARGS | METH_KEYWORDS, kvcpy_doc_room_list},
    {"failures", KW kvcpy_failures, METH_VARARGS | METH_KEYWORDS, kvcpy_doc_failures},
    {"procs", (PyCFunction)kvcpy_procs, METH_NOARGS, kvcpy_doc_procs},
    {"reap_dead", (PyCFunction)kvcpy_reap_dead, METH_NOARGS, kvcpy_doc_reap_dead},
    {"room_sweep", (PyCFunction)kvcpy_room_sweep, METH_NOARGS, kvcpy_doc_room_sweep},
    {"allreduce_min", KW kvcpy_allreduce_min, METH_VARARGS | METH_KEYWORDS,
     kvcpy_doc_allreduce_min},
    {"allreduce_join", KW kvcpy_allreduce_join, METH_VARARGS | METH_KEYWORDS,
     kvcpy_doc_allreduce_join},
    {"poll_allreduce", KW kvcpy_poll_allreduce, METH_FASTCALL | METH_KEYWORDS,
     kvcpy_doc_poll_allreduce},
    {NULL, NULL, 0, NULL}};

static int seg_type_init(void)
{
    if (json_encode)
        return 0;
    PyObject *json = PyImport_ImportModule("json");
    if (!json)
        return -1;
    PyObject *cls = PyObject_GetAttrString(json, "JSONEncoder");
    Py_DECREF(json);
    if (!cls)
        return -1;
    PyObject *args = PyTuple_New(0);
    PyObject *kw = Py_BuildValue("{s(ss)sOsO}", "separators", ",", ":", "ensure_ascii", Py_False,
                                 "allow_nan", Py_False);
    PyObject *enc = args && kw ? PyObject_Call(cls, args, kw) : NULL;
    Py_DECREF(cls);
    Py_XDECREF(args);
    Py_XDECREF(kw);
    if (!enc)
        return -1;
    json_encode = PyObject_GetAttrString(enc, "encode");
    Py_DECREF(enc);
    return json_encode ? 0 : -1;
}

static PyObject *seg_type_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    if (seg_type_init() < 0)
        return NULL;
    return seg_new(type, args, kw);
}

PyTypeObject kvcpy_SegmentType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvcoord._kvcoord.Segment",
    .tp_basicsize = sizeof(SegmentObject),
    .tp_dealloc = (destructor)seg_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Segment(name=None, *, port=6789, role=None, rank=None, mode='attach', ...)\n\n"
              "An attached kvcoord segment (see kvcoord.Segment).",
    .tp_traverse = (traverseproc)seg_traverse,
    .tp_weaklistoffset = offsetof(SegmentObject, weakrefs),
    .tp_methods = seg_methods,
    .tp_getset = seg_getset,
    .tp_init = (initproc)seg_init,
    .tp_new = seg_type_new,
};
