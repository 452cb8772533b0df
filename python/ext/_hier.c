/*
 * _hier.c - kvcoord.HierGroup (include/kvcoord/hier.h: the MIN all-reduce
 * of a group spanning nodes) and kvcoord._kvcoord.host_addresses() (what
 * kvcoord._hier's handshake advertises).
 */
#include "_kvcoord.h" /* Python.h first */

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <math.h>
#include <net/if.h>
#include <netinet/in.h>
#include <string.h>

#include <kvcoord/hier.h>

typedef struct {
    PyObject_HEAD kvc_hier *h;
    SegmentObject *seg;
    uint64_t group;
    uint32_t size, rank, nodes;
    int busy; /* a call in progress (GIL held to change): close() refuses */
} HierObject;

/* Raise CollectiveError for e from *why. */
static PyObject *raise_hier(kvc_err e, const kvc_hier_failure *why)
{
    const kvcpy_attr attrs[] = {
        {"dead", PyBool_FromLong(why->dead)},
        {"mismatch", PyBool_FromLong(why->mismatch)},
        {"node", PyLong_FromLong(why->node)},
        {"group", PyLong_FromUnsignedLongLong(why->group)},
        {"generation", PyLong_FromUnsignedLongLong(why->step)},
        {"step", PyLong_FromUnsignedLongLong(why->step)},
        {"pid", PyLong_FromLong(why->pid)},
    };
    return kvcpy_raise_coll(e, why->ranks, attrs, sizeof attrs / sizeof *attrs);
}

/* A sequence of n ints 0..max into out; 0, or -1 with an exception. */
static int int_seq(PyObject *o, const char *what, long long lo, long long hi, int *out_i,
                   uint32_t *out_u, Py_ssize_t n)
{
    PyObject *seq = PySequence_Fast(o, "node_of and fds must be sequences of ints");
    if (!seq)
        return -1;
    if (PySequence_Fast_GET_SIZE(seq) != n) {
        PyErr_Format(PyExc_ValueError, "%s must have %zd items, not %zd", what, n,
                     PySequence_Fast_GET_SIZE(seq));
        Py_DECREF(seq);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long long v;
        if (!kvcpy_conv_range(PySequence_Fast_GET_ITEM(seq, i), lo, hi, what, "", &v)) {
            Py_DECREF(seq);
            return -1;
        }
        if (out_i)
            out_i[i] = (int)v;
        else
            out_u[i] = (uint32_t)v;
    }
    Py_DECREF(seq);
    return 0;
}

static int hier_init(HierObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"segment", "group",      "size", "rank",
                             "node_of", "node_names", "fds",  NULL};
    PyObject *seg_o, *group_o, *size_o, *rank_o, *node_of_o, *names_o = Py_None, *fds_o = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!OOOO|OO", kwlist, &kvcpy_SegmentType, &seg_o,
                                     &group_o, &size_o, &rank_o, &node_of_o, &names_o, &fds_o))
        return -1;
    if (self->h) {
        PyErr_SetString(PyExc_RuntimeError, "HierGroup is already initialised");
        return -1;
    }
    uint64_t group;
    unsigned long long size, rank;
    if (!kvcpy_conv_group(group_o, &group) ||
        !kvcpy_conv_uint(size_o, KVC_COLL_MAX_SIZE, "size", "", &size) ||
        !kvcpy_conv_uint(rank_o, UINT32_MAX, "rank", "", &rank))
        return -1;
    uint32_t node_of[KVC_COLL_MAX_SIZE];
    if (int_seq(node_of_o, "node_of", 0, KVC_HIER_MAX_NODES - 1, NULL, node_of, (Py_ssize_t)size))
        return -1;
    uint32_t nodes = 0;
    for (unsigned long long r = 0; r < size; r++)
        nodes = node_of[r] + 1 > nodes ? node_of[r] + 1 : nodes;
    const char *names[KVC_HIER_MAX_NODES] = {0};
    PyObject *names_seq = NULL;
    if (names_o != Py_None) {
        names_seq = PySequence_Fast(names_o, "node_names must be a sequence of str");
        if (!names_seq)
            return -1;
        if (PySequence_Fast_GET_SIZE(names_seq) != (Py_ssize_t)nodes) {
            PyErr_Format(PyExc_ValueError, "node_names must have %u items (one per node)", nodes);
            Py_DECREF(names_seq);
            return -1;
        }
        for (uint32_t j = 0; j < nodes; j++) {
            names[j] = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(names_seq, j));
            if (!names[j]) {
                Py_DECREF(names_seq);
                return -1;
            }
        }
    }
    int fds[KVC_HIER_MAX_NODES];
    int have_fds = fds_o != Py_None;
    if (have_fds && int_seq(fds_o, "fds", -1, INT32_MAX, fds, NULL, (Py_ssize_t)nodes)) {
        Py_XDECREF(names_seq);
        return -1;
    }
    kvc_segment *g = kvcpy_seg_enter((SegmentObject *)seg_o);
    if (!g) {
        Py_XDECREF(names_seq);
        return -1;
    }
    kvc_hier_options o = {.seg = g,
                          .group = group,
                          .size = (uint32_t)size,
                          .rank = (uint32_t)rank,
                          .nodes = nodes,
                          .node_of = node_of,
                          .node_names = names_o != Py_None ? names : NULL,
                          .fds = have_fds ? fds : NULL};
    kvc_err e = kvc_hier_open(&o, &self->h);
    kvcpy_seg_leave((SegmentObject *)seg_o);
    Py_XDECREF(names_seq);
    if (e) {
        kvcpy_raise(e, 0);
        return -1;
    }
    Py_INCREF(seg_o);
    self->seg = (SegmentObject *)seg_o;
    self->group = group;
    self->size = (uint32_t)size;
    self->rank = (uint32_t)rank;
    self->nodes = nodes;
    return 0;
}

static void hier_dealloc(HierObject *self)
{
    kvc_hier_close(self->h);
    Py_XDECREF(self->seg);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *hier_allreduce_min(HierObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"data", "tag", "timeout", NULL};
    PyObject *data, *tag_o = NULL, *timeout_o = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OO", kwlist, &data, &tag_o, &timeout_o))
        return NULL;
    unsigned long long tag = 0;
    double timeout = 30.0;
    if ((tag_o && !kvcpy_conv_uint(tag_o, UINT32_MAX - 1, "tag", "", &tag)) ||
        (timeout_o && !kvcpy_conv_timeout(timeout_o, &timeout)))
        return NULL;
    if (!self->h) {
        PyErr_SetString(kvcpy_ClosedError, "HierGroup is closed");
        return NULL;
    }
    uint32_t timeout_ms = UINT32_MAX / 4;
    if (timeout >= 0 && timeout * 1000.0 < (double)(UINT32_MAX / 4))
        timeout_ms = (uint32_t)ceil(timeout * 1000.0);
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    /* A new bytes object written in place: made from NULL, never one of
     * CPython's shared one-byte objects. */
    PyObject *res = PyBytes_FromStringAndSize(NULL, view.len);
    if (res && view.len)
        memcpy(PyBytes_AS_STRING(res), view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    if (!res)
        return NULL;
    kvc_hier_failure why;
    int e;
    kvc_hier *h = self->h;
    uint8_t *buf = (uint8_t *)PyBytes_AS_STRING(res);
    size_t len = (size_t)PyBytes_GET_SIZE(res);
    self->busy++;
    KVCPY_RUN(self->seg, e,
              ((void)g, kvc_hier_allreduce_min(h, (uint32_t)tag, buf, len, timeout_ms, &why)));
    self->busy--;
    if (!e)
        return res;
    Py_DECREF(res);
    if (e == KVC_E_PEER || e == KVC_E_TIMEDOUT || (e == KVC_E_INVAL && why.mismatch))
        return raise_hier((kvc_err)e, &why);
    return kvcpy_fail(e);
}

static PyObject *hier_close(HierObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "HierGroup.close() while a call is in progress");
        return NULL;
    }
    kvc_hier_close(self->h);
    self->h = NULL;
    Py_RETURN_NONE;
}

static PyObject *hier_get_node(HierObject *self, void *Py_UNUSED(c))
{
    return PyLong_FromUnsignedLong(kvc_hier_node(self->h));
}

static PyObject *hier_get_leader(HierObject *self, void *Py_UNUSED(c))
{
    return PyBool_FromLong(kvc_hier_is_leader(self->h));
}

static PyObject *hier_get_group(HierObject *self, void *Py_UNUSED(c))
{
    return PyLong_FromUnsignedLongLong(self->group);
}

static PyObject *hier_get_size(HierObject *self, void *Py_UNUSED(c))
{
    return PyLong_FromUnsignedLong(self->size);
}

static PyObject *hier_get_rank(HierObject *self, void *Py_UNUSED(c))
{
    return PyLong_FromUnsignedLong(self->rank);
}

static PyObject *hier_get_nodes(HierObject *self, void *Py_UNUSED(c))
{
    return PyLong_FromUnsignedLong(self->nodes);
}

static PyGetSetDef hier_getset[] = {
    {"node", (getter)hier_get_node, NULL, "this rank's node index", NULL},
    {"leader", (getter)hier_get_leader, NULL, "whether this rank is its node's leader", NULL},
    {"group", (getter)hier_get_group, NULL, "the group id", NULL},
    {"size", (getter)hier_get_size, NULL, "ranks in the group", NULL},
    {"rank", (getter)hier_get_rank, NULL, "this rank", NULL},
    {"nodes", (getter)hier_get_nodes, NULL, "nodes the group spans", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef hier_methods[] = {
    {"allreduce_min", (PyCFunction)(void (*)(void))hier_allreduce_min, METH_VARARGS | METH_KEYWORDS,
     "allreduce_min(data, tag=0, timeout=30.0) -> bytes\n\n"
     "The element-wise MIN of data (a buffer of bytes) over every rank of the group, on every "
     "node: the k-th call of every rank reduces together or fails on every rank.  tag: the "
     "kind of call (0..2**32-2); every rank of a step must pass the same tag and length.\n"
     "Raises CollectiveError (.ranks: global ranks; .node: the node of the lowest; .dead; "
     ".mismatch; .step) when a rank or a node's leader died or left (.dead: the group is "
     "broken, every later call raises the same at once), did not arrive or answer within the "
     "timeout (the next call works again), or called with another tag or length than rank 0 "
     "(.mismatch, code KVC_E_INVAL: every rank raises it as soon as all arrived).  The "
     "timeout: seconds to wait for this node's ranks; a leader waits 1.25x it + 50 ms for the "
     "other nodes, the others up to 2.25x + 150 ms for their leader.  Releases the GIL.  One "
     "thread at a time (InvalidArgumentError otherwise)."},
    {"close", (PyCFunction)hier_close, METH_NOARGS,
     "close(): close the connections (the other nodes' leaders see them close: their group "
     "is broken).  Idempotent."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject HierType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvcoord.HierGroup",
    .tp_basicsize = sizeof(HierObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "HierGroup(segment, group, size, rank, node_of, node_names=None, fds=None)\n\n"
              "This rank's end of a MIN all-reduce group spanning nodes (kvcoord/hier.h): "
              "within each node the segment's collective, between nodes one TCP connection "
              "per pair of leaders (a node's leader is its lowest rank).  node_of: the node "
              "index of every rank (the same list on every rank); fds: on a node's leader "
              "only, the connected sockets to every other node's leader (-1 at its own "
              "index), taken over on success (detach() them first).  kvcoord._hier.handshake() "
              "makes them through a torch.distributed group.  The segment must stay open.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)hier_init,
    .tp_dealloc = (destructor)hier_dealloc,
    .tp_methods = hier_methods,
    .tp_getset = hier_getset,
};

static PyObject *host_addresses(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(ignored))
{
    struct ifaddrs *ifa;
    if (getifaddrs(&ifa) < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    PyObject *out = PyList_New(0);
    for (struct ifaddrs *i = ifa; out && i; i = i->ifa_next) {
        if (!i->ifa_addr || !(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK))
            continue;
        char buf[INET6_ADDRSTRLEN];
        if (i->ifa_addr->sa_family == AF_INET)
            inet_ntop(AF_INET, &((struct sockaddr_in *)(void *)i->ifa_addr)->sin_addr, buf,
                      sizeof buf);
        else if (i->ifa_addr->sa_family == AF_INET6) {
            struct in6_addr *a = &((struct sockaddr_in6 *)(void *)i->ifa_addr)->sin6_addr;
            if (IN6_IS_ADDR_LINKLOCAL(a))
                continue;
            inet_ntop(AF_INET6, a, buf, sizeof buf);
        } else
            continue;
        PyObject *s = PyUnicode_FromString(buf);
        if (!s || PyList_Append(out, s) < 0)
            Py_CLEAR(out);
        Py_XDECREF(s);
    }
    freeifaddrs(ifa);
    return out;
}

static PyMethodDef hier_module_methods[] = {
    {"host_addresses", host_addresses, METH_NOARGS,
     "host_addresses() -> list of str: this network namespace's addresses (up interfaces, "
     "not loopback, no IPv6 link-local), IPv4 first as the kernel lists them."},
    {NULL, NULL, 0, NULL},
};

int kvcpy_hier_init(PyObject *m)
{
    if (PyType_Ready(&HierType) < 0 ||
        PyModule_AddObjectRef(m, "HierGroup", (PyObject *)&HierType) < 0)
        return -1;
    return PyModule_AddFunctions(m, hier_module_methods);
}
