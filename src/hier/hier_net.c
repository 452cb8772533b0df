/*
 * hier_net.c - the leaders' exchange of a hierarchical step over TCP (one
 * connection per node pair, handed over by kvc_hier_open's caller).
 *
 * Every step a leader sends every other leader exactly one message for it:
 * DATA (its node's signatures and partial MIN) or FAIL (its node's round
 * failed: the record).  After a failure it decided itself (a node sent
 * nothing in time, a connection closed, a malformed message) it also sends
 * ABORT (the record) for the step, so that a leader that comes late reads
 * its peers' DATA and then their ABORT, and fails the step too.
 *
 * Message: 20 bytes of header, little-endian - "KVH1", type (u8), has_data
 * (u8), nsig (u16), len (u32), step (u64) - then nsig signatures of
 * SIG_BYTES (DATA: the sender node's ranks, lowest first) and len bytes
 * (DATA: the partial MIN; FAIL, ABORT: a record of REC_BYTES).  A peer's
 * message is checked against these caps before anything is kept; a
 * malformed one fails the step as a closed connection would.
 *
 * Messages of earlier steps (a step this leader gave up before they came)
 * are dropped; one of a later step is left in the buffer for its step.
 * No lock: one thread per handle (hier.c).
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "hier_internal.h"

enum { MSG_DATA = 1, MSG_FAIL = 2, MSG_ABORT = 3 };
#define HDR 20u
#define MAX_MSG (HDR + HIER_MAX_RANKS * SIG_BYTES + KVC_HIER_MAX_LEN)

uint64_t hier__mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void put_hdr(uint8_t *p, int type, bool has_data, uint32_t nsig, uint32_t len, uint64_t step)
{
    memcpy(p, "KVH1", 4);
    p[4] = (uint8_t)type;
    p[5] = has_data;
    p[6] = (uint8_t)nsig;
    p[7] = (uint8_t)(nsig >> 8);
    for (int i = 0; i < 4; i++)
        p[8 + i] = (uint8_t)(len >> (8 * i));
    for (int i = 0; i < 8; i++)
        p[12 + i] = (uint8_t)(step >> (8 * i));
}

static uint32_t ms_left(uint64_t deadline)
{
    uint64_t now = hier__mono_ns();
    return now >= deadline ? 0 : (uint32_t)((deadline - now + 999999) / 1000000);
}

/* Send all n bytes to fd before deadline: 0, -1 closed or broken (what
 * says), -2 timed out. */
static int send_all(int fd, const uint8_t *p, size_t n, uint64_t deadline, char *what, size_t cap)
{
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            uint32_t ms = ms_left(deadline);
            if (!ms)
                return -2;
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            if (poll(&pf, 1, (int)ms) < 0 && errno != EINTR) {
                snprintf(what, cap, "poll: %s", strerror(errno));
                return -1;
            }
            continue;
        }
        snprintf(what, cap, "send: %s", k < 0 ? strerror(errno) : "nothing sent");
        return -1;
    }
    return 0;
}

/* Read what is there from peer p: 0, or -1 once the connection closed or
 * broke (what says how). */
static int read_some(hier_peer *p, char *what, size_t cap)
{
    for (;;) {
        if (p->cap - p->have < 4096) {
            size_t nc = p->cap ? p->cap * 2 : 65536;
            if (nc > MAX_MSG + 65536)
                nc = MAX_MSG + 65536;
            if (nc <= p->cap)
                return 0; /* full: parse first (a message is never larger) */
            uint8_t *nb = realloc(p->rx, nc);
            if (!nb) {
                snprintf(what, cap, "out of memory for its messages");
                return -1;
            }
            p->rx = nb;
            p->cap = nc;
        }
        ssize_t k = recv(p->fd, p->rx + p->have, p->cap - p->have, MSG_DONTWAIT);
        if (k > 0) {
            p->have += (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        snprintf(what, cap, "%s", k == 0 ? "end of stream" : strerror(errno));
        return -1;
    }
}

typedef struct xstate {
    size_t len;      /* this node's data length */
    bool failed;     /* *r holds the step's failure */
    bool told;       /* the failure came from a peer (no ABORT to send) */
    bool short_data; /* a node sent no data (its own ranks differed) */
} xstate;

/* Parse peer j's buffered messages for step h->step.  Returns false when
 * the peer broke the protocol (then *r says so). */
static bool parse(kvc_hier *h, uint32_t j, xstate *x, hier_rec *r)
{
    hier_peer *p = &h->peer[j];
    size_t off = 0;
    bool ok = true;
    uint32_t want_sig = (uint32_t)__builtin_popcountll(h->ranks_of[j]);
    char bad[96] = "";
    while (p->have - off >= HDR) {
        const uint8_t *m = p->rx + off;
        uint32_t nsig = (uint32_t)m[6] | (uint32_t)m[7] << 8, len = 0;
        uint64_t step = 0;
        for (int i = 0; i < 4; i++)
            len |= (uint32_t)m[8 + i] << (8 * i);
        for (int i = 0; i < 8; i++)
            step |= (uint64_t)m[12 + i] << (8 * i);
        int type = m[4];
        if (memcmp(m, "KVH1", 4) || type < MSG_DATA || type > MSG_ABORT ||
            (type == MSG_DATA && (nsig != want_sig || len > KVC_HIER_MAX_LEN)) ||
            (type != MSG_DATA && (nsig != 0 || len != REC_BYTES))) {
            snprintf(bad, sizeof bad, "a malformed message (type %d, %u signatures, %u bytes)",
                     type, nsig, len);
            ok = false;
            break;
        }
        size_t total = HDR + (size_t)nsig * SIG_BYTES + len;
        if (p->have - off < total)
            break;
        if (step > h->step) {
            if (!p->got) {
                snprintf(bad, sizeof bad, "step %llu while this node is at step %llu",
                         (unsigned long long)step, (unsigned long long)h->step);
                ok = false;
            }
            break; /* its next step's: kept */
        }
        off += total;
        if (step < h->step)
            continue; /* a step this leader gave up: dropped */
        const uint8_t *body = m + HDR + (size_t)nsig * SIG_BYTES;
        if (type == MSG_DATA) {
            if (p->got) {
                snprintf(bad, sizeof bad, "two messages for step %llu", (unsigned long long)step);
                ok = false;
                break;
            }
            p->got = true;
            uint32_t i = 0;
            for (uint32_t g = 0; g < h->size; g++)
                if (h->ranks_of[j] >> g & 1)
                    memcpy(h->gsig[g], m + HDR + (size_t)(i++) * SIG_BYTES, SIG_BYTES);
            if (!m[5] || len != x->len)
                x->short_data = true;
            else
                for (size_t b = 0; b < len; b++)
                    h->acc[b] = body[b] < h->acc[b] ? body[b] : h->acc[b];
        } else {
            p->got = true;
            if (!x->failed) {
                hier__rec_get(r, body);
                r->failed = 1;
                r->step = h->step;
                if (r->code == KVC_OK)
                    r->code = KVC_E_PEER;
                x->failed = x->told = true;
            }
        }
    }
    if (off) {
        memmove(p->rx, p->rx + off, p->have - off);
        p->have -= off;
    }
    if (!ok && !x->failed) {
        hier__rec_node(h, r, j, true, 0, bad);
        snprintf(r->text, sizeof r->text,
                 "node %s's leader, rank %u, sent %s (step %llu of group 0x%llx)", h->names[j],
                 h->leader_of[j], bad, (unsigned long long)h->step, (unsigned long long)h->group);
        x->failed = true;
    }
    return ok;
}

/* Tell every other leader this node's failure of the step (best effort:
 * what does not go out at once is not waited for). */
static void send_abort(kvc_hier *h, const hier_rec *r)
{
    uint8_t msg[HDR + REC_BYTES];
    put_hdr(msg, MSG_ABORT, false, 0, REC_BYTES, h->step);
    hier__rec_put(r, msg + HDR);
    char what[64];
    for (uint32_t j = 0; j < h->nodes; j++)
        if (j != h->node && h->peer[j].fd >= 0)
            send_all(h->peer[j].fd, msg, sizeof msg, 0, what, sizeof what);
}

/* Read what the peers sent, to keep it (parsed at its step, if ever): a
 * process that exits with unread bytes in a socket makes the kernel reset
 * the connection, and its peer may then report the reset instead of the
 * failure this node sent just before. */
void hier__drain(kvc_hier *h)
{
    char what[64];
    for (uint32_t j = 0; j < h->nodes; j++)
        if (j != h->node && h->peer[j].fd >= 0)
            read_some(&h->peer[j], what, sizeof what);
}

void hier__tell(kvc_hier *h, uint64_t step, const hier_rec *r)
{
    uint8_t msg[HDR + REC_BYTES];
    put_hdr(msg, MSG_FAIL, false, 0, REC_BYTES, step);
    hier__rec_put(r, msg + HDR);
    char what[64];
    for (uint32_t j = 0; j < h->nodes; j++)
        if (j != h->node && h->peer[j].fd >= 0)
            send_all(h->peer[j].fd, msg, sizeof msg, 0, what, sizeof what);
    hier__drain(h);
}

bool hier__exchange(kvc_hier *h, const hier_rec *mine, const uint8_t *sigs, bool has_data,
                    size_t len, uint64_t deadline, hier_rec *r)
{
    /* 1. this node's message for the step, to every other leader */
    size_t n;
    uint8_t *msg = h->buf;
    if (mine) {
        put_hdr(msg, MSG_FAIL, false, 0, REC_BYTES, h->step);
        hier__rec_put(mine, msg + HDR);
        n = HDR + REC_BYTES;
    } else {
        put_hdr(msg, MSG_DATA, has_data, h->lsize, has_data ? (uint32_t)len : 0, h->step);
        memcpy(msg + HDR, sigs, (size_t)h->lsize * SIG_BYTES);
        if (has_data)
            memcpy(msg + HDR + h->lsize * SIG_BYTES, h->acc, len);
        n = HDR + h->lsize * SIG_BYTES + (has_data ? len : 0);
    }
    xstate x = {.len = len, .short_data = !has_data};
    char what[96];
    for (uint32_t j = 0; j < h->nodes; j++) {
        h->peer[j].got = j == h->node;
        if (j == h->node || x.failed)
            continue;
        int s = send_all(h->peer[j].fd, msg, n, deadline, what, sizeof what);
        if (s) {
            hier__rec_node(h, r, j, s == -1, (uint32_t)((deadline - hier__mono_ns()) / 1000000),
                           s == -1 ? what : "its connection took nothing");
            x.failed = true;
        }
    }
    if (mine) { /* this node failed: the others learn it; nothing to wait for */
        hier__drain(h);
        return false;
    }
    uint32_t wait_ms = ms_left(deadline);
    /* 2. every other leader's message for the step */
    while (!x.failed) {
        struct pollfd pf[KVC_HIER_MAX_NODES];
        uint32_t idx[KVC_HIER_MAX_NODES], np = 0;
        for (uint32_t j = 0; j < h->nodes; j++)
            if (!h->peer[j].got) {
                /* bytes already buffered may hold it */
                if (!parse(h, j, &x, r) || x.failed)
                    break;
                if (h->peer[j].got)
                    continue;
                pf[np] = (struct pollfd){.fd = h->peer[j].fd, .events = POLLIN};
                idx[np++] = j;
            }
        if (x.failed || !np)
            break;
        uint32_t ms = ms_left(deadline);
        if (!ms) {
            hier__rec_node(h, r, idx[0], false, wait_ms, "");
            x.failed = true;
            break;
        }
        int k = poll(pf, np, (int)ms);
        if (k < 0 && errno != EINTR) {
            snprintf(what, sizeof what, "poll: %s", strerror(errno));
            hier__rec_node(h, r, idx[0], true, 0, what);
            x.failed = true;
            break;
        }
        for (uint32_t i = 0; i < np && k > 0 && !x.failed; i++) {
            if (!pf[i].revents)
                continue;
            uint32_t j = idx[i];
            int rd = read_some(&h->peer[j], what, sizeof what);
            parse(h, j, &x, r);
            if (rd < 0 && !h->peer[j].got && !x.failed) {
                hier__rec_node(h, r, j, true, 0, what);
                x.failed = true;
            }
        }
    }
    /* 3. an ABORT of the step already here (a leader gave it up before this
     * one came): the step fails here too */
    for (uint32_t j = 0; j < h->nodes && !x.failed; j++)
        if (j != h->node) {
            read_some(&h->peer[j], what, sizeof what);
            parse(h, j, &x, r);
        }
    if (x.failed) {
        if (!x.told)
            send_abort(h, r);
        return false;
    }
    if (hier__rec_mismatch(h, r))
        return false;
    if (x.short_data) { /* cannot be without a mismatch; a peer lying */
        hier__rec_node(h, r, h->node, true, 0, "a node sent no data without a mismatch");
        send_abort(h, r);
        return false;
    }
    return true;
}
