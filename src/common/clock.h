/*
 * clock.h - the project's two clocks, in one place for every unit.
 *
 * kvc__mono_ns (and _us, _ms): CLOCK_MONOTONIC, for every deadline,
 * timeout, age and measured duration (immune to clock steps).  kvc__now_ns: CLOCK_REALTIME nanoseconds
 * since the Unix epoch, only for timestamps shown to people (failure
 * record times, "changed at").  Header-only: each unit inlines them, so no
 * symbol crosses a library boundary.  Thread- and async-signal-safe.
 */
#ifndef KVC_COMMON_CLOCK_H
#define KVC_COMMON_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t kvc__clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t kvc__now_ns(void) { return kvc__clock_ns(CLOCK_REALTIME); }
static inline uint64_t kvc__mono_ns(void) { return kvc__clock_ns(CLOCK_MONOTONIC); }
/* The same monotonic clock in coarser units (truncated). */
static inline uint64_t kvc__mono_us(void) { return kvc__mono_ns() / 1000u; }
static inline uint64_t kvc__mono_ms(void) { return kvc__mono_ns() / 1000000u; }

/* The same two clocks at the kernel tick's resolution (a few ms), for what
 * is ms-scale and read on every call of a hot path (room TTLs, liveness
 * re-check intervals, "updated" times of rooms): a fifth of the cost of a
 * precise read here.  Never for a deadline shorter than 10 ms. */
static inline uint64_t kvc__now_coarse_ns(void) { return kvc__clock_ns(CLOCK_REALTIME_COARSE); }
static inline uint64_t kvc__mono_coarse_ns(void) { return kvc__clock_ns(CLOCK_MONOTONIC_COARSE); }

#endif /* KVC_COMMON_CLOCK_H */
