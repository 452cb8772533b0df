/* testutil.h - helpers shared by the library's cmocka tests. */
#ifndef KVC_TESTUTIL_H
#define KVC_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvcoord/kvcoord.h"

/* A segment name unique to this process and call; stays valid for the
 * next 63 calls (a ring of buffers), so no test needs to copy it. */
static inline const char *tu_name(void)
{
    static char buf[64][48];
    static int n;
    char *b = buf[n % 64];
    snprintf(b, sizeof buf[0], "kvctest-%d-%d", (int)getpid(), n);
    n++;
    return b;
}

/* Options for name with mode, role and small capacities suited to tests
 * (64 ranks, a 64 MiB arena, 8 MiB per rank); a test changes what it needs
 * and opens with tu_open_with(). */
static inline kvc_options tu_options(const char *name, kvc_open_mode mode, kvc_role role)
{
    kvc_options o;
    kvc_options_init(&o);
    o.name = name;
    o.mode = mode;
    o.role = role;
    o.max_ranks = 64;
    o.arena_bytes = 64ull << 20;
    o.max_info_bytes = 8ull << 20;
    return o;
}

/* kvc_open(o); a failure fails the test, naming the segment and the error. */
static inline kvc_segment *tu_open_with(const kvc_options *o)
{
    kvc_segment *s = NULL;
    kvc_err e = kvc_open(o, &s);
    if (e)
        fail_msg("kvc_open(%s): %s: %s", o->name, kvc_strerror(e), kvc_last_error());
    return s;
}

/* Open name with mode and tu_options()' capacities. */
static inline kvc_segment *tu_open(const char *name, kvc_open_mode mode, kvc_role role)
{
    kvc_options o = tu_options(name, mode, role);
    return tu_open_with(&o);
}

/* A weights_info_dict-shaped JSON object of n entries, tagged with tag. */
static inline char *tu_info(int n, unsigned tag)
{
    size_t cap = (size_t)n * 96 + 16;
    char *s = malloc(cap);
    size_t len = 0;
    s[len++] = '{';
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(s + len, cap - len, "%s\"model.layers.%d.w%u\":[%llu,%d,2]",
                                i ? "," : "", i, tag,
                                0x7f0000000000ull + (unsigned long long)i * 256, 4096 + (int)tag);
    s[len++] = '}';
    s[len] = '\0';
    return s;
}

#endif
