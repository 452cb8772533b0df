/*
 * peers.c - connections per peer address (peers.h).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "peers.h"

int peers_init(struct peers *p, unsigned max_conns)
{
    uint32_t size = 16;
    while (size < 2u * max_conns + 2)
        size <<= 1;
    p->t = calloc(size, sizeof *p->t);
    p->mask = size - 1;
    p->used = 0;
    p->bytes = calloc(size, sizeof *p->bytes);
    p->free_recs = calloc(size, sizeof *p->free_recs);
    if (!p->t || !p->bytes || !p->free_recs) {
        peers_free(p);
        return -1;
    }
    for (p->nfree = 0; p->nfree < size; p->nfree++)
        p->free_recs[p->nfree] = size - 1 - p->nfree;
    return 0;
}

void peers_free(struct peers *p)
{
    free(p->t);
    free(p->bytes);
    free(p->free_recs);
    p->t = NULL;
    p->bytes = NULL;
    p->free_recs = NULL;
}

void peer_addr_of(int fd, struct peer_addr *a)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    memset(a, 0, sizeof *a);
    if (getpeername(fd, (struct sockaddr *)&ss, &len))
        return;
    if (ss.ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)&ss;
        a->a[10] = a->a[11] = 0xff;
        memcpy(a->a + 12, &in->sin_addr, 4);
        a->valid = 1;
    } else if (ss.ss_family == AF_INET6) {
        memcpy(a->a, &((const struct sockaddr_in6 *)&ss)->sin6_addr, 16);
        a->valid = 1;
    } else {
        return;
    }
    static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    static const uint8_t one6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    a->loopback = (!memcmp(a->a, v4mapped, 12) && a->a[12] == 127) || !memcmp(a->a, one6, 16);
}

const char *peer_addr_str(const struct peer_addr *a, char *buf, size_t cap)
{
    static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (!a->valid ||
        !(memcmp(a->a, v4mapped, 12) ? inet_ntop(AF_INET6, a->a, buf, (socklen_t)cap)
                                     : inet_ntop(AF_INET, a->a + 12, buf, (socklen_t)cap)))
        snprintf(buf, cap, "unknown");
    return buf;
}

/* FNV-1a of the 16 bytes. */
static uint32_t hash(const uint8_t *a)
{
    uint32_t h = 2166136261u;
    for (int i = 0; i < 16; i++)
        h = (h ^ a[i]) * 16777619u;
    return h;
}

/* The slot of a, or of the empty slot where it would go. */
static uint32_t find(const struct peers *p, const uint8_t *a)
{
    uint32_t i = hash(a) & p->mask;
    while (p->t[i].count && memcmp(p->t[i].a, a, 16))
        i = (i + 1) & p->mask;
    return i;
}

int peers_take(struct peers *p, const struct peer_addr *a, unsigned cap)
{
    uint32_t i = find(p, a->a);
    if (p->t[i].count >= cap)
        return 0;
    if (!p->t[i].count) {
        if (p->used + 1 > p->mask || !p->nfree) /* cannot happen: sized for every connection */
            return 0;
        memcpy(p->t[i].a, a->a, 16);
        p->t[i].rec = p->free_recs[--p->nfree];
        p->bytes[p->t[i].rec] = 0;
        p->used++;
    }
    p->t[i].count++;
    return 1;
}

unsigned peers_count(const struct peers *p, const struct peer_addr *a)
{
    return p->t[find(p, a->a)].count;
}

size_t *peers_bytes(const struct peers *p, const struct peer_addr *a)
{
    uint32_t i = find(p, a->a);
    return p->t[i].count ? &p->bytes[p->t[i].rec] : NULL;
}

void peers_put(struct peers *p, const struct peer_addr *a)
{
    uint32_t i = find(p, a->a);
    if (!p->t[i].count || --p->t[i].count)
        return;
    p->used--;
    p->free_recs[p->nfree++] = p->t[i].rec;
    /* Backward-shift deletion: move later entries of the run into the
     * hole when their home slot is at or before it. */
    for (uint32_t j = (i + 1) & p->mask; p->t[j].count; j = (j + 1) & p->mask) {
        uint32_t home = hash(p->t[j].a) & p->mask;
        if (((j - home) & p->mask) >= ((j - i) & p->mask)) {
            p->t[i] = p->t[j];
            p->t[j].count = 0;
            i = j;
        }
    }
}
