/*
 * engine.c - module kvcoord._engine: the type Engine over the engine core
 * (engine_core.h), for kvcoord.mooncake.TransferEngine, which gives it
 * Mooncake's method names and return values.  This file converts
 * arguments (sequences of addresses into the calling thread's reusable
 * run buffer, no allocation per page) and releases the GIL around every
 * call that may block.
 *
 * An Engine may be used from any number of threads at once.  close()
 * waits for calls in progress in other threads to return.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine_core.h"
#include "engine_peer.h"

typedef struct {
    PyObject_HEAD mce *m;
    atomic_int users; /* calls in progress */
    atomic_bool closing;
    PyObject *weakrefs;
} EngineObject;

/* ---- the calling thread's run buffer ------------------------------------- */

static pthread_key_t runs_key;

typedef struct {
    kvt_run *v;
    size_t cap;
} run_buf;

static void run_buf_free(void *p)
{
    run_buf *b = p;
    free(b->v);
    free(b);
}

static kvt_run *runs_reserve(size_t n)
{
    if (n == 0) /* an empty batch: still a buffer (NULL means an error) */
        n = 1;
    run_buf *b = pthread_getspecific(runs_key);
    if (!b) {
        b = calloc(1, sizeof *b);
        if (!b || pthread_setspecific(runs_key, b)) {
            free(b);
            PyErr_NoMemory();
            return NULL;
        }
    }
    if (n > b->cap) {
        size_t cap = n < 1024 ? 1024 : n;
        kvt_run *v = realloc(b->v, cap * sizeof *v);
        if (!v) {
            PyErr_NoMemory();
            return NULL;
        }
        b->v = v;
        b->cap = cap;
    }
    return b->v;
}

/* o (an int, or an object with __index__) into *out when it is in
 * 0..2**64-1; else -1 with ValueError (TypeError: not an integer) naming
 * `what` (and [i] when i >= 0).  Never wraps: 2**64 + a is refused, not a. */
static int u64_of(PyObject *o, uint64_t *out, const char *what, Py_ssize_t i)
{
    char name[96];
    if (i >= 0)
        snprintf(name, sizeof name, "%s[%zd]", what, i);
    else
        snprintf(name, sizeof name, "%s", what);
    PyObject *n = PyNumber_Index(o);
    if (!n) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be an int in 0..2**64-1, not %R", name, o);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(n);
    Py_DECREF(n);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must be an int in 0..2**64-1, not %R", name, o);
        return -1;
    }
    *out = v;
    return 0;
}

/* buffers, peer addresses and lengths (sequences of equal length) into the
 * thread's run buffer; *n receives their count.  NULL with an exception. */
static kvt_run *runs_of(PyObject *bufs, PyObject *peers, PyObject *lens, size_t *n)
{
    PyObject *b = PySequence_Fast(bufs, "buffers must be a sequence of ints");
    PyObject *p =
        b ? PySequence_Fast(peers, "peer_buffer_addresses must be a sequence of ints") : NULL;
    PyObject *l = p ? PySequence_Fast(lens, "lengths must be a sequence of ints") : NULL;
    kvt_run *v = NULL;
    if (!l)
        goto out;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(b);
    if (PySequence_Fast_GET_SIZE(p) != k || PySequence_Fast_GET_SIZE(l) != k) {
        PyErr_Format(PyExc_ValueError,
                     "buffers, peer_buffer_addresses and lengths differ in length (%zd, %zd, %zd)",
                     k, PySequence_Fast_GET_SIZE(p), PySequence_Fast_GET_SIZE(l));
        goto out;
    }
    v = runs_reserve((size_t)k);
    if (!v)
        goto out;
    PyObject **bi = PySequence_Fast_ITEMS(b), **pi = PySequence_Fast_ITEMS(p),
             **li = PySequence_Fast_ITEMS(l);
    for (Py_ssize_t i = 0; i < k; i++)
        if (u64_of(bi[i], &v[i].laddr, "buffers", i) ||
            u64_of(pi[i], &v[i].raddr, "peer_buffer_addresses", i) ||
            u64_of(li[i], &v[i].len, "lengths", i)) {
            v = NULL;
            goto out;
        }
    *n = (size_t)k;
out:
    Py_XDECREF(b);
    Py_XDECREF(p);
    Py_XDECREF(l);
    return v;
}

/* ---- use and close ------------------------------------------------------------ */

static int enter(EngineObject *self)
{
    atomic_fetch_add(&self->users, 1);
    if (!self->m || atomic_load(&self->closing)) {
        atomic_fetch_sub(&self->users, 1);
        PyErr_SetString(PyExc_RuntimeError, "the transfer engine is closed (or not initialized)");
        return -1;
    }
    return 0;
}

static void leave(EngineObject *self) { atomic_fetch_sub(&self->users, 1); }

static void engine_close_now(EngineObject *self)
{
    if (!self->m || atomic_exchange(&self->closing, true))
        return;
    mce *m = self->m;
    Py_BEGIN_ALLOW_THREADS
    while (atomic_load(&self->users) > 0)
        usleep(1000);
    mce_destroy(m);
    Py_END_ALLOW_THREADS
    self->m = NULL;
}

/* ---- methods -------------------------------------------------------------------- */

static int Engine_init(EngineObject *self, PyObject *args, PyObject *kw)
{
    static char *kwl[] = {"host",     "backend", "device",        "timeout_s", "token",
                          "fetch_ms", "port",    "io_timeout_ms", NULL};
    const char *host, *backend = "auto", *device = NULL, *token = NULL;
    double timeout_s = 30.0;
    unsigned int fetch_ms = 5000;
    unsigned int io_timeout_ms = 0;
    int port = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|szdzIiI", kwl, &host, &backend, &device,
                                     &timeout_s, &token, &fetch_ms, &port, &io_timeout_ms))
        return -1;
    if (port < 0 || port > 65535) {
        PyErr_Format(PyExc_ValueError, "port must be 0..65535, not %d", port);
        return -1;
    }
    if (self->m) {
        PyErr_SetString(PyExc_RuntimeError, "Engine already initialized");
        return -1;
    }
    mce_opts o = {.host = host,
                  .port = (uint16_t)port,
                  .device = device,
                  .token = token,
                  .fetch_ms = fetch_ms,
                  .io_timeout_ms = io_timeout_ms};
    if (kvt_backend_parse(backend, &o.backend) != KVC_OK) {
        PyErr_Format(PyExc_ValueError, "backend must be auto, tcp or verbs, not %s", backend);
        return -1;
    }
    if (!(timeout_s > 0)) {
        PyErr_SetString(PyExc_ValueError, "timeout_s must be > 0");
        return -1;
    }
    o.timeout_ns = (uint64_t)(timeout_s * 1e9);
    int rc;
    mce *m = NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = mce_create(&o, &m);
    Py_END_ALLOW_THREADS
    if (rc) {
        PyErr_SetString(PyExc_OSError, mce_last_error());
        return -1;
    }
    self->m = m;
    return 0;
}

static void Engine_dealloc(EngineObject *self)
{
    if (self->weakrefs)
        PyObject_ClearWeakRefs((PyObject *)self);
    engine_close_now(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Engine_close(EngineObject *self, PyObject *unused)
{
    (void)unused;
    engine_close_now(self);
    Py_RETURN_NONE;
}

static PyObject *Engine_session_id(EngineObject *self, PyObject *unused)
{
    (void)unused;
    if (enter(self))
        return NULL;
    PyObject *r = PyUnicode_FromString(mce_session_id(self->m));
    leave(self);
    return r;
}

static PyObject *Engine_rpc_port(EngineObject *self, PyObject *unused)
{
    (void)unused;
    if (enter(self))
        return NULL;
    int port = mce_rpc_port(self->m);
    leave(self);
    return PyLong_FromLong(port);
}

static PyObject *Engine_backend(EngineObject *self, PyObject *unused)
{
    (void)unused;
    if (enter(self))
        return NULL;
    PyObject *r = PyUnicode_FromString(mce_backend_name(self->m));
    leave(self);
    return r;
}

static PyObject *Engine_register(EngineObject *self, PyObject *args)
{
    PyObject *ao, *lo;
    uint64_t addr, len;
    if (!PyArg_ParseTuple(args, "OO", &ao, &lo) || u64_of(ao, &addr, "buffer_addr", -1) ||
        u64_of(lo, &len, "capacity", -1) || enter(self))
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = mce_mr_register(self->m, addr, len);
    Py_END_ALLOW_THREADS
    leave(self);
    return PyLong_FromLong(rc);
}

static PyObject *Engine_unregister(EngineObject *self, PyObject *args)
{
    PyObject *ao;
    uint64_t addr;
    if (!PyArg_ParseTuple(args, "O", &ao) || u64_of(ao, &addr, "buffer_addr", -1) || enter(self))
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = mce_mr_unregister(self->m, addr);
    Py_END_ALLOW_THREADS
    leave(self);
    return PyLong_FromLong(rc);
}

/* The arguments of transfer() and submit(): (session_id, op, buffers,
 * peer_buffer_addresses, lengths) into *sid (borrowed from args), *op and
 * the thread's run buffer (*runs, *n); then enter(self).  -1 with an
 * exception. */
static int batch_args(EngineObject *self, PyObject *args, const char **sid, int *op, kvt_run **runs,
                      size_t *n)
{
    PyObject *bufs, *peers, *lens;
    if (!PyArg_ParseTuple(args, "siOOO", sid, op, &bufs, &peers, &lens))
        return -1;
    *n = 0;
    *runs = runs_of(bufs, peers, lens, n);
    return !*runs || enter(self) ? -1 : 0;
}

/* transfer(session_id, op, buffers, peer_buffer_addresses, lengths) -> 0 / -1 */
static PyObject *Engine_transfer(EngineObject *self, PyObject *args)
{
    const char *sid;
    int op;
    kvt_run *runs;
    size_t n;
    if (batch_args(self, args, &sid, &op, &runs, &n))
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = mce_transfer(self->m, sid, op, runs, n);
    Py_END_ALLOW_THREADS
    leave(self);
    return PyLong_FromLong(rc);
}

/* transfer_one(session_id, op, buffer, peer_buffer_address, length) -> 0 / -1 */
static PyObject *Engine_transfer_one(EngineObject *self, PyObject *args)
{
    const char *sid;
    int op;
    PyObject *bo, *po, *lo;
    uint64_t b, p, l;
    if (!PyArg_ParseTuple(args, "siOOO", &sid, &op, &bo, &po, &lo) ||
        u64_of(bo, &b, "buffer", -1) || u64_of(po, &p, "peer_buffer_address", -1) ||
        u64_of(lo, &l, "length", -1) || enter(self))
        return NULL;
    kvt_run run = {.laddr = b, .raddr = p, .len = l};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = mce_transfer(self->m, sid, op, &run, 1);
    Py_END_ALLOW_THREADS
    leave(self);
    return PyLong_FromLong(rc);
}

/* submit(session_id, op, buffers, peer_buffer_addresses, lengths) -> id (0: failed) */
static PyObject *Engine_submit(EngineObject *self, PyObject *args)
{
    const char *sid;
    int op;
    kvt_run *runs;
    size_t n;
    if (batch_args(self, args, &sid, &op, &runs, &n))
        return NULL;
    uint64_t id;
    Py_BEGIN_ALLOW_THREADS
    id = mce_submit(self->m, sid, op, runs, n);
    Py_END_ALLOW_THREADS
    leave(self);
    return PyLong_FromUnsignedLongLong(id);
}

/* batch_wait(id, block) -> 1 done, -1 failed, -2 deadline passed, 0 pending,
 * -3 unknown (never submitted, or its end already reported) */
static PyObject *Engine_batch_wait(EngineObject *self, PyObject *args)
{
    PyObject *io;
    uint64_t id;
    int block;
    if (!PyArg_ParseTuple(args, "Op", &io, &block) || u64_of(io, &id, "batch_id", -1) ||
        enter(self))
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = mce_batch_wait(self->m, id, block);
    Py_END_ALLOW_THREADS
    leave(self);
    return PyLong_FromLong(rc);
}

static PyObject *Engine_probe(EngineObject *self, PyObject *args)
{
    const char *sid;
    if (!PyArg_ParseTuple(args, "s", &sid) || enter(self))
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = mce_probe(self->m, sid);
    Py_END_ALLOW_THREADS
    leave(self);
    return PyLong_FromLong(rc);
}

static PyObject *Engine_peer_add(EngineObject *self, PyObject *args)
{
    const char *json;
    Py_ssize_t len;
    if (!PyArg_ParseTuple(args, "s#", &json, &len) || enter(self))
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = mce_peer_add(self->m, json, (size_t)len);
    Py_END_ALLOW_THREADS
    leave(self);
    return PyLong_FromLong(rc);
}

static PyObject *Engine_descriptor(EngineObject *self, PyObject *unused)
{
    (void)unused;
    if (enter(self))
        return NULL;
    char *json = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = mce_descriptor(self->m, &json);
    Py_END_ALLOW_THREADS
    leave(self);
    if (rc) {
        PyErr_SetString(PyExc_OSError, mce_last_error());
        return NULL;
    }
    PyObject *r = PyUnicode_FromString(json);
    free(json);
    return r;
}

static PyObject *Engine_engine_last_error(EngineObject *self, PyObject *unused)
{
    (void)unused;
    if (enter(self))
        return NULL;
    char buf[512];
    uint64_t t;
    Py_BEGIN_ALLOW_THREADS
    t = mce_engine_last_error(self->m, buf, sizeof buf);
    Py_END_ALLOW_THREADS
    leave(self);
    return Py_BuildValue("(Ks)", (unsigned long long)t, buf);
}

/* log_take() -> [(level, line)]: the engine's WARN/ERROR lines since last time */
static PyObject *Engine_log_take(EngineObject *self, PyObject *unused)
{
    (void)unused;
    if (enter(self))
        return NULL;
    PyObject *out = PyList_New(0);
    char buf[256];
    int level;
    while (out && (level = mce_log_take(self->m, buf, sizeof buf)) >= 0) {
        PyObject *t = Py_BuildValue("(is)", level, buf);
        if (!t || PyList_Append(out, t)) {
            Py_XDECREF(t);
            Py_CLEAR(out);
            break;
        }
        Py_DECREF(t);
    }
    leave(self);
    return out;
}

static PyObject *Engine_stats(EngineObject *self, PyObject *unused)
{
    (void)unused;
    if (enter(self))
        return NULL;
    kvt_stats st;
    uint64_t ok, failed;
    Py_BEGIN_ALLOW_THREADS
    mce_stats(self->m, &st, &ok, &failed);
    Py_END_ALLOW_THREADS
    leave(self);
    return Py_BuildValue(
        "{sKsKsKsKsKsKsKsKsIsIsKsKsKsI}", "calls_ok", (unsigned long long)ok, "calls_failed",
        (unsigned long long)failed, "writes_sent", (unsigned long long)st.writes_sent, "bytes_sent",
        (unsigned long long)st.bytes_sent, "writes_recv", (unsigned long long)st.writes_recv,
        "bytes_recv", (unsigned long long)st.bytes_recv, "frames_refused",
        (unsigned long long)st.frames_refused, "conns_failed", (unsigned long long)st.conns_failed,
        "peers", st.peers, "peers_unhealthy", st.peers_unhealthy, "same_host_copies",
        (unsigned long long)st.same_host_copies, "same_host_bytes",
        (unsigned long long)st.same_host_bytes, "same_host_fallbacks",
        (unsigned long long)st.same_host_fallbacks, "senders", st.senders);
}

static PyMethodDef Engine_methods[] = {
    {"close", (PyCFunction)Engine_close, METH_NOARGS, "Stop and free the engine (idempotent)."},
    {"session_id", (PyCFunction)Engine_session_id, METH_NOARGS, "\"host:port\" of this engine."},
    {"rpc_port", (PyCFunction)Engine_rpc_port, METH_NOARGS, "The port of the session id."},
    {"backend", (PyCFunction)Engine_backend, METH_NOARGS, "\"tcp\" or \"verbs\"."},
    {"register", (PyCFunction)Engine_register, METH_VARARGS, "register(addr, len) -> 0 / < 0"},
    {"unregister", (PyCFunction)Engine_unregister, METH_VARARGS, "unregister(addr) -> 0 / < 0"},
    {"transfer", (PyCFunction)Engine_transfer, METH_VARARGS,
     "transfer(sid, op, buffers, peer_addrs, lengths) -> 0 / -1"},
    {"transfer_one", (PyCFunction)Engine_transfer_one, METH_VARARGS,
     "transfer_one(sid, op, buffer, peer_addr, length) -> 0 / -1"},
    {"submit", (PyCFunction)Engine_submit, METH_VARARGS,
     "submit(sid, op, buffers, peer_addrs, lengths) -> batch id (0: failed)"},
    {"batch_wait", (PyCFunction)Engine_batch_wait, METH_VARARGS,
     "batch_wait(id, block) -> 1 done, -1 failed, -2 deadline passed, 0 pending, -3 unknown"},
    {"probe", (PyCFunction)Engine_probe, METH_VARARGS, "probe(sid) -> 0 / -1 (handshake)"},
    {"peer_add", (PyCFunction)Engine_peer_add, METH_VARARGS, "peer_add(json) -> 0 / -1"},
    {"descriptor", (PyCFunction)Engine_descriptor, METH_NOARGS, "This engine's descriptor."},
    {"engine_last_error", (PyCFunction)Engine_engine_last_error, METH_NOARGS,
     "(monotonic ns, reason) of the engine's latest failed call, (0, '') if none."},
    {"log_take", (PyCFunction)Engine_log_take, METH_NOARGS, "[(level, line)] of the engine."},
    {"stats", (PyCFunction)Engine_stats, METH_NOARGS, "Counters (dict)."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject EngineType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvcoord._engine.Engine",
    .tp_doc = "Engine(host, backend='auto', device=None, timeout_s=30.0, token=None, "
              "fetch_ms=5000, port=0, io_timeout_ms=0 (the engine's 10000)): kvcoord's transfer "
              "engine shared by many threads; see "
              "kvcoord.mooncake.",
    .tp_basicsize = sizeof(EngineObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Engine_init,
    .tp_dealloc = (destructor)Engine_dealloc,
    .tp_weaklistoffset = offsetof(EngineObject, weakrefs),
    .tp_methods = Engine_methods,
};

static PyObject *mod_last_error(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    return Py_BuildValue("(Ks)", (unsigned long long)mce_last_error_ns(), mce_last_error());
}

/* The IPv4 and IPv6 addresses of this host's interfaces (getifaddrs). */
static PyObject *mod_local_addresses(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    struct ifaddrs *ifa;
    if (getifaddrs(&ifa))
        return PyErr_SetFromErrno(PyExc_OSError);
    PyObject *out = PyList_New(0);
    for (struct ifaddrs *i = ifa; out && i; i = i->ifa_next) {
        if (!i->ifa_addr ||
            (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6))
            continue;
        char a[INET6_ADDRSTRLEN] = "";
        const void *src =
            i->ifa_addr->sa_family == AF_INET
                ? (const void *)&((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr
                : (const void *)&((const struct sockaddr_in6 *)(const void *)i->ifa_addr)
                      ->sin6_addr;
        if (!inet_ntop(i->ifa_addr->sa_family, src, a, sizeof a))
            continue;
        PyObject *t = Py_BuildValue("(ssO)", i->ifa_name, a,
                                    (i->ifa_flags & IFF_LOOPBACK) ? Py_True : Py_False);
        if (!t || PyList_Append(out, t)) {
            Py_XDECREF(t);
            Py_CLEAR(out);
            break;
        }
        Py_DECREF(t);
    }
    freeifaddrs(ifa);
    return out;
}

static PyMethodDef mod_methods[] = {
    {"last_error", mod_last_error, METH_NOARGS,
     "last_error() -> (monotonic ns, reason): the calling thread's last failure."},
    {"local_addresses", mod_local_addresses, METH_NOARGS,
     "local_addresses() -> [(interface, address, is_loopback)]: this host's IPv4 and IPv6 "
     "addresses (getifaddrs); OSError when it fails."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef engine_module = {
    PyModuleDef_HEAD_INIT, .m_name = "kvcoord._engine",
    .m_doc = "kvcoord's transfer engine for kvcoord.mooncake (see there).", .m_size = -1,
    .m_methods = mod_methods};

PyMODINIT_FUNC PyInit__engine(void);
PyMODINIT_FUNC PyInit__engine(void)
{
    static int key_made;
    if (!key_made) {
        if (pthread_key_create(&runs_key, run_buf_free))
            return PyErr_NoMemory();
        key_made = 1;
    }
    if (PyType_Ready(&EngineType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&engine_module);
    if (!m)
        return NULL;
    Py_INCREF(&EngineType);
    if (PyModule_AddObject(m, "Engine", (PyObject *)&EngineType) ||
        PyModule_AddIntConstant(m, "WRITE", MCE_WRITE) ||
        PyModule_AddIntConstant(m, "READ", MCE_READ) ||
        PyModule_AddIntConstant(m, "HAVE_READ", MCE_HAVE_READ) ||
        PyModule_AddIntConstant(m, "HAVE_FETCH", MCE_HAVE_FETCH) ||
        PyModule_AddIntConstant(m, "PROTOCOL_VERSION", KVT_PROTOCOL_VERSION)) {
        Py_DECREF(&EngineType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
