/*
 * pd_upkeep.c - see pd_upkeep.h.
 */
#include "pd_upkeep.h"

#include "clock.h"
#include "kvcoord/pd.h"
#include "log.h"

void pd_upkeep_run(struct pd_upkeep *u, kvc_segment *seg)
{
    size_t n = 0;
    if (kvc_pd_reap(seg, &n))
        log_event(LOG_WARN, "pd_reap_failed", "err=\"%s\"", kvc_last_error());
    else if (n)
        log_event(LOG_INFO, "pd_withdraw", "entries=%zu why=\"registering process ended\"", n);
    uint64_t interval = u->interval_ms ? u->interval_ms : PD_ROOM_INTERVAL_DEFAULT_S * 1000ull;
    uint64_t now = kvc__mono_ms();
    if (!u->next_sweep_ms)
        u->next_sweep_ms = now + interval;
    if (now < u->next_sweep_ms)
        return;
    u->next_sweep_ms = now + interval;
    if (kvc_pd_room_sweep(seg, interval, &n))
        log_event(LOG_WARN, "pd_room_sweep_failed", "err=\"%s\"", kvc_last_error());
    else if (n)
        log_event(LOG_DEBUG, "pd_room_sweep", "removed=%zu interval_ms=%llu", n,
                  (unsigned long long)interval);
}
