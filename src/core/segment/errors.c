/*
 * errors.c - error codes, their fixed descriptions and the per-thread
 * message of the last failure.
 */
#include <stdio.h>

#include "internal.h"

static _Thread_local char last_error[512];

KVC_API const char *kvc_strerror(kvc_err err)
{
    switch (err) {
    case KVC_OK: return "success";
    case KVC_E_INVAL: return "invalid argument";
    case KVC_E_NOENT: return "not found";
    case KVC_E_WITHDRAWN: return "rank withdrawn";
    case KVC_E_CAPACITY: return "rank beyond the segment's capacity";
    case KVC_E_TOOBIG: return "too big";
    case KVC_E_FULL: return "table or arena full";
    case KVC_E_VERSION: return "segment layout version mismatch";
    case KVC_E_CORRUPT: return "segment invalid or truncated";
    case KVC_E_SYS: return "system call failed";
    case KVC_E_TIMEDOUT: return "timed out";
    case KVC_E_BUSY: return "lock held too long by a live process";
    case KVC_E_NOTRECOVERABLE: return "lock not recoverable";
    case KVC_E_EXISTS: return "a live segment is in the way";
    case KVC_E_PEER: return "a peer of the collective died or left";
    case KVC_E_STALE: return "segment discarded, unlinked or replaced";
    }
    return "unknown error";
}

KVC_API const char *kvc_last_error(void) { return last_error; }

KVC_API kvc_err kvc_error_setv(kvc_err err, const char *fmt, va_list ap)
{
    vsnprintf(last_error, sizeof last_error, fmt ? fmt : "(no message)", ap);
    return err;
}

KVC_API kvc_err kvc_error_set(kvc_err err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvc_error_setv(err, fmt, ap);
    va_end(ap);
    return err;
}

kvc_err kvc__fail(kvc_err err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvc_error_setv(err, fmt, ap);
    va_end(ap);
    return err;
}

kvc__inject_fn kvc__inject;

void kvc__test_set_inject(kvc__inject_fn fn) { kvc__inject = fn; }
