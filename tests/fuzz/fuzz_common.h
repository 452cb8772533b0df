/*
 * fuzz_common.h - shared by the fuzz targets: one segment per process
 * (unique name, unlinked from /dev/shm as soon as it is mapped), the checks
 * every target makes, and the libFuzzer entry point's declaration.
 *
 * A target defines LLVMFuzzerTestOneInput().  Under -DKVCOORD_FUZZ=ON it is
 * linked with libFuzzer (-fsanitize=fuzzer); in every other build it is
 * linked with replay.c, which runs the checked-in corpus through it.
 *
 * The segment is created on the first input and kept for the whole run
 * (creating one per input would cost more than the input).  An input can
 * therefore see ranks earlier inputs registered; the checks never depend on
 * that, so a crash still reproduces from its input alone.
 */
#ifndef KVC_FUZZ_COMMON_H
#define KVC_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "kvcoord/kvcoord.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A broken invariant: say which, then abort (libFuzzer saves the input;
 * replay fails the test). */
#define FZ_CHECK(cond, ...)                                                              \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "%s:%d: invariant failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                                \
            fputc('\n', stderr);                                                         \
            abort();                                                                     \
        }                                                                                \
    } while (0)

/* Whether s[0..n) is valid UTF-8 (RFC 3629: no overlongs, no surrogates,
 * nothing past U+10FFFF).  JSON bodies must be (RFC 8259 section 8.1). */
static inline int fz_utf8_valid(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t k;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xc2 && c <= 0xdf) {
            k = 1, cp = c & 0x1f;
        } else if (c >= 0xe0 && c <= 0xef) {
            k = 2, cp = c & 0x0f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            k = 3, cp = c & 0x07;
        } else {
            return 0;
        }
        if (n - i <= k)
            return 0;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xc0) != 0x80)
                return 0;
            cp = (cp << 6) | (s[i + j] & 0x3f);
        }
        if ((k == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
            (k == 3 && (cp < 0x10000 || cp > 0x10ffff)))
            return 0;
        i += k + 1;
    }
    return 1;
}

/* KVC_FUZZ_SKIP_UTF8=1: do not fail on an answer body that is not valid
 * UTF-8 (a known, reported bug), so a long run can look for others. */
static inline int fz_check_utf8(void)
{
    const char *v = getenv("KVC_FUZZ_SKIP_UTF8");
    return !(v && *v == '1');
}

/* Small capacities: registrations cannot grow the segment without bound
 * (ranks >= FZ_MAX_RANKS are refused by the library). */
#define FZ_MAX_RANKS 64
#define FZ_MAX_INFO (1u << 20)

static kvc_segment *fz_seg __attribute__((unused));
static char fz_seg_name[64] __attribute__((unused));
/* Run at exit before the segment is closed (free what uses it). */
static void (*fz_before_close)(void) __attribute__((unused));

static inline void fz_cleanup(void)
{
    if (fz_before_close)
        fz_before_close();
    if (fz_seg) {
        kvc_close(fz_seg);
        fz_seg = NULL;
        kvc_unlink(fz_seg_name);
    }
}

/* The process's segment, created on first use (tag names the target). */
static inline kvc_segment *fz_segment(const char *tag)
{
    if (fz_seg)
        return fz_seg;
    snprintf(fz_seg_name, sizeof fz_seg_name, "kvcfuzz-%s-%d", tag, (int)getpid());
    kvc_options o;
    kvc_options_init(&o);
    o.name = fz_seg_name;
    o.mode = KVC_OPEN_FRESH;
    o.role = KVC_ROLE_NONE;
    o.max_ranks = FZ_MAX_RANKS;
    o.max_info_bytes = FZ_MAX_INFO;
    o.arena_bytes = 64ull << 20;
    o.max_procs = 16;
    o.max_rooms = 64;
    kvc_err e = kvc_open(&o, &fz_seg);
    if (e) {
        fprintf(stderr, "fuzz: kvc_open(%s): %s: %s\n", fz_seg_name, kvc_strerror(e),
                kvc_last_error());
        exit(1);
    }
    /* Unlinked at exit, not at once: an unlinked segment refuses every
     * change (KVC_E_STALE), which would leave the mutating paths unfuzzed.
     * A crashing input (abort, no atexit) leaves its small segment in
     * /dev/shm (kvcfuzz-TAG-PID; the next run's FRESH open of another pid
     * does not touch it): `rm /dev/shm/kvcfuzz-*` clears them. */
    atexit(fz_cleanup);
    return fz_seg;
}

#endif /* KVC_FUZZ_COMMON_H */
