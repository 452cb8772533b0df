/*
 * transfer.h - the transfer engine: moves KV pages (or weights) from this
 * process's memory into a peer's registered memory, and reports how each
 * bootstrap room's transfer ended, both here and in the node's segment.
 *
 * Backends: TCP on io_uring (everywhere) and libibverbs RDMA WRITE (where a
 * usable RDMA device exists).  The wire protocol of the TCP backend, which is
 * also the verbs backend's control channel, is described in docs/transfer.md;
 * its version is KVT_PROTOCOL_VERSION.
 *
 * Conventions for every function in this header:
 *  - Errors are kvc_err codes (kvcoord.h); on failure kvc_last_error() holds
 *    a message naming the cause in the calling thread until its next failing
 *    call.  The library never prints: log lines go to the caller's
 *    kvt_log_fn, if one is given, from the thread calling into the engine.
 *  - Threads: ONE THREAD AT A TIME PER ENGINE.  No function taking a
 *    kvt_engine (or a kvt_peer of it) may run concurrently with another on
 *    the same engine: callers with many threads serialise them (a mutex
 *    around every call, kvt_progress() included); the Python layer
 *    (kvcoord.mooncake) is such a front end.  Different engines are
 *    independent, also inside one process.  Functions that take no engine
 *    (kvt_descriptor_fetch, kvt_backend_name/parse, kvt_options_init) are
 *    safe from any thread.  An engine must not be used across fork();
 *    create it in the process that uses it.
 *  - Pointer arguments must not be NULL unless noted: a NULL one is refused
 *    with KVC_E_INVAL and kvc_last_error() names the function and the
 *    argument; enum fields outside their values are refused the same way.
 *    The accessors that return no kvc_err say what they return for NULL.
 *    Room ids are 0..KVC_ROOM_ID_MAX (2^63 - 1), as everywhere in kvcoord.
 *  - Sizes are bytes, timeouts milliseconds, times CLOCK_MONOTONIC
 *    nanoseconds unless noted.  Addresses are this process's virtual
 *    addresses (uint64_t), remote addresses the peer's.
 */
#ifndef KVCOORD_TRANSFER_H
#define KVCOORD_TRANSFER_H

#include <stddef.h>
#include <stdint.h>

#include "kvcoord/kvcoord.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Version of the wire protocol (handshake, frames, descriptor).  Engines of
 * different protocol versions refuse each other in the handshake with
 * KVC_E_VERSION and the message "incompatible protocol versions X vs Y". */
#define KVT_PROTOCOL_VERSION 1u

/* Largest payload of one write frame on the wire, bytes (64 MiB).  A
 * receiver refuses (and closes the connection of) any longer frame. */
#define KVT_FRAME_MAX (64u << 20)

/* Backend of an engine. */
typedef enum kvt_backend {
    KVT_BACKEND_AUTO = 0, /* verbs when a usable RDMA device exists, else TCP */
    KVT_BACKEND_TCP = 1,  /* TCP on io_uring */
    KVT_BACKEND_VERBS = 2 /* libibverbs RDMA WRITE, TCP control channel */
} kvt_backend;

/* "auto", "tcp", "verbs" (static storage; "unknown" otherwise). */
const char *kvt_backend_name(kvt_backend b);

/* Parse "auto", "tcp" or "verbs" into *out.  Errors: KVC_E_INVAL. */
kvc_err kvt_backend_parse(const char *s, kvt_backend *out);

/* Log levels passed to kvt_log_fn. */
enum { KVT_LOG_ERROR = 0, KVT_LOG_WARN = 1, KVT_LOG_INFO = 2, KVT_LOG_DEBUG = 3 };

/* Log callback: msg is a NUL-terminated line without a newline, valid only
 * during the call.  Called from the thread that called into the engine. */
typedef void (*kvt_log_fn)(void *ctx, int level, const char *msg);

/* Options for kvt_engine_create().  Initialise with kvt_options_init(). */
typedef struct kvt_options {
    kvt_backend backend;         /* default KVT_BACKEND_AUTO */
    const char *listen;          /* "host:port" to accept peers on; port 0 picks a
                                   free one; IPv6 literals in brackets
                                   ("[::1]:0"), a bare one is refused; an
                                   empty host (":0") is every address.
                                   Default "127.0.0.1:0".
                                   Borrowed for the call only. */
    const char *advertise_host;  /* host put in the session_id when listen's host
                                   is a wildcard (0.0.0.0, ::); NULL: the listen
                                   host, or the first non-loopback address of
                                   this host for a wildcard.  Borrowed. */
    const char *verbs_device;    /* verbs: device name to use (NULL: first usable) */
    int verbs_gid_index;         /* verbs: GID index override, -1 = choose
                                   (rules in xfer_gid.c / docs/transfer.md) */
    int verbs_port;              /* verbs: port number, default 1 */
    kvc_segment *seg;            /* segment rooms are recorded in; NULL for
                                   standalone use (events only).  Borrowed: must
                                   outlive the engine. */
    uint32_t rank;               /* this process's rank in seg's rooms */
    uint32_t conns_per_peer;     /* TCP connections opened to each peer, 1..16,
                                   default 2 */
    uint32_t slice_bytes;        /* runs longer than this are sliced into writes
                                   of at most this many bytes; 4 KiB..
                                   KVT_FRAME_MAX, default 1 MiB */
    uint32_t window_bytes;       /* unacknowledged bytes allowed per connection,
                                   default 32 MiB */
    uint32_t tcp_splice_min;     /* tcp backend: a data write's payload of at least
                                   this many bytes is sent without the kernel
                                   copying it: vmsplice(2) of the source pages
                                   into a pipe of the connection, splice(2) of
                                   the pipe to the socket.  The socket keeps
                                   references to the pages, not a copy, until
                                   the peer has received the bytes; the
                                   caller's rule (no source byte changed
                                   before the room's event) is what makes it
                                   safe.  Headers and smaller payloads go by
                                   sendmsg.  0: sendmsg only.  A connection
                                   that cannot get a pipe, or whose vmsplice
                                   fails, uses sendmsg (no error).  Both calls
                                   are made in the calling thread, nonblocking
                                   (the socket is made O_NONBLOCK; SIGPIPE is
                                   held off around them, never raised).
                                   Default 0 (off): on the machine measured it
                                   was ahead of sendmsg with one reused block
                                   but 0.82x of it with 16 distinct 4 MiB
                                   blocks over 2 connections; measure before
                                   turning it on (kvcoord-bench transfer
                                   --compare prints both).  docs/transfer.md,
                                   "Splice". */
    uint32_t connect_timeout_ms; /* deadline of connect + handshake, default 5000 */
    uint32_t io_timeout_ms;      /* deadline of any outstanding send, receive or
                                   acknowledgement without progress, default 10000 */
    uint32_t unhealthy_ttl_ms;   /* how long a failed peer is refused, default 30000 */
    const char *token;           /* optional shared secret, 1..255 bytes (""
                                   is refused), sent in the handshake and
                                   required from peers that write here when
                                   set: a missing or wrong one is refused with
                                   EACCES ("unauthorized", on both sides; no
                                   byte written).  A receiver without a token
                                   accepts any sender.  Compared in constant
                                   time, length included.  Sent in clear.
                                   NULL: none.  Copied.  docs/transfer.md,
                                   "Handshake token". */
    int force_socket;            /* 1: the data of writes and reads always goes
                                   through the socket.  0 (default): to a peer
                                   on this host (same boot_id and pid
                                   namespace, its process proven in the
                                   handshake) the bytes are copied by
                                   process_vm_readv(2) instead, by the process
                                   whose memory is written, after it checked
                                   the ranges against its registered regions;
                                   requests, acknowledgements and refusals
                                   still go on the connection.  Where the
                                   kernel refuses it (EPERM: Yama
                                   ptrace_scope, seccomp, another uid, a
                                   non-dumpable process) the connection falls
                                   back to the socket (logged once per peer).
                                   The environment variable
                                   KVCOORD_FORCE_SOCKET, set to anything but
                                   "", "0", "false", "no" or "off", forces it
                                   too.  Either side forcing it is enough.
                                   docs/transfer.md, "Same-host copy". */
    kvt_log_fn log;              /* NULL: no logging */
    void *log_ctx;               /* passed to log */
} kvt_options;

/* Fill *o with the defaults documented above.  Never fails; NULL is
 * ignored. */
void kvt_options_init(kvt_options *o);

/* Opaque engine. */
typedef struct kvt_engine kvt_engine;

/* Create an engine: choose the backend (auto logs one line saying which and
 * why), bind and listen on opts->listen.  *out owns the engine until
 * kvt_engine_destroy().
 * A fixed port refused with EADDRINUSE is retried every 20 ms for up to
 * 3 s before the call fails: a predecessor killed at that port holds its
 * listening socket until its io_uring is torn down, shortly after the
 * process is gone.  The call blocks meanwhile (sleeps, no signal).
 * Errors: KVC_E_INVAL (bad options or address), KVC_E_NOENT (verbs asked and
 * no usable RDMA device: the message says why, e.g. "no RDMA device found by
 * ibv_get_device_list"), KVC_E_SYS (socket, bind, listen, io_uring setup,
 * ibv_* failed: the message names the call and errno; a port still in use
 * after the retries: "... Address already in use (still after 3000 ms of
 * retries)"). */
kvc_err kvt_engine_create(const kvt_options *opts, kvt_engine **out);

/* Close every connection and free the engine.  Rooms still in flight are
 * failed (recorded in the segment) with reason "engine destroyed".  Waits
 * (bounded by io_timeout_ms) until the kernel has released every buffer of
 * ours it was sending from, so the caller may free its memory afterwards.
 * NULL is ignored. */
void kvt_engine_destroy(kvt_engine *e);

/* The backend the engine runs (never AUTO; AUTO only for a NULL engine). */
kvt_backend kvt_engine_backend(const kvt_engine *e);

/* The engine's session_id, "host:port" ("[v6]:port" for IPv6), as peers
 * reach it.  Owned by the engine, valid until destroy.  "" for NULL. */
const char *kvt_session_id(const kvt_engine *e);

/* The engine's generation: a number unique to this engine instance, sent in
 * its descriptor and handshake so peers can tell a restarted process.  0 for
 * NULL. */
uint64_t kvt_generation(const kvt_engine *e);

/* An fd that becomes readable (POLLIN) when kvt_progress() has work to do,
 * including expired deadlines.  Owned by the engine; do not read or close
 * it.  Poll it from another event loop, then call kvt_progress(e, 0, ...).
 * -1 for NULL. */
int kvt_fd(const kvt_engine *e);

/* ---- Memory regions ------------------------------------------------ */

/* Register [addr, addr+len) for transfers: as a source of this engine's
 * writes and a destination of its reads, and as a destination peers may
 * write into and a source peers may read from (kvt_submit_read).  Page-aligned or not.
 * The memory stays owned by the caller and must stay mapped until
 * kvt_mr_deregister().  *rkey_out (may be NULL) receives the region's remote
 * key (verbs rkey; TCP: the region's id), published in the descriptor.
 * Overlapping an existing region is refused.
 * Errors: KVC_E_INVAL (NULL, len 0, overlap, wrap-around), KVC_E_FULL (more
 * than 4096 regions), KVC_E_SYS with the cause: EFAULT (range not mapped),
 * ENOMEM (verbs: pinning refused; the message gives RLIMIT_MEMLOCK's soft and
 * hard limits when they are lower than the region), or ibv_reg_mr's errno. */
kvc_err kvt_mr_register(kvt_engine *e, void *addr, size_t len, uint32_t *rkey_out);

/* Deregister the region that starts at addr.  Peers learn of it only through
 * a new descriptor; a write or read from a peer that still targets it is
 * refused.
 * Errors: KVC_E_NOENT (no region starts at addr), KVC_E_BUSY (a receive into
 * it is in progress, a read of this engine into it has not ended, or a
 * peer's read from it is still being sent: call kvt_progress() and
 * retry). */
kvc_err kvt_mr_deregister(kvt_engine *e, void *addr);

/* ---- Descriptors (transfer-engine info) ------------------------------ */

/* This engine's descriptor as a JSON object text:
 *   {"session_id": "host:port", "backend": "tcp"|"verbs", "protocol": "kvt",
 *    "protocol_version": 1, "generation": N,
 *    "regions": [{"addr": N, "length": N, "rkey": N}, ...],
 *    "verbs": {"gid": "...", "qpn_base": 0, ...}   (verbs only)}
 * Integers are JSON numbers (addresses fit in int64 on Linux user space).
 * Readers ignore fields they do not know.  *json_out is malloc()ed; the
 * caller frees it.  Errors: KVC_E_SYS (out of memory). */
kvc_err kvt_descriptor_export(kvt_engine *e, char **json_out);

/* The largest descriptor kvt_descriptor_fetch() accepts, in bytes (1 MiB). */
#define KVT_DESC_MAX (1u << 20)

/* Fetch a peer's descriptor straight from the peer, without a metadata
 * server (P2P handshake): connect to session_id ("host:port", as
 * kvt_session_id() gives it), send a descriptor request (frame DESC_REQ,
 * with token when non-NULL), and return the peer's answer, the JSON text
 * kvt_descriptor_export() gives there, in *json_out (malloc()ed,
 * NUL-terminated; the caller frees it and passes it to kvt_peer_import()).
 * The peer answers from its kvt_progress(): it must be driven.  Its answer
 * is at most KVT_DESC_MAX bytes.  The whole exchange (connect, request,
 * answer) must end within timeout_ms (> 0).
 * Needs no engine; safe from any thread; blocking (poll(2)); no signal is
 * raised (MSG_NOSIGNAL).
 * Errors: KVC_E_INVAL (NULL, bad session_id, token empty or longer than
 * 255 bytes, timeout_ms <= 0; the peer answered with something that is not
 * a descriptor: bad frame, unexpected frame type, not a JSON object),
 * KVC_E_SYS (socket, connect, send or recv failed, e.g. "connect to H:P:
 * Connection refused"; the peer closed the connection before its answer;
 * out of memory), KVC_E_TIMEDOUT ("descriptor fetch from H:P: no answer
 * within N ms"), KVC_E_PEER (the peer refused the request: the message
 * carries its reason, e.g. "unauthorized: ... wrong handshake token"),
 * KVC_E_TOOBIG (the answer announces more than KVT_DESC_MAX bytes),
 * KVC_E_VERSION (the peer speaks another protocol version). */
kvc_err kvt_descriptor_fetch(const char *session_id, const char *token, int timeout_ms,
                             char **json_out);

/* Opaque handle on a peer engine, owned by this engine (freed by destroy). */
typedef struct kvt_peer kvt_peer;

/* Import a peer's descriptor (JSON text, len bytes, not necessarily
 * NUL-terminated).  A descriptor with a session_id already known updates
 * that peer: its regions are replaced and its unhealthy mark is cleared
 * (whoever imports it vouches that the peer answers: fetched from it, its
 * descriptor says so); when its generation differs (the peer restarted or
 * registered again) its old connections are also closed.  *out receives
 * the peer.
 * Staleness: every connection's handshake carries the peer's generation.
 * When it differs from the generation of the imported descriptor (the
 * peer restarted at the same session_id since, its regions are not the
 * ones imported), nothing is sent on it: every queued write and read to
 * the peer fails with code ESTALE and the reason "peer H:P restarted
 * (generation X, descriptor has Y): fetch its descriptor again", and the
 * peer is marked unhealthy.  Fetching and importing its new descriptor
 * (kvt_descriptor_fetch, kvt_peer_import) clears the mark.
 * Errors: KVC_E_INVAL (not JSON, a field missing or of the wrong type:
 * message names it), KVC_E_VERSION (protocol_version differs: "incompatible
 * protocol versions X vs Y"), KVC_E_FULL (more than 1024 peers). */
kvc_err kvt_peer_import(kvt_engine *e, const char *json, size_t len, kvt_peer **out);

/* Health of a peer, for diagnostics. */
typedef struct kvt_peer_info {
    char session_id[KVC_SESSION_ID_MAX + 1];
    uint64_t generation;
    int healthy;                /* 0 while marked unhealthy */
    uint64_t unhealthy_left_ms; /* time left on the mark, 0 when healthy */
    int32_t last_code;          /* errno / WC status of the failure that marked it */
    char last_error[KVC_REASON_MAX + 1];
    uint32_t conns_up;        /* connections established */
    uint64_t bytes_sent;      /* payload bytes acknowledged by the peer */
    uint32_t conns_same_host; /* of conns_up, those whose data is copied
                                 (force_socket) */
} kvt_peer_info;

/* Fill *out for peer p.  Errors: KVC_E_INVAL. */
kvc_err kvt_peer_stat(kvt_engine *e, const kvt_peer *p, kvt_peer_info *out);

/* ---- Writes --------------------------------------------------------- */

/* One run: len bytes from local address laddr (inside a region registered
 * here) to remote address raddr (inside a region of the peer's descriptor). */
typedef struct kvt_run {
    uint64_t laddr;
    uint64_t raddr;
    uint64_t len;
} kvt_run;

/* Submit a batch of writes for bootstrap room `room` to peer p.
 * Runs are checked first: every run must lie inside one local region and
 * inside one region of the peer's descriptor (len > 0); otherwise
 * KVC_E_INVAL names the run and nothing is sent.  Runs are then sorted by
 * local address, adjacent runs contiguous on both sides (and in the same
 * regions) coalesced, and runs longer than slice_bytes sliced.  The runs
 * array is copied; the memory it points to is NOT: it must stay untouched
 * (not reused, not freed, not deregistered) until the room's kvt_event is
 * returned by kvt_progress(): only then has every posted write of the room
 * completed, or been flushed (the connection torn down and the kernel done
 * with our buffers).  A room may be submitted in several batches: every
 * batch but the last passes KVT_SUBMIT_MORE; the room ends after the last.
 * In the segment (when the engine has one): the room is opened for this
 * rank as prefill and set Transferring; Success or a failure record follow.
 * Errors: KVC_E_INVAL (NULL, bad run, see above; room already finished
 * here; room > KVC_ROOM_ID_MAX),
 * KVC_E_BUSY (peer marked unhealthy: the message gives the peer, the reason
 * and the time left; the room's failure is also recorded in the segment and
 * no event follows), KVC_E_SYS (out of memory; the engine is unusable, see
 * kvt_progress()). */
#define KVT_SUBMIT_MORE \
    1u /* more batches of this room follow; the room ends
                              only after a submit without this flag */
/* No room bookkeeping: `room` is only a tag echoed in the operation's
 * event.  Nothing is recorded in the segment (this side; a receiving peer
 * with a segment still records the room there), and the operation's state
 * is freed when its event is queued, so a caller may use a new tag per call
 * (millions of them) with bounded memory.  Tags of operations in flight at
 * the same time, to the same peer and of the same kind (write or read),
 * should differ: a second submit with the tag of an unfinished operation
 * without KVT_SUBMIT_MORE is refused like a room that already ended. */
#define KVT_SUBMIT_NOROOM 2u
/* Memory: the engine keeps per room only what is unfinished.  A sender or
 * reader room is freed once its event is queued, a receiver room once its
 * DONE arrived; events wait in a queue until kvt_progress() returns them
 * (drive it).  Only a segment (kvt_options.seg) keeps finished rooms, with
 * its own limits (kvcoord.h). */
kvc_err kvt_submit(kvt_engine *e, kvt_peer *p, uint64_t room, const kvt_run *runs, size_t n,
                   unsigned flags);

/* ---- Reads ----------------------------------------------------------- */

/* Submit a batch of reads for room `room` from peer p: each run's len
 * bytes are pulled from the peer's raddr (inside a region of the peer's
 * descriptor, which the peer serves reads from) into local laddr (inside a
 * region registered here).  The checks, the coalescing and slicing, the
 * flags (KVT_SUBMIT_MORE, KVT_SUBMIT_NOROOM), the caps, deadlines and
 * unhealthy marks are kvt_submit()'s.  The peer reads only from regions it
 * registered: a run outside them is refused there (counted in its
 * frames_refused), nothing of that request is sent, and the room fails with
 * a reason naming the peer and the range.  Local memory of the runs must
 * not be read, reused, freed or deregistered until the room's event: while
 * the room runs the engine writes into it (deregistering it is refused with
 * KVC_E_BUSY).
 * TCP: the runs travel in READ frames (up to 256 runs each) on the peer's
 * connections, the data comes back on the same connection and is received
 * straight into place.  Verbs (both engines on verbs): RDMA READ.
 * In the segment (when the engine has one, without KVT_SUBMIT_NOROOM) the
 * room is opened for this rank as decode and set Transferring; Success or a
 * failure record follow.
 * The room's event has side KVT_SIDE_READER: Success means every byte of
 * every run is in local memory; Failed carries the code (errno or WC
 * status) and a reason naming the operation ("read"), the peer and the
 * error; after either no byte of the room is written here any more.
 * Errors: as kvt_submit(). */
kvc_err kvt_submit_read(kvt_engine *e, kvt_peer *p, uint64_t room, const kvt_run *runs, size_t n,
                        unsigned flags);

/* How a room's transfer ended on this engine. */
typedef enum kvt_side {
    KVT_SIDE_SENDER = 1,   /* kvt_submit() of this engine */
    KVT_SIDE_RECEIVER = 2, /* a peer's writes into this engine */
    KVT_SIDE_READER = 3    /* kvt_submit_read() of this engine */
} kvt_side;

/* A room's final event, returned once per room and side by kvt_progress(). */
typedef struct kvt_event {
    uint64_t room;
    kvt_side side;
    kvc_poll state;                    /* KVC_POLL_SUCCESS or KVC_POLL_FAILED */
    int32_t code;                      /* 0, errno, or an RDMA WC status (ibv_wc_status) */
    uint64_t bytes;                    /* payload bytes of the room written (sender: acknowledged;
                       reader: received in place) */
    char peer[KVC_SESSION_ID_MAX + 1]; /* the other side's session_id */
    char reason[KVC_REASON_MAX + 1];   /* "" on success; else names the peer, the
                                           operation and the error */
} kvt_event;

/* Drive the engine: submit queued operations, reap completions, apply and
 * acknowledge received writes, enforce deadlines, record rooms' outcomes
 * in the segment, and return finished rooms' events in ev[0..cap-1];
 * *n receives how many (may be 0).  Blocks up to timeout_ms when there is
 * nothing to return (0: never blocks; -1: until an event).  A receiving
 * engine must be driven too: peers' writes are applied, their reads and
 * descriptor requests answered only here.
 * Sender: an event with state Success means the peer acknowledged every
 * write and the end of the room; Failed means the room failed (recorded in
 * the segment with this rank as origin if it was the first failure) and
 * that none of the room's writes is still being sent from our memory.
 * Receiver: Success means every write the sender sent for the room is in
 * place (the sender's count and byte total were checked); Failed means the
 * sender aborted or its connection was lost mid-room.
 * Errors: KVC_E_INVAL, KVC_E_SYS (io_uring failed, or its submission queue
 * stayed full so no operation could be queued: the engine is unusable,
 * destroy it; the message says which). */
kvc_err kvt_progress(kvt_engine *e, int timeout_ms, kvt_event *ev, size_t cap, size_t *n);

/* Receiver side: expect `senders` peers to end room `room` before it counts
 * as Success here (default 1, when a decode rank receives from one prefill
 * rank).  Call before the first write arrives.  Errors: KVC_E_INVAL (NULL,
 * senders 0, room > KVC_ROOM_ID_MAX),
 * KVC_E_SYS (out of memory). */
kvc_err kvt_room_expect(kvt_engine *e, uint64_t room, uint32_t senders);

/* Engine counters, for benchmarks and diagnostics. */
typedef struct kvt_stats {
    uint64_t writes_sent, bytes_sent; /* acknowledged by peers */
    uint64_t writes_recv, bytes_recv; /* applied here */
    uint64_t frames_refused;          /* refused on input (bad region, ...) */
    uint64_t conns_failed;
    uint32_t peers, peers_unhealthy, conns_up;
    uint64_t rooms_ok, rooms_failed;
    uint64_t bytes_spliced;              /* payload bytes handed to sockets by splice
                               (tcp_splice_min), whether acknowledged or not */
    uint64_t reads_done, bytes_read;     /* this engine's reads, in place */
    uint64_t reads_served, bytes_served; /* peers' reads answered from here
                                            (queued to send, or granted to a
                                            same-host copy) */
    /* The same-host copy (force_socket): copies this engine made with
     * process_vm_readv (a peer's writes into here, this engine's reads)
     * and their bytes; connections whose negotiation failed on this host
     * (they use the socket). */
    uint64_t same_host_copies, same_host_bytes;
    uint64_t same_host_fallbacks;
    /* Sending engines known here now: one per (session id, generation)
     * with a connection up, at most 1024 (a handshake past that is
     * refused); one that restarts replaces its old entry, one whose last
     * connection closes is forgotten. */
    uint32_t senders;
} kvt_stats;

/* Fill *out.  Errors: KVC_E_INVAL. */
kvc_err kvt_engine_stat(const kvt_engine *e, kvt_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* KVCOORD_TRANSFER_H */
