/* test_gid.c - the GID choice of `kvcoord-diag rdma` (tools/diag_gid.c),
 * on GID tables as real RoCE ports list them: RoCEv1 entries first, a
 * link-local RoCEv2 GID tying with a routable one, IPv4-mapped and global
 * IPv6 addresses, entries without a netdev, InfiniBand ports. */
#include <arpa/inet.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "diag.h"

static diag_gid gid(int index, const char *addr, diag_gid_type type, const char *netdev)
{
    diag_gid g;
    memset(&g, 0, sizeof g);
    g.index = index;
    g.type = type;
    snprintf(g.netdev, sizeof g.netdev, "%s", netdev);
    assert_int_equal(inet_pton(AF_INET6, addr, g.raw), 1);
    return g;
}

#define V1 DIAG_GID_ROCE_V1
#define V2 DIAG_GID_ROCE_V2

static int choose(const diag_gid *g, size_t n, int ib, char *why)
{
    return diag_gid_choose(g, n, ib, why, 384);
}

/* The usual mlx5 RoCE table: v1 and v2 of the link-local address, then v1
 * and v2 of the IPv4 address. */
static void test_v1_first_and_link_local(void **st)
{
    (void)st;
    char why[384];
    diag_gid t[] = {gid(0, "fe80::1", V1, "eth0"), gid(1, "fe80::1", V2, "eth0"),
                    gid(2, "::ffff:10.0.0.5", V1, "eth0"), gid(3, "::ffff:10.0.0.5", V2, "eth0")};
    assert_int_equal(choose(t, 4, 0, why), 3);
    assert_non_null(strstr(why, "IPv4-mapped ::ffff:10.0.0.5 on eth0"));
    assert_non_null(strstr(why, "2 RoCEv1"));
    assert_non_null(strstr(why, "1 link-local"));
}

static void test_link_local_never_wins_a_tie(void **st)
{
    (void)st;
    char why[384];
    diag_gid t[] = {gid(1, "fe80::2", V2, "eth1"), gid(3, "2001:db8::5", V2, "eth1")};
    assert_int_equal(choose(t, 2, 0, why), 3);
    assert_non_null(strstr(why, "routable IPv6 2001:db8::5"));
}

static void test_ipv4_mapped_before_ipv6_then_lowest_index(void **st)
{
    (void)st;
    char why[384];
    diag_gid t[] = {gid(2, "2001:db8::5", V2, "eth0"), gid(7, "::ffff:10.0.0.9", V2, "eth0"),
                    gid(5, "::ffff:10.0.0.5", V2, "eth0")};
    assert_int_equal(choose(t, 3, 0, why), 5);
    assert_non_null(strstr(why, "3 candidates"));
}

static void test_no_netdev_is_skipped(void **st)
{
    (void)st;
    char why[384];
    diag_gid t[] = {gid(0, "::ffff:10.0.0.5", V2, ""), gid(1, "fe80::1", V2, "eth0")};
    assert_int_equal(choose(t, 2, 0, why), -1);
    assert_non_null(strstr(why, "no RoCEv2 GID"));
    assert_non_null(strstr(why, "1 without a netdev"));
    assert_non_null(strstr(why, "1 link-local"));
}

static void test_empty_and_zero(void **st)
{
    (void)st;
    char why[384];
    assert_int_equal(choose(NULL, 0, 0, why), -1);
    diag_gid t[] = {gid(0, "::", V2, "eth0")};
    assert_int_equal(choose(t, 1, 0, why), -1);
}

static void test_infiniband_uses_index_0(void **st)
{
    (void)st;
    char why[384];
    diag_gid t[] = {gid(0, "fe80::248a:703:49:b0a0", V1, "")};
    assert_int_equal(choose(t, 1, 1, why), 0);
    assert_non_null(strstr(why, "InfiniBand"));
    assert_string_equal(diag_gid_type_name(V1, 1), "IB");
    assert_string_equal(diag_gid_type_name(V1, 0), "RoCEv1");
    assert_string_equal(diag_gid_type_name(V2, 0), "RoCEv2");
}

static void test_text(void **st)
{
    (void)st;
    char buf[64];
    diag_gid g = gid(0, "::ffff:10.1.2.3", V2, "eth0");
    assert_string_equal(diag_gid_text(g.raw, buf, sizeof buf), "::ffff:10.1.2.3");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_v1_first_and_link_local),
        cmocka_unit_test(test_link_local_never_wins_a_tie),
        cmocka_unit_test(test_ipv4_mapped_before_ipv6_then_lowest_index),
        cmocka_unit_test(test_no_netdev_is_skipped),
        cmocka_unit_test(test_empty_and_zero),
        cmocka_unit_test(test_infiniband_uses_index_0),
        cmocka_unit_test(test_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
