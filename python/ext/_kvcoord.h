/*
 * _kvcoord.h - shared declarations of the C extension module kvcoord._kvcoord
 * (a thin CPython layer over the public API in include/kvcoord/kvcoord.h).
 *
 * Files: _module.c (module, exceptions, argument conversion, fork rule),
 * _segment.c (the Segment type: open/close and the rank table), _rankinfo.c
 * (RankInfo objects), _rooms.c (rooms, failure records, processes),
 * _collective.c (the all-reduce and CollectiveError), _hier.c (HierGroup),
 * _coll_error.c (what those two share: the group id, raising
 * CollectiveError).
 *
 * Every call that can block (locks, futex waits, /proc reads) runs with the
 * GIL released, inside seg_enter()/seg_leave() (KVCPY_RUN), which keep
 * close() from unmapping the segment while another thread is inside the
 * library.  Once close() starts, no call enters: it waits only for the
 * calls already inside (each bounded: lock timeout, wait slice).
 */
#ifndef KVCOORD_PY_KVCOORD_H
#define KVCOORD_PY_KVCOORD_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>

#include <kvcoord/kvcoord.h>

/* A Segment: one kvc_segment handle.  `use` is held for reading by every
 * call in progress (several at once, from several threads) and for writing
 * by close(), so the handle is never freed under a running call. */
typedef struct {
    PyObject_HEAD kvc_segment *seg; /* NULL once closed */
    pthread_rwlock_t use;
    int closing;            /* set (GIL held) when close() starts: from then on no call enters */
    int lock_ready;         /* `use` was initialised */
    unsigned long fork_gen; /* kvcpy_fork_gen when opened (fork rule) */
    long owner_pid;         /* process that opened it */
    int32_t rank;           /* rank declared at open, -1 if none */
    kvc_role role;
    PyObject *weakrefs;
} SegmentObject;

extern PyTypeObject kvcpy_SegmentType;
extern PyTypeObject kvcpy_RankInfoType;
extern PyTypeObject kvcpy_RoomInfoType;    /* struct sequence */
extern PyTypeObject kvcpy_FailureInfoType; /* struct sequence */
extern PyTypeObject kvcpy_ProcInfoType;    /* struct sequence */

/* Exceptions (created in _module.c, exported by the module). */
extern PyObject *kvcpy_Error;                /* kvcoord.Error(Exception): .code, .code_name */
extern PyObject *kvcpy_NotFoundError;        /* (Error, KeyError) */
extern PyObject *kvcpy_WithdrawnError;       /* (NotFoundError) */
extern PyObject *kvcpy_InvalidError;         /* (Error, ValueError) */
extern PyObject *kvcpy_TimeoutError;         /* (Error, TimeoutError) */
extern PyObject *kvcpy_SegmentNotFoundError; /* (Error, FileNotFoundError) */
extern PyObject *kvcpy_ForkedError;          /* (Error): a Segment used across fork() */
extern PyObject *kvcpy_FullError;            /* (Error): KVC_E_FULL, a table is full */
extern PyObject *kvcpy_ClosedError;          /* (Error, ValueError): a closed Segment */
extern PyObject *kvcpy_CollectiveError;      /* (Error): a collective's peer died / was late */

/* Bumped in the child by a pthread_atfork handler. */
extern volatile unsigned long kvcpy_fork_gen;

/* The KVPoll members (KVPoll(0)..KVPoll(4)) once kvcoord registered its
 * enum, else NULL (states are then plain ints). */
extern PyObject *kvcpy_kvpoll[5];

/* Raise the Python exception for library error e with the calling thread's
 * kvc_last_error() message; returns NULL.  A code of KVC_E_NOENT raised by
 * kvc_open becomes SegmentNotFoundError (pass open_call = 1). */
PyObject *kvcpy_raise(kvc_err e, int open_call);
/* As kvcpy_raise() with message msg. */
PyObject *kvcpy_raise_msg(kvc_err e, int open_call, const char *msg);
/* As kvcpy_raise_msg() with exception class cls (a subclass of Error). */
PyObject *kvcpy_raise_as(PyObject *cls, kvc_err e, const char *msg);

/* A KVPoll member (or int) for state s (a new reference). */
PyObject *kvcpy_state(int s);

/* "O&" converters: a rank (int, 0..UINT32_MAX-1), a room id (int,
 * 0..2^63-1), a KVPoll state (int 0..4), a timeout in seconds (int/float
 * >= 0, or None for no limit: stored as -1.0).  They raise TypeError for a
 * wrong type and ValueError naming the range otherwise. */
int kvcpy_conv_rank(PyObject *o, void *out);         /* uint32_t * */
int kvcpy_conv_room(PyObject *o, void *out);         /* uint64_t * */
int kvcpy_conv_participants(PyObject *o, void *out); /* uint32_t * (0..32, 0: world size) */
/* The one range check: an int (not a bool) in lo..hi into *out, else raise
   naming what, with note appended to the message ("" for none; e.g. " or
   None"): TypeError "<what> must be an int<note>, not <type>", ValueError
   "<what> must be in <lo>..<hi><note>, not <value>".  Returns 1 or 0. */
int kvcpy_conv_range(PyObject *o, long long lo, long long hi, const char *what, const char *note,
                     long long *out);
/* kvcpy_conv_range(o, 0, max, ...) into an unsigned (max <= INT64_MAX). */
int kvcpy_conv_uint(PyObject *o, unsigned long long max, const char *what, const char *alt,
                    unsigned long long *out);
int kvcpy_conv_state(PyObject *o, void *out);   /* int * */
int kvcpy_conv_code(PyObject *o, void *out);    /* int * (int32 failure code) */
int kvcpy_conv_timeout(PyObject *o, void *out); /* double * (seconds; -1 none) */

/* Enter a call on s: checks the fork rule and that s is open, takes `use`
 * for reading.  Returns the handle, or NULL with an exception set. */
kvc_segment *kvcpy_seg_enter(SegmentObject *s);
/* Leave a call entered with kvcpy_seg_enter (GIL held). */
void kvcpy_seg_leave(SegmentObject *s);

/* KVCPY_RUN's result when the call was not made (closed, forked, lock
 * failure): the Python exception is set.  Outside the kvc_err codes. */
#define KVCPY_E_RAISED (-1)

/* The sequence of every library call on a Segment: enter s, run `call` (an
 * expression of type kvc_err that uses the handle `g`) with the GIL
 * released, re-take the GIL, leave.  Stores the call's kvc_err in the int
 * e, or KVCPY_E_RAISED when s could not be entered. */
#define KVCPY_RUN(s, e, call)                      \
    do {                                           \
        kvc_segment *const g = kvcpy_seg_enter(s); \
        if (!g) {                                  \
            (e) = KVCPY_E_RAISED;                  \
            break;                                 \
        }                                          \
        Py_BEGIN_ALLOW_THREADS(e)                  \
        = (int)(call);                             \
        Py_END_ALLOW_THREADS                       \
        kvcpy_seg_leave(s);                        \
    } while (0)

/* NULL, after raising for a KVCPY_RUN result e != 0: kvcpy_raise(e, 0), or
 * nothing for KVCPY_E_RAISED (already set). */
PyObject *kvcpy_fail(int e);

/* A listing call of the library: fills buf (cap items) and sets *count to
 * the number of items there are (more than cap when buf was too small). */
typedef kvc_err (*kvcpy_lister)(kvc_segment *g, void *buf, size_t cap, size_t *count,
                                const void *ctx);
/* The grow-and-retry listing: calls fn (via KVCPY_RUN) with a zeroed
 * buffer of cap items of size bytes, regrown until everything fits, then
 * returns the new list of make(item) for each (see kvcpy_list_of); NULL with
 * an exception set on any failure. */
PyObject *kvcpy_listing(SegmentObject *s, kvcpy_lister fn, const void *ctx, size_t size, size_t cap,
                        PyObject *(*make)(const void *item));

/* Longest slice of a blocking wait between checks for signals, ms (so
 * Ctrl-C interrupts a long wait). */
#define KVCPY_WAIT_SLICE_MS 200u

/* Milliseconds left until deadline (monotonic seconds), capped at the wait
 * slice; 0 when it passed.  deadline < 0: no limit (always the slice). */
uint32_t kvcpy_slice_ms(double deadline);
/* Monotonic clock, seconds. */
double kvcpy_now(void);

/* A RankInfo from a lookup (steals nothing; copies info when with_info). */
PyObject *kvcpy_rankinfo_new(const kvc_rank_info *ri, int with_info);
/* A new list of make(item) for each of the n items of size bytes at items
 * (make returns a new reference, or NULL with an exception set); NULL with
 * the exception set when PyList_New or any make fails. */
PyObject *kvcpy_list_of(const void *items, size_t n, size_t size,
                        PyObject *(*make)(const void *item));

/* Room methods, defined in _rooms.c and listed in the Segment type. */
/* _pd.c: add the PD bootstrap methods to kvcpy_SegmentType (after
 * PyType_Ready); 0, or -1 with an exception. */
int kvcpy_pd_init(void);

PyObject *kvcpy_room_open(SegmentObject *s, PyObject *args, PyObject *kw);
PyObject *kvcpy_room_set_state(SegmentObject *s, PyObject *args, PyObject *kw);
PyObject *kvcpy_room_fail(SegmentObject *s, PyObject *args, PyObject *kw);
PyObject *kvcpy_room_get(SegmentObject *s, PyObject *args, PyObject *kw);
PyObject *kvcpy_check_room(SegmentObject *s, PyObject *args, PyObject *kw);
/* _register_transfer_error(KVTransferError): the class check_room raises. */
PyObject *kvcpy_register_transfer_error(PyObject *m, PyObject *cls);
/* _transfer_error(FailureInfo): the KVTransferError for it (not raised). */
PyObject *kvcpy_transfer_error(PyObject *m, PyObject *failure);
PyObject *kvcpy_room_wait(SegmentObject *s, PyObject *args, PyObject *kw);
PyObject *kvcpy_room_release(SegmentObject *s, PyObject *args, PyObject *kw);
PyObject *kvcpy_room_sync(SegmentObject *s, PyObject *args, PyObject *kw);
PyObject *kvcpy_room_list(SegmentObject *s, PyObject *args, PyObject *kw);
PyObject *kvcpy_failures(SegmentObject *s, PyObject *args, PyObject *kw);
PyObject *kvcpy_procs(SegmentObject *s, PyObject *args);
PyObject *kvcpy_reap_dead(SegmentObject *s, PyObject *args);
PyObject *kvcpy_room_sweep(SegmentObject *s, PyObject *args);

/* Docstrings of the room methods (in _rooms.c). */
extern const char kvcpy_doc_room_open[], kvcpy_doc_room_set_state[], kvcpy_doc_room_fail[],
    kvcpy_doc_room_get[], kvcpy_doc_check_room[], kvcpy_doc_room_wait[], kvcpy_doc_room_release[],
    kvcpy_doc_room_sync[], kvcpy_doc_room_list[], kvcpy_doc_failures[], kvcpy_doc_procs[],
    kvcpy_doc_reap_dead[], kvcpy_doc_room_sweep[];

int kvcpy_rooms_init_types(void); /* struct sequence types; -1 on error */

/* Collectives (_collective.c): Segment.allreduce_min and its docstring;
 * kvcpy_collective_init creates CollectiveError and adds it to module m
 * (-1 with an exception set on error). */
PyObject *kvcpy_allreduce_min(SegmentObject *s, PyObject *args, PyObject *kw);
extern const char kvcpy_doc_allreduce_min[];
PyObject *kvcpy_allreduce_join(SegmentObject *s, PyObject *args, PyObject *kw);
extern const char kvcpy_doc_allreduce_join[];
PyObject *kvcpy_poll_allreduce(SegmentObject *s, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames);
extern const char kvcpy_doc_poll_allreduce[];
/* Segment.poll_allreduce's work once its arguments are converted (also the
 * installed poll's C path, _pollcall.c): polls_o None (poll pollers_o
 * here) or a sequence; follows a dict, a set, a RoomSet or None.  The result list, or
 * NULL with the exception poll_allreduce raises. */
PyObject *kvcpy_poll_run(SegmentObject *s, uint64_t group, uint32_t size, uint32_t rank,
                         PyObject *polls_o, PyObject *pollers_o, PyObject *follows, double timeout,
                         uint32_t kind);
/* _pollcall.c: kvcoord._kvcoord.PollCall, added to module m (-1 with an
 * exception set on error). */
int kvcpy_pollcall_init(PyObject *m);
/* _roomset.c: kvcoord._kvcoord.RoomSet, added to module m (-1 with an
 * exception set on error); whether set (a RoomSet) holds room id, and how
 * many it holds (GIL held). */
extern PyTypeObject kvcpy_RoomSetType;
int kvcpy_roomset_init(PyObject *m);
int kvcpy_roomset_has(PyObject *set, uint64_t id);
Py_ssize_t kvcpy_roomset_len(PyObject *set);
/* close() starting on g: wake its collective waiters (they give up). */
void kvcpy_coll_closing(kvc_segment *g);

/* _coll_error.c.  "O&" converter of a group id: an int (not a bool)
 * 0..2**64-1 into the uint64_t *out; 1, or 0 with TypeError / ValueError. */
int kvcpy_conv_group(PyObject *o, void *out);
/* An attribute to set: its name and its value (a new reference, or NULL
 * when making it failed with an exception set). */
typedef struct {
    const char *name;
    PyObject *value;
} kvcpy_attr;
/* Raise CollectiveError (message: kvc_last_error()) for a collective that
 * failed with e: .code and .code_name of e, .ranks the list of the ranks
 * whose bits are set in ranks (lowest first), then the n attributes of
 * extra.  Releases every extra[i].value, in all cases.  Returns NULL, with
 * CollectiveError set, or the error (MemoryError) met while making it. */
PyObject *kvcpy_raise_coll(kvc_err e, uint64_t ranks, const kvcpy_attr *extra, size_t n);
int kvcpy_collective_init(PyObject *m);

/* _hier.c: kvcoord.HierGroup (kvcoord/hier.h) and host_addresses(), added to
 * module m (-1 with an exception set on error). */
int kvcpy_hier_init(PyObject *m);

#endif
