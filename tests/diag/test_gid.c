/* test_gid.c - one GID rule, two callers.  Every GID table below is fed to
 * the transfer engine's choice (kvt__verbs_gid_pick, what device setup
 * uses) and to `kvcoord-diag rdma`'s report of the port (diag_gid_port,
 * what the operator is told kvcoord uses); both must give the expected
 * index, and diag's JSON must carry the engine's reason.  The tables are
 * the ones real RoCE ports list: RoCEv1 entries first, a link-local RoCEv2
 * GID tying with a routable one, IPv4-mapped and global IPv6 addresses,
 * entries without a netdev, InfiniBand ports - and the three on which the
 * two used to disagree (issue 10): a port whose only RoCEv2 GID is
 * link-local, ::ffff:169.254.x.x next to a global IPv6 GID, and an
 * InfiniBand port whose index 0 is empty. */
#include <arpa/inet.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "diag.h"
#include "xfer_verbs.h"

static kvt__gid_entry gid(int index, const char *addr, int type, const char *netdev)
{
    kvt__gid_entry g;
    memset(&g, 0, sizeof g);
    g.index = index;
    g.type = type;
    snprintf(g.netdev, sizeof g.netdev, "%s", netdev);
    assert_int_equal(inet_pton(AF_INET6, addr, g.raw), 1);
    return g;
}

#define V1 KVT_GID_ROCE_V1
#define V2 KVT_GID_ROCE_V2
#define IB KVT_GID_IB

/* Both callers on table t; asserts they agree and returns the index, with
 * the engine's reason in why (and diag's reason checked equal to it). */
static int choose(const kvt__gid_entry *t, size_t n, int ib, char *why)
{
    kvt_options o;
    kvt_options_init(&o); /* no override: verbs_gid_index -1 */
    int engine = kvt__verbs_gid_pick(&o, t, n, ib, why, 512);
    json_t *port = json_object();
    int diag = diag_gid_port(port, t, n, ib);
    assert_int_equal(diag, engine);
    assert_int_equal(json_integer_value(json_object_get(port, "chosen_gid_index")), engine);
    assert_string_equal(json_string_value(json_object_get(port, "chosen_reason")), why);
    assert_int_equal(json_array_size(json_object_get(port, "gids")), n);
    json_decref(port);
    return engine;
}

/* The usual mlx5 RoCE table: v1 and v2 of the link-local address, then v1
 * and v2 of the IPv4 address. */
static void test_v1_first_and_link_local(void **st)
{
    (void)st;
    char why[512];
    kvt__gid_entry t[] = {gid(0, "fe80::1", V1, "eth0"), gid(1, "fe80::1", V2, "eth0"),
                          gid(2, "::ffff:10.0.0.5", V1, "eth0"),
                          gid(3, "::ffff:10.0.0.5", V2, "eth0")};
    assert_int_equal(choose(t, 4, 0, why), 3);
    assert_non_null(strstr(why, "RoCEv2 ::ffff:10.0.0.5 on eth0, IPv4-mapped routable"));
    assert_non_null(strstr(why, "2 RoCEv1"));
    assert_non_null(strstr(why, "1 link-local"));
}

static void test_link_local_never_wins_a_tie(void **st)
{
    (void)st;
    char why[512];
    kvt__gid_entry t[] = {gid(1, "fe80::2", V2, "eth1"), gid(3, "2001:db8::5", V2, "eth1")};
    assert_int_equal(choose(t, 2, 0, why), 3);
    assert_non_null(strstr(why, "2001:db8::5 on eth1, global IPv6"));
}

static void test_ipv4_mapped_before_ipv6_then_lowest_index(void **st)
{
    (void)st;
    char why[512];
    kvt__gid_entry t[] = {gid(2, "2001:db8::5", V2, "eth0"), gid(7, "::ffff:10.0.0.9", V2, "eth0"),
                          gid(5, "::ffff:10.0.0.5", V2, "eth0")};
    assert_int_equal(choose(t, 3, 0, why), 5);
    assert_non_null(strstr(why, "candidates: 2 IPv4-mapped routable, 1 global IPv6"));
}

/* Disagreement 1: the only RoCEv2 GID with a netdev is link-local.  The
 * engine uses it (a link-local GID works on one L2 segment), so diag must
 * say so rather than "none". */
static void test_only_link_local_is_chosen(void **st)
{
    (void)st;
    char why[512];
    kvt__gid_entry t[] = {gid(0, "::ffff:10.0.0.5", V2, ""), gid(1, "fe80::1", V2, "eth0")};
    assert_int_equal(choose(t, 2, 0, why), 1);
    assert_non_null(strstr(why, "fe80::1 on eth0, link-local"));
    assert_non_null(strstr(why, "1 without a netdev"));
    kvt__gid_entry only[] = {gid(4, "fe80::9", V2, "eth2")};
    assert_int_equal(choose(only, 1, 0, why), 4);
}

/* Disagreement 2: ::ffff:169.254.x.x is IPv4 link-local, ranked with
 * fe80::, below a global IPv6 GID (diag used to prefer it as IPv4-mapped). */
static void test_v4_link_local_below_global_v6(void **st)
{
    (void)st;
    char why[512];
    kvt__gid_entry t[] = {gid(1, "::ffff:169.254.3.4", V2, "eth0"),
                          gid(2, "2001:db8::7", V2, "eth0")};
    assert_int_equal(choose(t, 2, 0, why), 2);
    assert_non_null(strstr(why, "candidates: 1 global IPv6, 1 link-local"));
    kvt__gid_entry u[] = {gid(0, "fe80::1", V2, "eth0"), gid(1, "::ffff:169.254.3.4", V2, "eth0"),
                          gid(5, "::ffff:192.168.1.2", V2, "eth0")};
    assert_int_equal(choose(u, 3, 0, why), 5);
}

/* Disagreement 3: an InfiniBand port whose index 0 is empty: the lowest
 * valid index is used (diag used to insist on index 0). */
static void test_infiniband_lowest_valid_index(void **st)
{
    (void)st;
    char why[512];
    kvt__gid_entry t[] = {gid(0, "::", IB, ""), gid(1, "fe80::248a:703:49:b0a1", IB, "")};
    assert_int_equal(choose(t, 2, 1, why), 1);
    assert_non_null(strstr(why, "InfiniBand"));
    kvt__gid_entry u[] = {gid(1, "fe80::2", IB, ""), gid(0, "fe80::248a:703:49:b0a0", IB, "")};
    assert_int_equal(choose(u, 2, 1, why), 0);
    assert_int_equal(choose(u, 0, 1, why), -1);
    assert_non_null(strstr(why, "no valid GID on this InfiniBand port"));
}

static void test_no_candidate(void **st)
{
    (void)st;
    char why[512];
    kvt__gid_entry t[] = {gid(0, "::ffff:10.0.0.5", V2, ""), gid(1, "::ffff:10.0.0.5", V1, "eth0")};
    assert_int_equal(choose(t, 2, 0, why), -1);
    assert_non_null(strstr(why, "no RoCEv2 GID"));
    assert_non_null(strstr(why, "1 without a netdev"));
    assert_non_null(strstr(why, "1 RoCEv1"));
}

static void test_empty_and_zero(void **st)
{
    (void)st;
    char why[512];
    assert_int_equal(choose(NULL, 0, 0, why), -1);
    kvt__gid_entry t[] = {gid(0, "::", V2, "eth0")};
    assert_int_equal(choose(t, 1, 0, why), -1);
    assert_non_null(strstr(why, "1 zero"));
}

static void test_names_and_text(void **st)
{
    (void)st;
    char buf[64];
    assert_string_equal(kvt__gid_type_name(IB), "IB");
    assert_string_equal(kvt__gid_type_name(V1), "RoCEv1");
    assert_string_equal(kvt__gid_type_name(V2), "RoCEv2");
    assert_string_equal(kvt__gid_type_name(7), "unknown");
    kvt__gid_entry g = gid(0, "::ffff:10.1.2.3", V2, "eth0");
    kvt__gid_text(g.raw, buf, sizeof buf);
    assert_string_equal(buf, "::ffff:10.1.2.3");
    /* diag's table lists each entry with the engine's type names. */
    json_t *port = json_object();
    diag_gid_port(port, &g, 1, 0);
    json_t *e = json_array_get(json_object_get(port, "gids"), 0);
    assert_string_equal(json_string_value(json_object_get(e, "type")), "RoCEv2");
    assert_string_equal(json_string_value(json_object_get(e, "gid")), "::ffff:10.1.2.3");
    assert_string_equal(json_string_value(json_object_get(e, "netdev")), "eth0");
    json_decref(port);
}

/* The engine's override applies to the engine only (diag reports the
 * engine's default choice). */
static void test_engine_override(void **st)
{
    (void)st;
    char why[512];
    kvt__gid_entry t[] = {gid(0, "fe80::1", V1, "eth0"), gid(1, "::ffff:10.0.0.5", V2, "eth0")};
    kvt_options o;
    kvt_options_init(&o);
    o.verbs_gid_index = 0;
    assert_int_equal(kvt__verbs_gid_pick(&o, t, 2, 0, why, sizeof why), 0);
    assert_non_null(strstr(why, "override"));
    assert_int_equal(choose(t, 2, 0, why), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_v1_first_and_link_local),
        cmocka_unit_test(test_link_local_never_wins_a_tie),
        cmocka_unit_test(test_ipv4_mapped_before_ipv6_then_lowest_index),
        cmocka_unit_test(test_only_link_local_is_chosen),
        cmocka_unit_test(test_v4_link_local_below_global_v6),
        cmocka_unit_test(test_infiniband_lowest_valid_index),
        cmocka_unit_test(test_no_candidate),
        cmocka_unit_test(test_empty_and_zero),
        cmocka_unit_test(test_names_and_text),
        cmocka_unit_test(test_engine_override),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
