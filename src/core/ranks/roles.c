/*
 * roles.c - transfer-engine info under a role, and each rank's parallelism
 * config, keyed by (rank, role) (include/kvcoord/kvcoord.h, "Roles and
 * parallelism configs").
 *
 * The entries live in the rank tables of layout.h (table kind *
 * KVC_RANK_ROLES + role index) and are read and written by ranks.c's
 * entry-level calls; this file maps a role name to its index, claiming a
 * free index (under the ranks lock) the first time a registration uses it.
 * Readers never lock: a name is written before roles_used counts it, and
 * never changes afterwards.
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"

static bool is_default(const char *role)
{
    return !role || !*role || !strcmp(role, KVC_DEFAULT_ROLE);
}

KVC_API kvc_err kvc_role_check(const char *role)
{
    if (is_default(role))
        return KVC_OK;
    size_t n = strlen(role);
    if (n > KVC_ROLE_NAME_MAX)
        return kvc__fail(KVC_E_INVAL, "role name is %zu bytes; the limit is %d", n,
                         KVC_ROLE_NAME_MAX);
    for (const char *p = role; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '.' || *p == '_' || *p == '-'))
            return kvc__fail(KVC_E_INVAL, "role name has byte 0x%02x (allowed: [A-Za-z0-9._-])",
                             (unsigned char)*p);
    return KVC_OK;
}

/* Index of a role in use, or -1 (lock-free). */
static int find_role(const kvc_segment *seg, const char *role)
{
    if (is_default(role))
        return 0;
    uint32_t used = atomic_load_explicit(&seg->hdr->roles_used, memory_order_acquire);
    for (uint32_t i = 1; i < used && i < KVC_RANK_ROLES; i++)
        if (!strncmp(seg->hdr->role_names[i], role, KVC_ROLE_NAME_MAX + 1))
            return (int)i;
    return -1;
}

/* Index of role for reading: KVC_E_NOENT when no registration used it. */
static kvc_err role_for_read(const kvc_segment *seg, const char *role, unsigned *out)
{
    kvc_err e = kvc_role_check(role);
    if (e)
        return e;
    int i = find_role(seg, role);
    if (i < 0)
        return kvc__fail(KVC_E_NOENT, "no registration uses role '%s'", role);
    *out = (unsigned)i;
    return KVC_OK;
}

/* Index of role for writing, claiming a free one if new. */
static kvc_err role_for_write(kvc_segment *seg, const char *role, unsigned *out)
{
    kvc_err e = role_for_read(seg, role, out);
    if (e != KVC_E_NOENT)
        return e;
    if ((e = kvc__lock(seg, KVC_LOCK_RANKS)))
        return e;
    kvc_header *h = seg->hdr;
    int i = find_role(seg, role); /* claimed meanwhile? */
    uint32_t used = atomic_load(&h->roles_used);
    if (i < 0 && used < KVC_RANK_ROLES) {
        snprintf(h->role_names[used], sizeof h->role_names[used], "%s", role);
        atomic_store_explicit(&h->roles_used, used + 1, memory_order_release);
        i = (int)used;
    }
    kvc__unlock(seg, KVC_LOCK_RANKS);
    if (i < 0)
        return kvc__fail(KVC_E_FULL,
                         "segment %s keeps %d roles (%s, %s, %s, %s): role '%s' cannot be "
                         "added; a role's name stays taken while the segment lasts, even with "
                         "all its entries withdrawn: register under one of those, or start "
                         "kvcoordd with --fresh (a new segment: every registration is lost)",
                         seg->name, KVC_RANK_ROLES, h->role_names[0], h->role_names[1],
                         h->role_names[2], h->role_names[3], role);
    *out = (unsigned)i;
    return KVC_OK;
}

KVC_API kvc_err kvc_role_register(kvc_segment *seg, const char *role, uint32_t rank,
                                  const char *session_id, const char *info_json, size_t info_len,
                                  uint64_t *gen_out)
{
    unsigned i = 0; /* set by role_for_read/role_for_write on success */
    KVC_ARG(seg);
    if (is_default(role))
        return kvc_rank_register(seg, rank, session_id, info_json, info_len, gen_out);
    kvc_err e = role_for_write(seg, role, &i);
    return e ? e
             : kvc__entry_register(seg, i, rank, session_id, info_json, info_len, 0, 0, gen_out);
}

KVC_API kvc_err kvc_role_register_validated(kvc_segment *seg, const char *role, uint32_t rank,
                                            const char *session_id, const char *info_json,
                                            size_t info_len, uint32_t entries, uint64_t *gen_out)
{
    unsigned i = 0; /* set by role_for_read/role_for_write on success */
    KVC_ARG(seg);
    if (is_default(role))
        return kvc_rank_register_validated(seg, rank, session_id, info_json, info_len, entries,
                                           gen_out);
    kvc_err e = role_for_write(seg, role, &i);
    return e ? e
             : kvc__entry_register(seg, i, rank, session_id, info_json, info_len, 1, entries,
                                   gen_out);
}

KVC_API kvc_err kvc_role_lookup(kvc_segment *seg, const char *role, uint32_t rank,
                                kvc_rank_info *out)
{
    unsigned i = 0; /* set by role_for_read/role_for_write on success */
    KVC_ARG(seg);
    KVC_ARG(out);
    kvc_err e = role_for_read(seg, role, &i);
    return e ? e : kvc__entry_lookup(seg, i, rank, out);
}

KVC_API kvc_err kvc_role_withdraw(kvc_segment *seg, const char *role, uint32_t rank,
                                  const char *note)
{
    unsigned i = 0; /* set by role_for_read/role_for_write on success */
    KVC_ARG(seg);
    kvc_err e = role_for_read(seg, role, &i);
    return e ? e : kvc__entry_withdraw(seg, i, rank, note);
}

KVC_API kvc_err kvc_parallelism_register(kvc_segment *seg, const char *role, uint32_t rank,
                                         const char *config_json, size_t config_len,
                                         uint64_t *gen_out)
{
    unsigned i = 0; /* set by role_for_read/role_for_write on success */
    KVC_ARG(seg);
    KVC_ARG(config_json);
    kvc_err e = role_for_write(seg, role, &i);
    return e ? e
             : kvc__entry_register(seg, KVC_TABLE_PARALLELISM + i, rank, NULL, config_json,
                                   config_len, 0, 0, gen_out);
}

KVC_API kvc_err kvc_parallelism_lookup(kvc_segment *seg, const char *role, uint32_t rank,
                                       kvc_rank_info *out)
{
    unsigned i = 0; /* set by role_for_read/role_for_write on success */
    KVC_ARG(seg);
    KVC_ARG(out);
    kvc_err e = role_for_read(seg, role, &i);
    return e ? e : kvc__entry_lookup(seg, KVC_TABLE_PARALLELISM + i, rank, out);
}

KVC_API kvc_err kvc_role_register_mirror(kvc_segment *seg, const char *role, uint32_t rank,
                                         const char *session_id, const char *info_json,
                                         size_t info_len, const char *origin,
                                         uint64_t origin_generation, uint64_t expect_generation,
                                         uint64_t *gen_out)
{
    unsigned i = 0; /* set by role_for_write on success */
    KVC_ARG(seg);
    KVC_ARG(origin);
    kvc_err e = role_for_write(seg, role, &i);
    return e ? e
             : kvc__entry_register_mirror(seg, i, rank, session_id, info_json, info_len, origin,
                                          origin_generation, expect_generation, gen_out);
}

KVC_API kvc_err kvc_role_withdraw_mirror(kvc_segment *seg, const char *role, uint32_t rank,
                                         const char *note, uint64_t expect_generation)
{
    unsigned i = 0; /* set by role_for_read on success */
    KVC_ARG(seg);
    kvc_err e = role_for_read(seg, role, &i);
    return e ? e : kvc__entry_withdraw_mirror(seg, i, rank, note, expect_generation);
}

/* The entries of table kind (0: transfer-engine info, KVC_TABLE_PARALLELISM:
 * parallelism configs) under role; none for a role not in use.  The
 * caller checked its arguments. */
static kvc_err list_kind(kvc_segment *seg, unsigned kind, const char *role, kvc_rank_info *out,
                         size_t cap, size_t *count, int include_withdrawn)
{
    unsigned i = 0; /* set by role_for_read on success */
    kvc_err e = role_for_read(seg, role, &i);
    if (e == KVC_E_NOENT) {
        *count = 0;
        return KVC_OK;
    }
    return e ? e : kvc__entry_list(seg, kind + i, out, cap, count, include_withdrawn);
}

KVC_API kvc_err kvc_role_list(kvc_segment *seg, const char *role, kvc_rank_info *out, size_t cap,
                              size_t *count, int include_withdrawn)
{
    KVC_ARG(seg);
    KVC_ARG(count);
    if (cap)
        KVC_ARG(out);
    return list_kind(seg, 0, role, out, cap, count, include_withdrawn);
}

KVC_API kvc_err kvc_parallelism_register_mirror(kvc_segment *seg, const char *role, uint32_t rank,
                                                const char *config_json, size_t config_len,
                                                const char *origin, uint64_t origin_generation,
                                                uint64_t expect_generation, uint64_t *gen_out)
{
    unsigned i = 0; /* set by role_for_write on success */
    KVC_ARG(seg);
    KVC_ARG(config_json);
    KVC_ARG(origin);
    kvc_err e = role_for_write(seg, role, &i);
    return e ? e
             : kvc__entry_register_mirror(seg, KVC_TABLE_PARALLELISM + i, rank, NULL, config_json,
                                          config_len, origin, origin_generation, expect_generation,
                                          gen_out);
}

KVC_API kvc_err kvc_parallelism_withdraw_mirror(kvc_segment *seg, const char *role, uint32_t rank,
                                                const char *note, uint64_t expect_generation)
{
    unsigned i = 0; /* set by role_for_read on success */
    KVC_ARG(seg);
    kvc_err e = role_for_read(seg, role, &i);
    return e ? e
             : kvc__entry_withdraw_mirror(seg, KVC_TABLE_PARALLELISM + i, rank, note,
                                          expect_generation);
}

KVC_API kvc_err kvc_parallelism_list(kvc_segment *seg, const char *role, kvc_rank_info *out,
                                     size_t cap, size_t *count, int include_withdrawn)
{
    KVC_ARG(seg);
    KVC_ARG(count);
    if (cap)
        KVC_ARG(out);
    return list_kind(seg, KVC_TABLE_PARALLELISM, role, out, cap, count, include_withdrawn);
}

KVC_API kvc_err kvc_role_names(kvc_segment *seg, char (*names)[KVC_ROLE_NAME_MAX + 1], size_t cap,
                               size_t *count)
{
    KVC_ARG(seg);
    KVC_ARG(count);
    if (cap)
        KVC_ARG(names);
    uint32_t used = atomic_load_explicit(&seg->hdr->roles_used, memory_order_acquire);
    if (used > KVC_RANK_ROLES)
        used = KVC_RANK_ROLES;
    for (uint32_t i = 0; i < used && i < cap; i++)
        memcpy(names[i], seg->hdr->role_names[i], KVC_ROLE_NAME_MAX + 1);
    *count = used;
    return KVC_OK;
}
