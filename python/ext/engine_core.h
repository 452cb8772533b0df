/*
 * engine_core.h - the core of kvcoord.mooncake's TransferEngine (module
 * kvcoord._engine), without Python: one kvt_engine (include/kvcoord/
 * transfer.h, which is single-threaded) shared by any number of caller
 * threads.
 *
 * Threading: a mutex serialises every call into the kvt_engine; one
 * progress thread drives it (poll on kvt_fd(), then kvt_progress(0)) and
 * hands each finished room's event to the call waiting for it.  A call
 * submits its batch as rooms of at most 16 MiB (fresh room ids), wakes the
 * progress thread (which submits the SQEs), and sleeps on its waiters'
 * condition variables until their events or its deadline.  Waiters come from a pool that only grows: after
 * warm-up a call allocates nothing in this file (the engine copies the
 * runs).
 *
 * Errors: functions returning int return 0 or a negative Mooncake-style
 * code (mce.h's MCE_ERR_*); the calling thread's reason is then in
 * mce_last_error() until its next failure.  Every function is safe from
 * any thread.  An engine must not be used across fork().
 */
#ifndef KVCOORD_EXT_ENGINE_CORE_H
#define KVCOORD_EXT_ENGINE_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "kvcoord/transfer.h"

/* Mooncake's error numbers (mooncake-transfer-engine/include/error.h). */
#define MCE_ERR_INVALID_ARGUMENT (-1)
#define MCE_ERR_ADDRESS_NOT_REGISTERED (-3)
#define MCE_ERR_ADDRESS_OVERLAPPED (-7)

enum { MCE_WRITE = 0, MCE_READ = 1 };

typedef struct mce mce;

typedef struct mce_opts {
    const char *host;       /* host of the session id ("host:rpc_port"); listened on */
    uint16_t port;          /* rpc port, 0: a free one */
    kvt_backend backend;    /* AUTO: verbs where a device exists, else TCP */
    const char *device;     /* verbs device, NULL or "": the first usable */
    uint64_t timeout_ns;    /* a call's deadline before its bytes' share */
    uint32_t fetch_ms;      /* deadline of one descriptor fetch */
    const char *token;      /* engine token, NULL: none */
    uint32_t io_timeout_ms; /* the engine's io_timeout_ms, 0: its default */
} mce_opts;

/* Create the engine and start its progress thread.  0, or -1 with the
 * reason in mce_last_error(). */
int mce_create(const mce_opts *o, mce **out);

/* Stop the progress thread, fail what is in flight, free everything.
 * Callers still inside a call must have returned. */
void mce_destroy(mce *m);

const char *mce_session_id(const mce *m); /* "host:port", owned by m */
int mce_rpc_port(const mce *m);
const char *mce_backend_name(const mce *m);

/* Register / deregister [addr, addr+len).  Deregistering waits until no
 * call in flight has a local run inside the region (a timed-out call is
 * in flight until the engine's own event for it).  0 or MCE_ERR_*. */
int mce_mr_register(mce *m, uint64_t addr, uint64_t len);
int mce_mr_unregister(mce *m, uint64_t addr);

/* One batch to peer sid (op MCE_WRITE: laddr -> raddr; MCE_READ: raddr ->
 * laddr), blocking until every byte has landed (0) or it failed or its
 * deadline (timeout_ns + 1 ns per byte, Mooncake's rule) passed (-1).
 * runs[] is the caller's; it may be changed by the call (sorted). */
int mce_transfer(mce *m, const char *sid, int op, kvt_run *runs, size_t n);

/* Asynchronous form: a batch id (> 0), or 0 on failure (reason in
 * mce_last_error()).  mce_batch_wait: 1 done, -1 failed (reason set), -2
 * deadline passed, 0 pending (only when block is 0).  An id is consumed
 * by the first answer other than 0 pending; a consumed or unknown id
 * gives -3 (reason set). */
uint64_t mce_submit(mce *m, const char *sid, int op, kvt_run *runs, size_t n);
int mce_batch_wait(mce *m, uint64_t id, int block);

/* Fetch sid's descriptor now (the P2P handshake): 0 when the peer answers. */
int mce_probe(mce *m, const char *sid);

/* Import a peer's descriptor JSON directly (tests, and engines whose
 * descriptor travels another way).  0 or -1. */
int mce_peer_add(mce *m, const char *json, size_t len);

/* This engine's descriptor (kvt_descriptor_export), malloc()ed.  0 or -1. */
int mce_descriptor(mce *m, char **json);

/* The calling thread's last failure (never NULL; "" before any). */
const char *mce_last_error(void);
/* CLOCK_MONOTONIC ns of the calling thread's last failure, 0 if none. */
uint64_t mce_last_error_ns(void);
/* The engine's most recent failure of a call, any thread: copies the reason
 * into buf, returns its CLOCK_MONOTONIC ns (0: none). */
uint64_t mce_engine_last_error(mce *m, char *buf, size_t cap);

/* Log lines of the engine (WARN and ERROR) not yet taken: one per call,
 * copied into buf; returns its level, or -1 when there is none. */
int mce_log_take(mce *m, char *buf, size_t cap);

/* Counters. */
void mce_stats(mce *m, kvt_stats *st, uint64_t *calls_ok, uint64_t *calls_failed);

#endif
