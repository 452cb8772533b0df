/*
 * uring_ud.h - what kvcoord's io_uring users (kvcoordd's event loop, the
 * transfer engine) share about their rings: one packing of an SQE's
 * user_data, and one policy for a full submission queue.  Header-only
 * (kvcoord_common crosses no library boundary).
 *
 * user_data: bits 56-63 the operation (the caller's enum, 1..255; 0 is
 * free for "ignore"), bits 32-55 a sequence number (which arming of a
 * timer or poll a completion belongs to; 24 bits, wrapping), bits 0-31 the
 * object it is for (a connection slot, an engine connection id).
 *
 * A full SQ: hand what is queued to the kernel and retry, up to
 * KVC__SQE_TRIES times (a submit interrupted or refused for a backed-up CQ
 * counts as a try); NULL when the kernel keeps taking nothing, and the
 * caller decides what that means for its operation (kvcoordd closes the
 * connection it was for; the engine fails the transfer).  Never a wait:
 * completions are only drained by the caller's own loop.
 */
#ifndef KVC_URING_UD_H
#define KVC_URING_UD_H

#include <errno.h>
#include <liburing.h>
#include <stdint.h>

#define KVC__SQE_TRIES 4

static inline uint64_t kvc__ud_pack(unsigned op, uint32_t id, uint32_t seq)
{
    return (uint64_t)(op & 0xffu) << 56 | (uint64_t)(seq & 0xffffffu) << 32 | (uint64_t)id;
}
static inline unsigned kvc__ud_op(uint64_t ud) { return (unsigned)(ud >> 56); }
static inline uint32_t kvc__ud_seq(uint64_t ud) { return (uint32_t)(ud >> 32) & 0xffffffu; }
static inline uint32_t kvc__ud_id(uint64_t ud) { return (uint32_t)ud; }

/* An SQE of ring, or NULL when the SQ stays full (the policy above); *err
 * (may be NULL) receives the last submit's error as a positive errno, or 0
 * when the kernel took nothing without one. */
static inline struct io_uring_sqe *kvc__uring_sqe(struct io_uring *ring, int *err)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
    int e = 0;
    for (int tries = 0; !sqe && tries < KVC__SQE_TRIES; tries++) {
        int ret = io_uring_submit(ring);
        e = ret < 0 ? -ret : 0;
        if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY)
            break; /* the ring is unusable: retrying changes nothing */
        sqe = io_uring_get_sqe(ring);
    }
    if (err)
        *err = sqe ? 0 : e;
    return sqe;
}

#endif /* KVC_URING_UD_H */
