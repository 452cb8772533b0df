/*
 * _roomset.c - kvcoord._kvcoord.RoomSet: a set of room ids (ints
 * 0..2**63-1) in C, the followed rooms Segment.poll_allreduce and PollCall
 * look each poller's room up in.
 *
 * kvcoord.sglang's bridge keeps it beside its Python dict of followed
 * rooms (the same rooms, changed under the same lock).  A lookup of a
 * poller's room in the dict hashed a Python int and read the dict's index
 * and entry lines; here it is one probe of an array of 8-byte ids
 * (open addressing, linear probing, tombstones; grown at 1/2 full counting
 * them), looked up from C only: the poll's fold of 64 rooms does 64.
 */
#include "_kvcoord.h" /* Python.h first */

#include <stdint.h>
#include <string.h>

#define EMPTY UINT64_MAX      /* never a room: room ids are 0..2**63-1 */
#define TOMB (UINT64_MAX - 1) /* a removed id */
#define ROOM_MAX (UINT64_MAX >> 1)
#define MIN_CAP 64

typedef struct {
    PyObject_HEAD uint64_t *keys; /* cap slots: an id, EMPTY or TOMB */
    size_t cap;                   /* a power of two, or 0 before the first add */
    size_t used;                  /* ids held */
    size_t filled;                /* ids and tombstones */
} RoomSetObject;

static size_t home(uint64_t id, size_t cap)
{
    return (size_t)((id * 0x9E3779B97F4A7C15ull) >> 32) & (cap - 1);
}

/* The slot holding id, or SIZE_MAX. */
static size_t find(const RoomSetObject *rs, uint64_t id)
{
    if (!rs->cap)
        return SIZE_MAX;
    for (size_t i = home(id, rs->cap), k = 0; k < rs->cap; k++, i = (i + 1) & (rs->cap - 1)) {
        if (rs->keys[i] == id)
            return i;
        if (rs->keys[i] == EMPTY)
            return SIZE_MAX;
    }
    return SIZE_MAX;
}

int kvcpy_roomset_has(PyObject *set, uint64_t id)
{
    return id <= ROOM_MAX && find((const RoomSetObject *)set, id) != SIZE_MAX;
}

Py_ssize_t kvcpy_roomset_len(PyObject *set) { return (Py_ssize_t)((RoomSetObject *)set)->used; }

/* Rehash into cap slots (a power of two above 2 * used), dropping the
 * tombstones.  -1 with MemoryError. */
static int resize(RoomSetObject *rs, size_t cap)
{
    uint64_t *keys = PyMem_Malloc(cap * sizeof *keys);
    if (!keys) {
        PyErr_NoMemory();
        return -1;
    }
    memset(keys, 0xff, cap * sizeof *keys); /* EMPTY */
    for (size_t j = 0; j < rs->cap; j++) {
        uint64_t id = rs->keys[j];
        if (id == EMPTY || id == TOMB)
            continue;
        size_t i = home(id, cap);
        while (keys[i] != EMPTY)
            i = (i + 1) & (cap - 1);
        keys[i] = id;
    }
    PyMem_Free(rs->keys);
    rs->keys = keys;
    rs->cap = cap;
    rs->filled = rs->used;
    return 0;
}

/* o as a room id: 1 and *id, or 0 when o is not an int 0..2**63-1 (never
 * a room: no such id can be held); -1 with an exception only for
 * errors other than the value's range. */
static int room_of(PyObject *o, uint64_t *id)
{
    if (!PyLong_Check(o))
        return 0;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (overflow || v < 0)
        return 0;
    *id = (uint64_t)v;
    return 1;
}

static PyObject *rs_add(PyObject *self, PyObject *o)
{
    RoomSetObject *rs = (RoomSetObject *)self;
    uint64_t id;
    int ok = room_of(o, &id);
    if (ok <= 0)
        return ok < 0 ? NULL : Py_NewRef(Py_False);
    if (find(rs, id) != SIZE_MAX)
        Py_RETURN_FALSE;
    if (2 * (rs->filled + 1) > rs->cap) { /* half full, tombstones counted */
        size_t cap = MIN_CAP;
        while (4 * (rs->used + 1) > cap)
            cap *= 2; /* a quarter full after it, tombstones gone */
        if (resize(rs, cap) < 0)
            return NULL;
    }
    size_t i = home(id, rs->cap);
    while (rs->keys[i] != EMPTY && rs->keys[i] != TOMB)
        i = (i + 1) & (rs->cap - 1);
    rs->filled += rs->keys[i] == EMPTY;
    rs->keys[i] = id;
    rs->used++;
    Py_RETURN_TRUE;
}

static PyObject *rs_discard(PyObject *self, PyObject *o)
{
    RoomSetObject *rs = (RoomSetObject *)self;
    uint64_t id;
    int ok = room_of(o, &id);
    if (ok <= 0)
        return ok < 0 ? NULL : Py_NewRef(Py_False);
    size_t i = find(rs, id);
    if (i == SIZE_MAX)
        Py_RETURN_FALSE;
    rs->keys[i] = TOMB;
    rs->used--;
    Py_RETURN_TRUE;
}

static PyObject *rs_clear(PyObject *self, PyObject *unused)
{
    (void)unused;
    RoomSetObject *rs = (RoomSetObject *)self;
    PyMem_Free(rs->keys);
    rs->keys = NULL;
    rs->cap = rs->used = rs->filled = 0;
    Py_RETURN_NONE;
}

static int rs_contains(PyObject *self, PyObject *o)
{
    uint64_t id;
    int ok = room_of(o, &id);
    return ok <= 0 ? ok : kvcpy_roomset_has(self, id);
}

static Py_ssize_t rs_len(PyObject *self) { return kvcpy_roomset_len(self); }

static void rs_dealloc(PyObject *self)
{
    PyMem_Free(((RoomSetObject *)self)->keys);
    Py_TYPE(self)->tp_free(self);
}

static PyMethodDef rs_methods[] = {
    {"add", rs_add, METH_O,
     "add(room) -> bool\n\nHold room (an int 0..2**63-1): True if it was not held.  Anything "
     "else is never held (False): no room has such an id."},
    {"discard", rs_discard, METH_O,
     "discard(room) -> bool\n\nStop holding room: True if it was held."},
    {"clear", rs_clear, METH_NOARGS, "clear() -> None\n\nHold nothing."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods rs_as_sequence = {
    .sq_length = rs_len,
    .sq_contains = rs_contains,
};

PyTypeObject kvcpy_RoomSetType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvcoord._kvcoord.RoomSet",
    .tp_basicsize = sizeof(RoomSetObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "RoomSet(): a set of room ids (ints 0..2**63-1) kept in C: add(), discard(), "
              "clear(), `in`, len().  Segment.poll_allreduce's follows may be one (a lookup per "
              "poller from C, without Python's hashing).  Not thread-safe by itself: change it "
              "with the GIL held (every method does) and, when it mirrors other state, under "
              "that state's lock.",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = rs_dealloc,
    .tp_methods = rs_methods,
    .tp_as_sequence = &rs_as_sequence,
};

int kvcpy_roomset_init(PyObject *m)
{
    if (PyType_Ready(&kvcpy_RoomSetType) < 0)
        return -1;
    return PyModule_AddObjectRef(m, "RoomSet", (PyObject *)&kvcpy_RoomSetType);
}
