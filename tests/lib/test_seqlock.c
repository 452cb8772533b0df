/*
 * test_seqlock.c - writers and readers hammer the segment's seqlock
 * (src/core/segment/seqlock.h) from separate processes, and every snapshot a
 * reader accepts is checked whole: each writer stores a value in which
 * every byte derives from one counter, and a reader recomputes all of it
 * from the counter it read.
 *
 *   words: the seqlock alone on a shared mapping (a record starting and
 *          ending off word boundaries, so the byte paths run too); two
 *          writers serialised by a process-shared mutex, as the segment's
 *          writers are by their lock.
 *   rooms: kvc_room_fail_adopt() rewriting one room's failure record, read
 *          back by kvc_room_get() and kvc_failures_recent() (the room's
 *          seqlock and the failure ring's).
 *   ranks: kvc_rank_register() of one rank with session_id and info of
 *          varying length (blobs move and are reused in the arena), read
 *          back by kvc_rank_lookup() (the double buffer's seqlock).
 *
 * Loops end when the writers have done their count, never on a clock.
 * KVC_TEST_SCALE=N divides the counts by N (the arm64 step of
 * tools/kvcoord.sh test sets it: qemu-user runs the processes many times
 * slower).
 * Readers also count the copies the seqlock rejected that were in fact
 * torn, to show the writers and readers did overlap (printed, not judged:
 * overlap depends on scheduling).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include "seqlock.h"
#include "testutil.h"
#include "tu_proc.h"

#define WRITERS 2
#define READERS 2

static int scale = 1; /* KVC_TEST_SCALE */

struct tally {
    _Atomic uint64_t accepted, torn_accepted, retried, torn_rejected, writers_left;
    char first_bad[256];
};

static void *shared_map(size_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(p != MAP_FAILED);
    memset(p, 0, len);
    return p;
}

static void note_bad(struct tally *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note_bad(struct tally *t, const char *fmt, ...)
{
    if (atomic_fetch_add(&t->torn_accepted, 1) == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(t->first_bad, sizeof t->first_bad, fmt, ap);
        va_end(ap);
    }
}

/* Fork n children running fn(i); returns with their pids in pids. */
static void spawn(pid_t *pids, int n, void (*fn)(int, void *), void *arg)
{
    for (int i = 0; i < n; i++) {
        pids[i] = fork();
        assert_true(pids[i] >= 0);
        if (pids[i] == 0) {
            fn(i, arg);
            _exit(0);
        }
    }
}

static void report(const char *what, struct tally *t)
{
    printf("%s: %" PRIu64 " snapshots accepted, %" PRIu64 " torn among them; %" PRIu64
           " rejected by the re-check, %" PRIu64 " of those torn\n",
           what, atomic_load(&t->accepted), atomic_load(&t->torn_accepted),
           atomic_load(&t->retried), atomic_load(&t->torn_rejected));
    if (atomic_load(&t->torn_accepted))
        fail_msg("%s: a reader accepted a torn snapshot: %s", what, t->first_bad);
    assert_true(atomic_load(&t->accepted) > 0);
}

/* ---- the seqlock alone ---------------------------------------------- */

#define REC_BYTES 333 /* neither ends on a word boundary (starts at +4) */
#define WORD_WRITES (200000 / scale)

struct words {
    pthread_mutex_t lock; /* process-shared: the writers' lock */
    uint64_t counter;     /* under lock */
    struct tally t;
    _Atomic uint32_t seq;
    unsigned char rec[REC_BYTES]; /* at an offset of 4 mod 8 */
};

/* Every byte of the record from counter c: c itself, then bytes of a
 * sequence seeded by it. */
static void word_pattern(uint64_t c, unsigned char *out)
{
    memcpy(out, &c, sizeof c);
    uint64_t x = c * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = sizeof c; i < REC_BYTES; i++) {
        x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
        out[i] = (unsigned char)((x * 0x2545f4914f6cdd1dull) >> 56);
    }
}

static void word_writer(int id, void *arg)
{
    (void)id;
    struct words *w = arg;
    unsigned char buf[REC_BYTES];
    for (int k = 0; k < (int)WORD_WRITES; k++) {
        pthread_mutex_lock(&w->lock);
        word_pattern(++w->counter, buf);
        kvc_seq_write_begin(&w->seq);
        kvc_seq_store(w->rec, buf, REC_BYTES / 2);
        if (k % 64 == 0)
            sched_yield(); /* now and then a reader meets an odd seq */
        kvc_seq_store(w->rec + REC_BYTES / 2, buf + REC_BYTES / 2, REC_BYTES - REC_BYTES / 2);
        kvc_seq_write_end(&w->seq);
        pthread_mutex_unlock(&w->lock);
    }
    atomic_fetch_sub(&w->t.writers_left, 1);
}

static void word_reader(int id, void *arg)
{
    struct words *w = arg;
    unsigned char got[REC_BYTES + 1], want[REC_BYTES];
    while (atomic_load(&w->t.writers_left)) {
        uint32_t s1 = kvc_seq_read_begin(&w->seq);
        if (s1 & 1) {
            sched_yield();
            continue;
        }
        kvc_seq_load(got + (id & 1), w->rec, REC_BYTES); /* destinations of both alignments */
        bool retry = kvc_seq_read_retry(&w->seq, s1);
        uint64_t c;
        memcpy(&c, got + (id & 1), sizeof c);
        word_pattern(c, want);
        bool whole = !memcmp(got + (id & 1), want, REC_BYTES);
        if (retry) {
            atomic_fetch_add(&w->t.retried, 1);
            atomic_fetch_add(&w->t.torn_rejected, !whole);
        } else if (!whole) {
            note_bad(&w->t, "record of counter %" PRIu64 " differs from its pattern", c);
        } else {
            atomic_fetch_add(&w->t.accepted, 1);
        }
    }
}

static void test_words(void **st)
{
    (void)st;
    struct words *w = shared_map(sizeof *w);
    assert_int_equal((uintptr_t)w->rec % 8, 4);
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    pthread_mutex_init(&w->lock, &ma);
    word_pattern(0, w->rec);
    atomic_store(&w->t.writers_left, WRITERS);
    pid_t rd[READERS], wr[WRITERS];
    spawn(rd, READERS, word_reader, w);
    spawn(wr, WRITERS, word_writer, w);
    tu_reap_ok(wr, WRITERS);
    tu_reap_ok(rd, READERS);
    assert_int_equal(w->counter, (uint64_t)WRITERS * WORD_WRITES);
    report("words", &w->t);
    munmap(w, sizeof *w);
}

/* ---- rooms: a failure record rewritten by kvc_room_fail_adopt -------- */

#define ROOM 4242
#define ROOM_WRITES ((uint64_t)(20000 / scale))

struct rooms_arg {
    const char *name;
    struct tally *t;
};

/* The record of counter c: origin rank, code, time and reason all from c. */
static void room_reason(uint64_t c, char *buf, size_t cap)
{
    size_t want = 40 + c % 200; /* < cap */
    size_t i = (size_t)snprintf(buf, cap, "adopted %" PRIu64 ":", c);
    for (; i < want; i++)
        buf[i] = (char)('a' + (c + i) % 26);
    buf[i] = '\0';
}

static bool record_whole(const kvc_failure_info *f, struct tally *t, const char *where)
{
    uint64_t c = f->time_ns - 1;
    char want[KVC_REASON_MAX + 1];
    room_reason(c, want, sizeof want);
    if (f->room == ROOM && f->code == (int32_t)c && f->origin_rank == c % 64 &&
        !strcmp(f->reason, want))
        return true;
    note_bad(t, "%s: time %" PRIu64 ", code %d, origin rank %u, reason '%s'", where, f->time_ns,
             (int)f->code, f->origin_rank, f->reason);
    return false;
}

static void room_writer(int id, void *arg)
{
    struct rooms_arg *a = arg;
    kvc_segment *s = tu_open(a->name, KVC_OPEN_ATTACH, KVC_ROLE_CLIENT);
    char reason[KVC_REASON_MAX + 1];
    for (uint64_t k = 0; k < ROOM_WRITES; k++) {
        uint64_t c = 1 + (uint64_t)id + WRITERS * k;
        room_reason(c, reason, sizeof reason);
        if (kvc_room_fail_adopt(s, ROOM, (uint32_t)(c % 64), (int32_t)c, reason, c + 1, NULL))
            _exit(1);
    }
    atomic_fetch_sub(&a->t->writers_left, 1);
    kvc_close(s);
}

static void room_reader(int id, void *arg)
{
    (void)id;
    struct rooms_arg *a = arg;
    kvc_segment *s = tu_open(a->name, KVC_OPEN_ATTACH, KVC_ROLE_CLIENT);
    kvc_failure_info recent[8];
    for (uint64_t i = 0; atomic_load(&a->t->writers_left); i++) {
        kvc_room_info ri;
        kvc_err e = kvc_room_get(s, ROOM, -1, &ri);
        if (e == KVC_E_NOENT)
            continue;
        if (e)
            _exit(2);
        if (ri.has_failure && record_whole(&ri.failure, a->t, "kvc_room_get"))
            atomic_fetch_add(&a->t->accepted, 1);
        size_t n = 0;
        if (i % 8 == 0 && kvc_failures_recent(s, recent, 8, &n) == KVC_OK)
            for (size_t j = 0; j < n; j++)
                if (record_whole(&recent[j], a->t, "kvc_failures_recent"))
                    atomic_fetch_add(&a->t->accepted, 1);
    }
    kvc_close(s);
}

static void test_rooms(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_NONE);
    struct tally *t = shared_map(sizeof *t);
    atomic_store(&t->writers_left, WRITERS);
    struct rooms_arg a = {name, t};
    pid_t rd[READERS], wr[WRITERS];
    spawn(rd, READERS, room_reader, &a);
    spawn(wr, WRITERS, room_writer, &a);
    tu_reap_ok(wr, WRITERS);
    tu_reap_ok(rd, READERS);
    report("rooms", t);
    kvc_room_info ri;
    assert_int_equal(kvc_room_get(s, ROOM, -1, &ri), KVC_OK);
    assert_true(record_whole(&ri.failure, t, "final"));
    munmap(t, sizeof *t);
    kvc_close(s);
    kvc_unlink(name);
}

/* ---- ranks: registrations of one rank, blobs of varying size --------- */

#define RANK 5
#define RANK_WRITES ((uint64_t)(4000 / scale))

/* session_id and info of counter c; info is 20..~4000 bytes. */
static size_t rank_value(uint64_t c, char *sid, size_t sid_cap, char *info, size_t cap)
{
    snprintf(sid, sid_cap, "10.%u.%u.%u:%" PRIu64, (unsigned)(c % 251), (unsigned)(c % 241),
             (unsigned)(c % 239), 10000 + c % 50000);
    size_t pad = (c * 7919) % 4000;
    int n = snprintf(info, cap, "{\"c\":%" PRIu64 ",\"pad\":\"", c);
    size_t len = (size_t)n;
    for (size_t i = 0; i < pad && len + 3 < cap; i++)
        info[len++] = (char)('A' + (c + i) % 26);
    info[len++] = '"';
    info[len++] = '}';
    info[len] = '\0';
    return len;
}

static void rank_writer(int id, void *arg)
{
    struct rooms_arg *a = arg;
    kvc_segment *s = tu_open(a->name, KVC_OPEN_ATTACH, KVC_ROLE_CLIENT);
    char sid[64], info[4200];
    for (uint64_t k = 0; k < RANK_WRITES; k++) {
        uint64_t c = 1 + (uint64_t)id + WRITERS * k;
        size_t len = rank_value(c, sid, sizeof sid, info, sizeof info);
        if (kvc_rank_register(s, RANK, sid, info, len, NULL))
            _exit(1);
    }
    atomic_fetch_sub(&a->t->writers_left, 1);
    kvc_close(s);
}

static void rank_reader(int id, void *arg)
{
    (void)id;
    struct rooms_arg *a = arg;
    kvc_segment *s = tu_open(a->name, KVC_OPEN_ATTACH, KVC_ROLE_CLIENT);
    kvc_rank_info ri = {0};
    char sid[64], info[4200];
    while (atomic_load(&a->t->writers_left)) {
        kvc_err e = kvc_rank_lookup(s, RANK, &ri);
        if (e == KVC_E_NOENT)
            continue;
        if (e)
            _exit(2);
        uint64_t c = 0;
        if (sscanf(ri.info, "{\"c\":%" SCNu64, &c) != 1) {
            note_bad(a->t, "info does not start with its counter: %.60s", ri.info);
            continue;
        }
        size_t len = rank_value(c, sid, sizeof sid, info, sizeof info);
        if (strcmp(ri.session_id, sid) || ri.info_len != len || memcmp(ri.info, info, len))
            note_bad(a->t, "rank of counter %" PRIu64 ": session_id '%s' (want '%s'), %zu bytes", c,
                     ri.session_id, sid, ri.info_len);
        else
            atomic_fetch_add(&a->t->accepted, 1);
    }
    kvc_rank_info_free(&ri);
    kvc_close(s);
}

static void test_ranks(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *s = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_NONE);
    struct tally *t = shared_map(sizeof *t);
    atomic_store(&t->writers_left, WRITERS);
    struct rooms_arg a = {name, t};
    pid_t rd[READERS], wr[WRITERS];
    spawn(rd, READERS, rank_reader, &a);
    spawn(wr, WRITERS, rank_writer, &a);
    tu_reap_ok(wr, WRITERS);
    tu_reap_ok(rd, READERS);
    report("ranks", t);
    munmap(t, sizeof *t);
    kvc_close(s);
    kvc_unlink(name);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *sc = getenv("KVC_TEST_SCALE");
    if (sc && atoi(sc) > 0)
        scale = atoi(sc);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_words),
        cmocka_unit_test(test_rooms),
        cmocka_unit_test(test_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
