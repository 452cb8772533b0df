/*
 * seqlock.h - the segment's one seqlock: room slots (rooms_*.c), rank entries
 * (ranks.c) and failure ring entries (rooms_ring.c) are read with it, without a
 * lock, by any process.
 *
 * The protocol is Linux's seqcount (include/linux/seqlock.h:
 * write_seqcount_begin = seq++, smp_wmb(); write_seqcount_end = smp_wmb(),
 * seq++; read_seqcount_begin/retry with smp_rmb()) in C11 atomics:
 *
 *   writer (writers are serialised by a lock of their own):
 *     seq = seq + 1 (odd, relaxed); release fence;
 *     data stores (relaxed atomic);
 *     seq = seq + 1 (even, release store)
 *   reader:
 *     s1 = seq (acquire); if odd, a writer is inside: retry later;
 *     data loads (relaxed atomic) into a private copy;
 *     acquire fence; retry unless seq (relaxed) == s1
 *
 * Why each ordering is there:
 *   - The release fence after the odd store (and not an acquire or acq_rel
 *     read-modify-write, which orders only what follows it after its *load*)
 *     keeps every data store after the odd seq: a reader whose relaxed load
 *     sees any of them synchronises, fence to fence, with the writer, so its
 *     re-read of seq sees at least the odd value and it retries.  Without
 *     it, ARMv8.0's LL/SC atomics (ldaxr/stlxr) let the data become visible
 *     before the odd seq, and a reader accepts a torn copy between two
 *     equal even values.
 *   - The release store of the even seq publishes the data to a reader that
 *     reads that value with acquire.
 *   - The reader's acquire fence keeps its data loads before the re-read.
 *   - Data is accessed through atomic operations on both sides, so that a
 *     reader running alongside a writer is no data race (no undefined
 *     behaviour) under the C11 model: it may load garbage, which the re-check
 *     then throws away.  kvc_seq_load()/kvc_seq_store() copy through
 *     relaxed atomic loads/stores of aligned 8-byte words (4-byte words and
 *     bytes at unaligned ends); on x86-64 and arm64 these are the plain
 *     loads and stores a memcpy would use, without the vector instructions.
 *
 * Anything a lock-free reader may be copying is written only through
 * kvc_seq_store() (or another atomic store), and only after a release fence
 * that follows the last seq change the reader could have seen: inside a
 * write_begin/end window (rooms, ring entries), or, for a double buffer
 * whose inactive half and blobs are written outside the window (ranks.c),
 * after kvc_seq_write_prepare().
 *
 * The seq words are _Atomic uint32_t (rooms) or _Atomic uint64_t (ranks);
 * these macros take either.  Writers only: the lock they hold is the only
 * writer of seq, so a relaxed load + store (no locked instruction) is
 * enough.
 */
#ifndef KVC_SEQLOCK_H
#define KVC_SEQLOCK_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Reader: the seq value a copy starts from (odd: a writer is inside). */
#define kvc_seq_read_begin(seq) atomic_load_explicit((seq), memory_order_acquire)

/* Reader: true when what was copied since kvc_seq_read_begin() returned s1
 * may be torn (seq moved): copy again. */
#define kvc_seq_read_retry(seq, s1)             \
    (atomic_thread_fence(memory_order_acquire), \
     atomic_load_explicit((seq), memory_order_relaxed) != (s1))

/* The protocol's invariants, checked in debug builds (kvc__assert,
 * segment/internal.h: with KVC_ASSERTS, the library's Debug and sanitizer
 * builds, a false one aborts naming it).  In other builds the check is
 * nothing and the window macros below are the same loads and stores as
 * without it.  A window opens on an even seq (odd would be a second writer
 * inside: writers hold their lock) and closes an odd one. */
#ifdef KVC_ASSERTS
#define KVC__SEQ_CHECK(c) kvc__assert(c)
#else
#define KVC__SEQ_CHECK(c) ((void)0)
#endif

/* Writer: make seq odd, and order every later store after it. */
#define kvc_seq_write_begin(seq)                                                 \
    do {                                                                         \
        __typeof__(atomic_load_explicit((seq), memory_order_relaxed)) even_ =    \
            atomic_load_explicit((seq), memory_order_relaxed);                   \
        KVC__SEQ_CHECK(!(even_ & 1) && "a seqlock window opens on an even seq"); \
        atomic_store_explicit((seq), even_ + 1, memory_order_relaxed);           \
        atomic_thread_fence(memory_order_release);                               \
    } while (0)

/* Writer: make seq even again, publishing the stores made since begin. */
#define kvc_seq_write_end(seq)                                               \
    do {                                                                     \
        __typeof__(atomic_load_explicit((seq), memory_order_relaxed)) odd_ = \
            atomic_load_explicit((seq), memory_order_relaxed);               \
        KVC__SEQ_CHECK((odd_ & 1) && "a seqlock window closes an odd seq");  \
        atomic_store_explicit((seq), odd_ + 1, memory_order_release);        \
    } while (0)

/* Writer of a double buffer (ranks.c), after taking its lock and before it
 * writes an inactive half or a blob a reader of an older value may still be
 * copying: orders those stores after every seq change made before the lock
 * was taken (by this process or the lock's previous holder), so such a
 * reader that sees one of them also sees the seq moved. */
static inline void kvc_seq_write_prepare(void) { atomic_thread_fence(memory_order_release); }

/* The words the copies move; may_alias: they read and write objects of
 * any type (rooms, descriptors, blobs of bytes). */
typedef uint64_t __attribute__((may_alias)) kvc_seq_word;
typedef uint32_t __attribute__((may_alias)) kvc_seq_half;

/* The copy loops below, one shape for the three of them: byte steps up to
 * a 4-byte boundary of the shared side, a 4-byte step up to an 8-byte one,
 * 8-byte words, then a 4-byte and byte steps for the tail.  S is the
 * shared pointer (advanced), P the private one; STEP(type) moves one
 * element of type at S and P (and may return). */
#define KVC__SEQ_COPY(S, P, len, STEP)                                             \
    do {                                                                           \
        for (; (len) && ((uintptr_t)(S)&3); (len)--)                               \
            STEP(unsigned char);                                                   \
        if ((len) >= 4 && ((uintptr_t)(S)&4)) {                                    \
            STEP(kvc_seq_half);                                                    \
            (len) -= 4;                                                            \
        }                                                                          \
        _Pragma("GCC unroll 4") for (; (len) >= 8; (len) -= 8) STEP(kvc_seq_word); \
        if ((len) >= 4) {                                                          \
            STEP(kvc_seq_half);                                                    \
            (len) -= 4;                                                            \
        }                                                                          \
        for (; (len); (len)--)                                                     \
            STEP(unsigned char);                                                   \
    } while (0)

#define KVC__SEQ_LOAD(T)                                        \
    do {                                                        \
        T v_ = __atomic_load_n((const T *)s, __ATOMIC_RELAXED); \
        memcpy(d, &v_, sizeof v_);                              \
        s += sizeof(T), d += sizeof(T);                         \
    } while (0)

#define KVC__SEQ_STORE(T)                               \
    do {                                                \
        T v_;                                           \
        memcpy(&v_, p, sizeof v_);                      \
        __atomic_store_n((T *)d, v_, __ATOMIC_RELAXED); \
        d += sizeof(T), p += sizeof(T);                 \
    } while (0)

#define KVC__SEQ_CMP(T)                                             \
    do {                                                            \
        T v_ = __atomic_load_n((const T *)s, __ATOMIC_RELAXED), q_; \
        memcpy(&q_, p, sizeof q_);                                  \
        if (v_ != q_)                                               \
            return false;                                           \
        s += sizeof(T), p += sizeof(T);                             \
    } while (0)

/* Copy len bytes of seqlock-protected src into private dst (any alignment)
 * through relaxed atomic loads. */
static inline void kvc_seq_load(void *dst, const void *src, size_t len)
{
    unsigned char *d = dst;
    const unsigned char *s = src;
    KVC__SEQ_COPY(s, d, len, KVC__SEQ_LOAD);
}

/* Copy len bytes of private src into seqlock-protected dst (any alignment)
 * through relaxed atomic stores.  Writers only (their lock held). */
static inline void kvc_seq_store(void *dst, const void *src, size_t len)
{
    unsigned char *d = dst;
    const unsigned char *p = src;
    KVC__SEQ_COPY(d, p, len, KVC__SEQ_STORE);
}

/* Whether len bytes of seqlock-protected shared equal private priv, read
 * through relaxed atomic loads (a lock-free reader's memcmp; the answer
 * counts only if kvc_seq_read_retry() then says the copy is whole). */
static inline bool kvc_seq_equal(const void *shared, const void *priv, size_t len)
{
    const unsigned char *s = shared, *p = priv;
    KVC__SEQ_COPY(s, p, len, KVC__SEQ_CMP);
    return true;
}

#endif /* KVC_SEQLOCK_H */
