/*
 * _pd.c - Segment's PD bootstrap methods (kvcoord/pd.h): the prefill rank
 * table and the bootstrap room -> DP rank map that kvcoordd serves as
 * sglang's PD bootstrap server, read and written without HTTP.
 */
#include <kvcoord/pd.h>
#include <string.h>

#include "_kvcoord.h"
#include "pyint.h"

/* o as int(o) takes it (pyint.h, the rule sglang's bootstrap server and
 * kvcoordd's PD routes apply): an int (or an object with __index__, bool
 * included), a float truncated toward zero, or a str of int()'s text;
 * then within lo..hi.  1 ok, 0 with TypeError (another type) or
 * ValueError (int() refuses it, or out of lo..hi: the range is named). */
static int pd_int(PyObject *o, const char *what, long long lo, long long hi, long long *out)
{
    int64_t x = 0;
    int rc;
    if (PyFloat_Check(o)) {
        rc = kvc_pyint_real(PyFloat_AS_DOUBLE(o), &x);
    } else if (PyUnicode_Check(o)) {
        Py_ssize_t n;
        const char *u = PyUnicode_AsUTF8AndSize(o, &n);
        if (!u) {
            PyErr_Clear(); /* lone surrogates: int() refuses them too */
            rc = KVC_PYINT_INVALID;
        } else {
            rc = kvc_pyint_text(u, (size_t)n, &x);
        }
    } else {
        PyObject *i = PyNumber_Index(o);
        if (!i) {
            if (PyErr_ExceptionMatches(PyExc_TypeError)) {
                PyErr_Clear();
                PyErr_Format(PyExc_TypeError, "%s must be an int, a float or a str, not %.100s",
                             what, Py_TYPE(o)->tp_name);
            }
            return 0;
        }
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(i, &overflow);
        Py_DECREF(i);
        if (v == -1 && PyErr_Occurred())
            return 0;
        x = v;
        rc = overflow ? KVC_PYINT_RANGE : KVC_PYINT_OK;
    }
    if (rc == KVC_PYINT_INVALID) {
        PyErr_Format(PyExc_ValueError, "%s: %R is not an integer (int()'s rule)", what, o);
        return 0;
    }
    if (rc == KVC_PYINT_RANGE || x < lo || x > hi) {
        PyErr_Format(PyExc_ValueError, "%s must be in %lld..%lld, not %R", what, lo, hi, o);
        return 0;
    }
    *out = x;
    return 1;
}

/* ---- pd_register ------------------------------------------------------- */

/* A required key is missing: the library's bad-input error with the words
 * of kvcoordd's 400 for the same body ("Missing field 'KEY'"); returns 0. */
static int missing_field(const char *key)
{
    PyErr_Format(kvcpy_InvalidError, "Missing field '%s'", key);
    return 0;
}

/* registration[key] as an int in lo..hi into *out; 1 ok, 0 with an
 * exception (InvalidArgumentError naming a missing required key). */
static int dict_int(PyObject *d, const char *key, int required, int strict, long long lo,
                    long long hi, int32_t *out, int *given)
{
    PyObject *v = PyMapping_GetItemString(d, key);
    if (!v) {
        if (!PyErr_ExceptionMatches(PyExc_KeyError))
            return 0;
        PyErr_Clear();
        if (required)
            return missing_field(key);
        if (given)
            *given = 0;
        return 1;
    }
    if (v == Py_None && !required) {
        Py_DECREF(v);
        if (given)
            *given = 0;
        return 1;
    }
    long long x;
    /* sglang takes the sizes and ranks as sent (a JSON integer) and the
     * rest through int(): the same here and over HTTP. */
    int ok = strict ? kvcpy_conv_range(v, lo, hi, key, "", &x) : pd_int(v, key, lo, hi, &x);
    Py_DECREF(v);
    if (!ok)
        return 0;
    *out = (int32_t)x;
    if (given)
        *given = 1;
    return 1;
}

/* registration[key] as str or None (absent: None); the UTF-8 stays owned
 * by *keep (decref'd by the caller).  1 ok, 0 with an exception. */
static int dict_str(PyObject *d, const char *key, int required, const char **out, PyObject **keep)
{
    *out = NULL;
    *keep = PyMapping_GetItemString(d, key);
    if (!*keep) {
        if (!PyErr_ExceptionMatches(PyExc_KeyError))
            return 0;
        PyErr_Clear();
        return required ? missing_field(key) : 1;
    }
    if (*keep == Py_None && !required)
        return 1;
    if (!PyUnicode_Check(*keep)) {
        PyErr_Format(PyExc_TypeError, "%s must be a str%s, not %.100s", key,
                     required ? "" : " or None", Py_TYPE(*keep)->tp_name);
        return 0;
    }
    Py_ssize_t n;
    *out = PyUnicode_AsUTF8AndSize(*keep, &n);
    if (*out && strlen(*out) != (size_t)n) {
        PyErr_Format(kvcpy_InvalidError, "%s must not contain a NUL character", key);
        return 0;
    }
    return *out != NULL;
}

static const char *const dim_keys[] = {
    "attn_tp_size", "attn_tp_rank", "attn_cp_size", "attn_cp_rank",   "attn_dp_size",
    "attn_dp_rank", "pp_size",      "pp_rank",      "system_dp_size", "system_dp_rank"};

static PyObject *pd_register(SegmentObject *s, PyObject *d)
{
    if (!PyMapping_Check(d) || PyList_Check(d) || PyTuple_Check(d))
        return PyErr_Format(PyExc_TypeError,
                            "registration must be a mapping (the body sglang PUTs to /route), "
                            "not %.100s",
                            Py_TYPE(d)->tp_name);
    kvc_pd_registration r;
    memset(&r, 0, sizeof r);
    int32_t *dims[] = {&r.attn_tp_size,   &r.attn_tp_rank,  &r.attn_cp_size, &r.attn_cp_rank,
                       &r.attn_dp_size,   &r.attn_dp_rank,  &r.pp_size,      &r.pp_rank,
                       &r.system_dp_size, &r.system_dp_rank};
    PyObject *ip = NULL, *dtype = NULL, *lbm = NULL, *dsa = NULL;
    const char *lbm_s = NULL;
    PyObject *ret = NULL;
    for (size_t i = 0; i < sizeof dim_keys / sizeof *dim_keys; i++) /* size, rank, ... */
        if (!dict_int(d, dim_keys[i], 1, 1, i % 2 ? 0 : 1,
                      i % 2 ? KVC_PD_DIM_MAX - 1 : KVC_PD_DIM_MAX, dims[i], NULL))
            return NULL;
    if (!dict_int(d, "rank_port", 1, 0, 1, 65535, &r.rank_port, NULL) ||
        !dict_int(d, "page_size", 1, 0, 1, INT32_MAX, &r.page_size, NULL) ||
        !dict_int(d, "prefill_http_port", 0, 0, 1, 65535, &r.prefill_http_port,
                  &r.has_prefill_http_port) ||
        !dict_str(d, "rank_ip", 1, &r.rank_ip, &ip) ||
        !dict_str(d, "kv_cache_dtype", 0, &r.kv_cache_dtype, &dtype) ||
        !dict_str(d, "load_balance_method", 0, &lbm_s, &lbm))
        goto out;
    if (!PyMapping_HasKeyString(d, "kv_cache_dtype")) { /* sglang's data["kv_cache_dtype"] */
        missing_field("kv_cache_dtype");
        goto out;
    }
    /* sglang: data.get("load_balance_method", "follow_bootstrap_room"). */
    r.follow_bootstrap_room = !lbm || (lbm_s && !strcmp(lbm_s, "follow_bootstrap_room"));
    dsa = PyMapping_GetItemString(d, "enable_dsa_cache_layer_split");
    if (!dsa) {
        if (!PyErr_ExceptionMatches(PyExc_KeyError))
            goto out;
        PyErr_Clear();
    } else if ((r.enable_dsa_cache_layer_split = PyObject_IsTrue(dsa)) < 0) {
        goto out;
    }
    int e;
    KVCPY_RUN(s, e, kvc_pd_register(g, &r, KVC_PD_OWNER_SELF, 0, 0));
    if (e) {
        kvcpy_fail(e);
        goto out;
    }
    ret = Py_NewRef(Py_None);
out:
    Py_XDECREF(ip);
    Py_XDECREF(dtype);
    Py_XDECREF(lbm);
    Py_XDECREF(dsa);
    return ret;
}

/* ---- reads -------------------------------------------------------------- */

static PyObject *rank_dict(const void *item)
{
    const kvc_pd_rank *p = item;
    return Py_BuildValue("{s:i,s:i,s:i,s:i,s:s,s:i,s:O,s:i,s:K,s:K,s:K,s:s}", "dp_group",
                         p->dp_group, "cp_rank", p->cp_rank, "tp_rank", p->tp_rank, "pp_rank",
                         p->pp_rank, "rank_ip", p->rank_ip, "rank_port", p->rank_port, "withdrawn",
                         p->withdrawn ? Py_True : Py_False, "pid", p->pid, "pid_start",
                         (unsigned long long)p->pid_start, "generation",
                         (unsigned long long)p->generation, "registered_ns",
                         (unsigned long long)p->registered_ns, "note", p->note);
}

static int key_args(PyObject *args, PyObject *kw, int32_t k[4], const char **note)
{
    static char *kwnote[] = {"dp_group", "cp_rank", "tp_rank", "pp_rank", "note", NULL};
    static char *kwlist[] = {"dp_group", "cp_rank", "tp_rank", "pp_rank", NULL};
    if (note)
        return PyArg_ParseTupleAndKeywords(args, kw, "iiii|z", kwnote, &k[0], &k[1], &k[2], &k[3],
                                           note);
    return PyArg_ParseTupleAndKeywords(args, kw, "iiii", kwlist, &k[0], &k[1], &k[2], &k[3]);
}

static PyObject *pd_lookup(SegmentObject *s, PyObject *args, PyObject *kw)
{
    int32_t k[4];
    if (!key_args(args, kw, k, NULL))
        return NULL;
    kvc_pd_rank pr;
    int e;
    KVCPY_RUN(s, e, kvc_pd_lookup(g, k[0], k[1], k[2], k[3], &pr));
    if (e)
        return kvcpy_fail(e);
    return rank_dict(&pr);
}

static PyObject *pd_withdraw(SegmentObject *s, PyObject *args, PyObject *kw)
{
    int32_t k[4];
    const char *note = NULL;
    if (!key_args(args, kw, k, &note))
        return NULL;
    int e;
    KVCPY_RUN(s, e, kvc_pd_withdraw(g, k[0], k[1], k[2], k[3], note));
    if (e)
        return kvcpy_fail(e);
    Py_RETURN_NONE;
}

static PyObject *opt_int(int has, long v) { return has ? PyLong_FromLong(v) : Py_NewRef(Py_None); }

static PyObject *pd_status(SegmentObject *s, PyObject *noargs)
{
    (void)noargs;
    kvc_pd_status st;
    int e;
    KVCPY_RUN(s, e, kvc_pd_status_get(g, &st));
    if (e)
        return kvcpy_fail(e);
    int t = st.has_topology;
    return Py_BuildValue(
        "{s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:I,s:I,s:I,s:O,s:I}", "attn_tp_size",
        opt_int(t, st.attn_tp_size), "attn_cp_size", opt_int(t, st.attn_cp_size), "dp_size",
        opt_int(t, st.dp_size), "pp_size", opt_int(t, st.pp_size), "page_size",
        opt_int(t && st.has_page_size, st.page_size), "kv_cache_dtype",
        t && st.has_kv_cache_dtype ? PyUnicode_FromString(st.kv_cache_dtype) : Py_NewRef(Py_None),
        "follow_bootstrap_room", t ? PyBool_FromLong(st.follow_bootstrap_room) : Py_NewRef(Py_None),
        "enable_dsa_cache_layer_split",
        t ? PyBool_FromLong(st.enable_dsa_cache_layer_split) : Py_NewRef(Py_None),
        "prefill_http_port", opt_int(t && st.has_prefill_http_port, st.prefill_http_port),
        "expected", st.expected, "registered", st.registered, "withdrawn", st.withdrawn, "ready",
        st.ready ? Py_True : Py_False, "rooms", st.rooms);
}

static kvc_err list_pd(kvc_segment *g, void *buf, size_t cap, size_t *count, const void *ctx)
{
    (void)ctx;
    return kvc_pd_list(g, buf, cap, count);
}

static PyObject *pd_ranks(SegmentObject *s, PyObject *noargs)
{
    (void)noargs;
    return kvcpy_listing(s, list_pd, NULL, sizeof(kvc_pd_rank), 64, rank_dict);
}

/* ---- room -> DP rank ------------------------------------------------- */

static PyObject *pd_room_set(SegmentObject *s, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"room", "dp_rank", NULL};
    PyObject *ro, *dpo;
    long long room, dp;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO", kwlist, &ro, &dpo) ||
        !pd_int(ro, "room", INT64_MIN, INT64_MAX, &room) ||
        !pd_int(dpo, "dp_rank", 0, KVC_PD_DIM_MAX - 1, &dp))
        return NULL;
    int e;
    KVCPY_RUN(s, e, kvc_pd_room_set(g, (int64_t)room, (int32_t)dp));
    if (e)
        return kvcpy_fail(e);
    Py_RETURN_NONE;
}

static PyObject *pd_room_get(SegmentObject *s, PyObject *arg)
{
    long long room;
    int64_t probe;
    /* int()'s rule; a room beyond int64 was never stored: None */
    if (PyUnicode_Check(arg) || PyFloat_Check(arg) || PyLong_Check(arg)) {
        Py_ssize_t n;
        const char *u = PyUnicode_Check(arg) ? PyUnicode_AsUTF8AndSize(arg, &n) : NULL;
        int overflow = 0;
        if (u && kvc_pyint_text(u, (size_t)n, &probe) == KVC_PYINT_RANGE)
            Py_RETURN_NONE;
        if (PyFloat_Check(arg) && kvc_pyint_real(PyFloat_AS_DOUBLE(arg), &probe) == KVC_PYINT_RANGE)
            Py_RETURN_NONE;
        if (PyLong_Check(arg) && (PyLong_AsLongLongAndOverflow(arg, &overflow), overflow))
            Py_RETURN_NONE;
        PyErr_Clear();
    }
    if (!pd_int(arg, "room", INT64_MIN, INT64_MAX, &room))
        return NULL;
    int32_t dp = -1;
    int e;
    KVCPY_RUN(s, e, kvc_pd_room_get(g, (int64_t)room, &dp));
    if (e == KVC_E_NOENT)
        Py_RETURN_NONE;
    if (e)
        return kvcpy_fail(e);
    return PyLong_FromLong(dp);
}

static PyObject *pd_room_sweep(SegmentObject *s, PyObject *arg)
{
    double secs = PyFloat_AsDouble(arg);
    if (secs == -1.0 && PyErr_Occurred())
        return NULL;
    if (!(secs >= 0) || secs > 1e9)
        return PyErr_Format(PyExc_ValueError, "interval %g s out of range 0..1e9", secs);
    size_t n = 0;
    int e;
    KVCPY_RUN(s, e, kvc_pd_room_sweep(g, (uint64_t)(secs * 1000.0), &n));
    if (e)
        return kvcpy_fail(e);
    return PyLong_FromSize_t(n);
}

#define KW (PyCFunction)(void (*)(void))

static PyMethodDef kvcpy_pd_methods[] = {
    {"pd_register", (PyCFunction)pd_register, METH_O,
     "pd_register(registration) -> None\n\n"
     "Register a prefill rank in the PD bootstrap table, as sglang's PUT /route\n"
     "body does (a mapping with attn_tp_size, attn_tp_rank, attn_cp_size,\n"
     "attn_cp_rank, attn_dp_size, attn_dp_rank, pp_size, pp_rank, system_dp_size,\n"
     "system_dp_rank, rank_ip, rank_port, page_size, kv_cache_dtype, and optional\n"
     "prefill_http_port, load_balance_method, enable_dsa_cache_layer_split).\n"
     "The entry is this process's: it is withdrawn when the process ends.\n"
     "Registering the same (dp, cp, tp, pp) again replaces it.  Raises\n"
     "kvcoord.InvalidArgumentError (a ValueError: a required key missing, \"Missing\n"
     "field 'KEY'\" as kvcoordd's 400, or a value out of range), TypeError,\n"
     "kvcoord.FullError."},
    {"pd_lookup", KW pd_lookup, METH_VARARGS | METH_KEYWORDS,
     "pd_lookup(dp_group, cp_rank, tp_rank, pp_rank) -> dict\n\n"
     "The prefill rank's entry: rank_ip, rank_port, pid (its registering process,\n"
     "0 if none known), generation, registered_ns, withdrawn, note.  Raises\n"
     "kvcoord.NotFoundError (never registered) or kvcoord.WithdrawnError (its\n"
     "process ended or it was withdrawn; the message says why)."},
    {"pd_withdraw", KW pd_withdraw, METH_VARARGS | METH_KEYWORDS,
     "pd_withdraw(dp_group, cp_rank, tp_rank, pp_rank, note=None) -> None\n\n"
     "Withdraw a live prefill rank entry (kept, with note, to say why).  Raises\n"
     "kvcoord.NotFoundError when it is not live."},
    {"pd_status", (PyCFunction)pd_status, METH_NOARGS,
     "pd_status() -> dict\n\n"
     "The PD table's topology (attn_tp_size, attn_cp_size, dp_size, pp_size,\n"
     "page_size, kv_cache_dtype, follow_bootstrap_room,\n"
     "enable_dsa_cache_layer_split, prefill_http_port: None until a rank\n"
     "registered) and its state: expected, registered (distinct live ranks),\n"
     "withdrawn, ready (registered >= expected), rooms (room map entries)."},
    {"pd_ranks", (PyCFunction)pd_ranks, METH_NOARGS,
     "pd_ranks() -> list of dict\n\n"
     "Every prefill rank entry, live and withdrawn, as pd_lookup() gives it, ordered\n"
     "by (dp_group, cp_rank, tp_rank, pp_rank)."},
    {"pd_room_set", KW pd_room_set, METH_VARARGS | METH_KEYWORDS,
     "pd_room_set(room, dp_rank) -> None\n\n"
     "Remember that bootstrap room `room` is served by DP rank dp_rank (sglang's\n"
     "POST /register_dp_rank).  Raises kvcoord.InvalidArgumentError,\n"
     "kvcoord.FullError."},
    {"pd_room_get", (PyCFunction)pd_room_get, METH_O,
     "pd_room_get(room) -> int or None\n\n"
     "The DP rank of bootstrap room `room`, None if none is remembered."},
    {"pd_room_sweep", (PyCFunction)pd_room_sweep, METH_O,
     "pd_room_sweep(interval) -> int\n\n"
     "Remove the room entries older than interval seconds (kvcoordd does it\n"
     "every --pd-room-interval); returns how many went."},
    {NULL, NULL, 0, NULL}};

int kvcpy_pd_init(void)
{
    PyObject *dict = kvcpy_SegmentType.tp_dict;
    for (PyMethodDef *m = kvcpy_pd_methods; m->ml_name; m++) {
        PyObject *d = PyDescr_NewMethod(&kvcpy_SegmentType, m);
        if (!d || PyDict_SetItemString(dict, m->ml_name, d) < 0) {
            Py_XDECREF(d);
            return -1;
        }
        Py_DECREF(d);
    }
    PyType_Modified(&kvcpy_SegmentType);
    return 0;
}
