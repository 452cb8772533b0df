/*
 * clock.h - the project's two clocks, in one place for every unit.
 *
 * kvc__mono_ns: CLOCK_MONOTONIC nanoseconds, for every deadline, timeout
 * and age (immune to clock steps).  kvc__now_ns: CLOCK_REALTIME nanoseconds
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

#endif /* KVC_COMMON_CLOCK_H */
