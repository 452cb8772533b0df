/*
 * xfer_cma.h - the same-host data path (xfer_cma.c): when both engines of
 * a connection run on one host (same boot_id, same pid namespace, each
 * process proven by a nonce the other reads out of its memory), the bytes
 * of a write or a read are copied by process_vm_readv(2) ("cross-memory
 * attach", the way UCX's cma transport and Open MPI's CMA do it) instead
 * of travelling through the socket; the connection still carries every
 * request, acknowledgement and refusal.
 *
 * Who copies: always the process whose memory is written, after it
 * checked the ranges against its own registered regions.
 *  - write A -> B: B checks the destination runs, copies them from A
 *    (process_vm_readv of A), then acknowledges (CMA_WRITE, ACK/NACK);
 *  - read A <- B: B checks the source runs and keeps them pinned (busy)
 *    until A says it is done (CMA_READ, CMA_READ_GO, CMA_READ_END); A
 *    copies them from B into its own memory (checked at submit).
 * No process ever writes into another's memory: a peer that gave up on a
 * call cannot be written into late.
 *
 * Negotiation, on each connection, after HELLO / HELLO_OK both carried
 * KVT_HELLO_F_CMA (docs/transfer.md, "Same-host copy"):
 *   client: CMA_HELLO {its identity, slot address, nonce N1}
 *   server: checks boot_id, pid namespace, the pid's start time; puts N1
 *           into its slot; CMA_HELLO {its identity, slot, nonce N2}
 *           (or status != 0 and a reason: no same-host copy)
 *   client: checks the same, reads the server's slot (must hold N1), puts
 *           N2 into its slot; CMA_CHECK
 *   server: reads the client's slot (must hold N2): CMA_CHECK status 0,
 *           or status = errno and a reason.
 * Any failure leaves the connection on the socket path (the client logs
 * it once per peer when it is not merely another host); EPERM here is
 * the usual one (Yama ptrace_scope, seccomp, another uid, a process that
 * set PR_SET_DUMPABLE 0).
 */
#ifndef KVC_XFER_CMA_H
#define KVC_XFER_CMA_H

#include "xfer_internal.h"

/* KVCOORD_FORCE_SOCKET (environment): set to anything but "", "0",
 * "false", "no" or "off", the engine never uses the same-host copy, as
 * kvt_options.force_socket = 1 (the env var named like Mooncake's
 * MC_FORCE_TCP). */
#define KVT_FORCE_SOCKET_ENV "KVCOORD_FORCE_SOCKET"

/* At engine creation: this process's identity, and whether the same-host
 * copy is on (not forced off, identity readable).  Logs one INFO line
 * when it is forced off. */
void kvt__cma_init(kvt_engine *e);

/* Client: HELLO_OK arrived with the peer's flags.  true: the negotiation
 * started (the connection goes up when it ends); false: not attempted. */
bool kvt__cma_client_start(kvt_engine *e, kvt__conn *c, uint32_t peer_flags);

/* CMA_HELLO and CMA_CHECK on either side (the frame in c->cur, payload
 * in c->ctl).  The client's connection goes up at the end (kvt__rx_up). */
void kvt__cma_on_hello(kvt_engine *e, kvt__conn *c);
void kvt__cma_on_check(kvt_engine *e, kvt__conn *c);

/* Copy n runs from the peer of c (its pid, verified) into this process:
 * local[i] receives remote[i] (same lengths).  Partial copies are resumed.
 * Returns 0, or the errno with a reason naming the peer in why (ESRCH:
 * the peer is gone, EFAULT: its range is not mapped, EPERM: refused).
 * The iovec arrays are consumed. */
int kvt__cma_pull(kvt_engine *e, kvt__conn *c, struct iovec *local, struct iovec *remote, size_t n,
                  char *why, size_t cap);

/* Sending: whether w goes as a same-host frame on c (data frames on a
 * verified connection); if so its header is re-encoded (CMA_WRITE with
 * the table in w->cma, or CMA_READ) and *pay / *plen are what follows it. */
bool kvt__cma_frame(kvt__conn *c, kvt__wr *w, const void **pay, uint32_t *plen);

/* A copy that failed with err after the handshake: whether the transfer
 * goes on through the socket instead (everything but EFAULT: a permission
 * refused, the peer's pid check, a seccomp'd or missing syscall, no
 * memory; EFAULT, a range not mapped, would fail through the socket too).
 * An out-of-region request is refused before any copy and never falls
 * back. */
bool kvt__cma_falls_back(int err);

/* The copy failed on c with err (why: kvt__cma_pull's reason): c's data
 * goes through the socket from now on (KVT_CMA_FELL), counted in
 * same_host_fallbacks, logged once per peer (WARN). */
void kvt__cma_fell(kvt_engine *e, kvt__conn *c, int err, const char *why);

/* c closes: its pidfd. */
void kvt__cma_forget(kvt__conn *c);

/* The engine is destroyed: its copy helper thread (if one was started)
 * is joined. */
void kvt__cma_fini(kvt_engine *e);

#endif
