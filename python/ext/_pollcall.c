/*
 * _pollcall.c - kvcoord._kvcoord.PollCall: the poll_and_all_reduce that
 * kvcoord.sglang.install() puts in place, its plain path in C.
 *
 * sglang's prefill and decode steps call poll_and_all_reduce(pollers,
 * gloo_group) every step.  The Python wrapper (kvcoord/sglang/poll.py)
 * around the C call cost one Python frame with *args and **kwargs (never
 * inlined, a dict per call) and its bytecode, 1.5-2 us cold.  A PollCall
 * makes the same decisions in C for that call and hands every other one to
 * the wrapper unchanged:
 *  - exactly two positional arguments, else the wrapper;
 *  - the group's entry in the bridge's table (id(gloo_group) -> (group,
 *    decision)), else the wrapper (it shakes hands);
 *  - the decision a poll.Group (a group in this segment), else the wrapper
 *    (None: sglang's own; a group spanning nodes);
 *  - sglang's _get_failure_prob() called, every step; above 0 the step is
 *    `injected(pollers, gloo_group, group)` (sglang's polls with its
 *    injection);
 *  - else Segment.poll_allreduce's work (kvcpy_poll_run: the polls made
 *    here, the fold, the collective) with the group's numbers; a
 *    kvcoord.Error from it goes to `failed(group, gloo_group, pollers,
 *    err)` with err as the exception being handled (as the wrapper's
 *    `except Error as e: return failed(...)`), any other exception
 *    propagates.
 */
#include "_kvcoord.h" /* Python.h first */

#include <stddef.h>

typedef struct {
    PyObject_HEAD vectorcallfunc vectorcall;
    PyObject *dict;       /* attributes: update_wrapper's, __kvcoord_original__ */
    SegmentObject *seg;   /* the bridge's segment */
    PyObject *slow;       /* the Python wrapper: every call not taken here */
    PyObject *groups;     /* dict: id(process group) -> (group, decision) */
    PyObject *group_type; /* poll.Group: the decisions taken here */
    PyObject *prob;       /* sglang's _get_failure_prob */
    PyObject *injected;   /* (pollers, process group, Group) -> polls */
    PyObject *failed;     /* (Group, process group, pollers, err) -> polls */
    PyObject *follows;    /* the bridge's followed rooms (dict, set or RoomSet) */
    double timeout;
    PyObject *cached; /* the Group whose numbers follow (read-only once made) */
    uint64_t gid;
    uint32_t size, rank;
} PollCall;

#define KIND_PLAIN 1 /* kvcoord.sglang.poll.KIND_PLAIN */

/* The numbers of Group g (gid, size, rank), read once per Group.  0, or -1
 * with an exception. */
static int group_numbers(PollCall *pc, PyObject *g)
{
    if (g == pc->cached)
        return 0;
    static const char *names[] = {"gid", "size", "rank"};
    unsigned long long v[3];
    for (int i = 0; i < 3; i++) {
        PyObject *o = PyObject_GetAttrString(g, names[i]);
        if (!o)
            return -1;
        v[i] = PyLong_Check(o) ? PyLong_AsUnsignedLongLong(o) : (unsigned long long)-1;
        Py_DECREF(o);
        if (v[i] == (unsigned long long)-1 || (i && v[i] > UINT32_MAX)) {
            if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_OverflowError)) {
                PyErr_Clear();
                PyErr_Format(PyExc_ValueError, "PollCall: Group.%s is out of range", names[i]);
            }
            return -1;
        }
    }
    Py_XSETREF(pc->cached, Py_NewRef(g));
    pc->gid = v[0];
    pc->size = (uint32_t)v[1];
    pc->rank = (uint32_t)v[2];
    return 0;
}

/* After kvcpy_poll_run raised a kvcoord.Error: failed(g, pg, pollers, err)
 * while err is the exception being handled. */
static PyObject *call_failed(PollCall *pc, PyObject *g, PyObject *pg, PyObject *pollers)
{
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    if (tb && v)
        PyException_SetTraceback(v, tb);
    PyObject *res = NULL;
    if (v) {
#if PY_VERSION_HEX >= 0x030B0000
        PyObject *prev = PyErr_GetHandledException();
        PyErr_SetHandledException(v);
        res = PyObject_CallFunctionObjArgs(pc->failed, g, pg, pollers, v, NULL);
        PyErr_SetHandledException(prev);
        Py_XDECREF(prev);
#else
        PyObject *pt, *pv, *ptb;
        PyErr_GetExcInfo(&pt, &pv, &ptb);
        PyErr_SetExcInfo(Py_NewRef(t), Py_NewRef(v), Py_XNewRef(tb));
        res = PyObject_CallFunctionObjArgs(pc->failed, g, pg, pollers, v, NULL);
        PyErr_SetExcInfo(pt, pv, ptb);
#endif
    }
    Py_XDECREF(t);
    Py_XDECREF(v);
    Py_XDECREF(tb);
    return res;
}

static PyObject *pollcall_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                     PyObject *kwnames)
{
    PollCall *pc = (PollCall *)self;
    if (PyVectorcall_NARGS(nargsf) != 2 || (kwnames && PyTuple_GET_SIZE(kwnames)))
        return PyObject_Vectorcall(pc->slow, args, nargsf, kwnames);
    PyObject *pollers = args[0], *pg = args[1];
    PyObject *key = PyLong_FromVoidPtr(pg); /* id(pg) */
    if (!key)
        return NULL;
    PyObject *hit = PyDict_GetItemWithError(pc->groups, key); /* borrowed */
    Py_DECREF(key);
    if (!hit && PyErr_Occurred())
        return NULL;
    if (!hit || !PyTuple_Check(hit) || PyTuple_GET_SIZE(hit) != 2 ||
        Py_TYPE(PyTuple_GET_ITEM(hit, 1)) != (PyTypeObject *)pc->group_type)
        return PyObject_Vectorcall(pc->slow, args, nargsf, kwnames);
    PyObject *g = Py_NewRef(PyTuple_GET_ITEM(hit, 1)), *res = NULL;
    PyObject *p = PyObject_CallNoArgs(pc->prob);
    if (!p)
        goto out;
    PyObject *zero = PyLong_FromLong(0);
    int on = zero ? PyObject_RichCompareBool(p, zero, Py_GT) : -1;
    Py_XDECREF(zero);
    Py_DECREF(p);
    if (on < 0)
        goto out;
    if (on) {
        res = PyObject_CallFunctionObjArgs(pc->injected, pollers, pg, g, NULL);
        goto out;
    }
    if (group_numbers(pc, g) < 0)
        goto out;
    res = kvcpy_poll_run(pc->seg, pc->gid, pc->size, pc->rank, Py_None, pollers, pc->follows,
                         pc->timeout, KIND_PLAIN);
    if (!res && PyErr_ExceptionMatches(kvcpy_Error))
        res = call_failed(pc, g, pg, pollers);
out:
    Py_DECREF(g);
    return res;
}

static PyObject *pollcall_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"segment",  "slow",   "groups",  "group_type", "prob",
                             "injected", "failed", "follows", "timeout",    NULL};
    PyObject *seg, *slow, *groups, *gtype, *prob, *injected, *failed, *follows;
    double timeout;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!OO!O!OOOOd", kwlist, &kvcpy_SegmentType, &seg,
                                     &slow, &PyDict_Type, &groups, &PyType_Type, &gtype, &prob,
                                     &injected, &failed, &follows, &timeout))
        return NULL;
    if (!PyCallable_Check(slow) || !PyCallable_Check(prob) || !PyCallable_Check(injected) ||
        !PyCallable_Check(failed)) {
        PyErr_SetString(PyExc_TypeError, "PollCall: slow, prob, injected and failed must be "
                                         "callable");
        return NULL;
    }
    if (follows != Py_None && !PyDict_Check(follows) && !PyAnySet_Check(follows) &&
        !Py_IS_TYPE(follows, &kvcpy_RoomSetType)) {
        PyErr_Format(PyExc_TypeError,
                     "PollCall: follows must be a dict, a set, a RoomSet or None, not "
                     "%.100s",
                     Py_TYPE(follows)->tp_name);
        return NULL;
    }
    PollCall *pc = (PollCall *)type->tp_alloc(type, 0);
    if (!pc)
        return NULL;
    pc->vectorcall = pollcall_vectorcall;
    pc->seg = (SegmentObject *)Py_NewRef(seg);
    pc->slow = Py_NewRef(slow);
    pc->groups = Py_NewRef(groups);
    pc->group_type = Py_NewRef(gtype);
    pc->prob = Py_NewRef(prob);
    pc->injected = Py_NewRef(injected);
    pc->failed = Py_NewRef(failed);
    pc->follows = Py_NewRef(follows);
    pc->timeout = timeout;
    return (PyObject *)pc;
}

static int pollcall_traverse(PyObject *self, visitproc visit, void *arg)
{
    PollCall *pc = (PollCall *)self;
    Py_VISIT(pc->dict);
    Py_VISIT(pc->seg);
    Py_VISIT(pc->slow);
    Py_VISIT(pc->groups);
    Py_VISIT(pc->group_type);
    Py_VISIT(pc->prob);
    Py_VISIT(pc->injected);
    Py_VISIT(pc->failed);
    Py_VISIT(pc->follows);
    Py_VISIT(pc->cached);
    return 0;
}

static int pollcall_clear(PyObject *self)
{
    PollCall *pc = (PollCall *)self;
    Py_CLEAR(pc->dict);
    Py_CLEAR(pc->seg);
    Py_CLEAR(pc->slow);
    Py_CLEAR(pc->groups);
    Py_CLEAR(pc->group_type);
    Py_CLEAR(pc->prob);
    Py_CLEAR(pc->injected);
    Py_CLEAR(pc->failed);
    Py_CLEAR(pc->follows);
    Py_CLEAR(pc->cached);
    return 0;
}

static void pollcall_dealloc(PyObject *self)
{
    PyObject_GC_UnTrack(self);
    pollcall_clear(self);
    Py_TYPE(self)->tp_free(self);
}

/* As a function is: bound when read from an instance of a class. */
static PyObject *pollcall_get(PyObject *self, PyObject *obj, PyObject *type)
{
    (void)type;
    if (!obj || obj == Py_None)
        return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

static PyGetSetDef pollcall_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PollCallType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvcoord._kvcoord.PollCall",
    .tp_basicsize = sizeof(PollCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "PollCall(segment, slow, groups, group_type, prob, injected, failed, follows, "
              "timeout): kvcoord.sglang's installed poll_and_all_reduce, its plain path "
              "(two positional arguments, a group in this segment, sglang's failure "
              "injection off) in C; every other call goes to slow.  Internal to "
              "kvcoord.sglang.poll.make().  Thread-safe as Segment.poll_allreduce is.",
    .tp_new = pollcall_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(PollCall, vectorcall),
    .tp_dictoffset = offsetof(PollCall, dict),
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_descr_get = pollcall_get,
    .tp_getset = pollcall_getset,
    .tp_traverse = pollcall_traverse,
    .tp_clear = pollcall_clear,
    .tp_dealloc = pollcall_dealloc,
};

int kvcpy_pollcall_init(PyObject *m)
{
    if (PyType_Ready(&PollCallType) < 0)
        return -1;
    return PyModule_AddObjectRef(m, "PollCall", (PyObject *)&PollCallType);
}
