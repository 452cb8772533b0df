/* test_xfer_verbs.c - the verbs backend without a device (explicit error;
 * auto picks TCP with one log line), GID selection rules on recorded GID
 * tables, registration errors naming their cause and RLIMIT_MEMLOCK. */
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <sys/mman.h>

#include "testutil.h"
#include "xfer_gid.h"
#include "xfer_internal.h"

static int ndevices(void)
{
    int n = 0;
    struct ibv_device **l = ibv_get_device_list(&n);
    if (l)
        ibv_free_device_list(l);
    return l ? n : 0;
}

static char logged[8][512];
static int nlogged;
static void cap_log(void *ctx, int level, const char *msg)
{
    (void)ctx;
    (void)level;
    if (nlogged < 8)
        snprintf(logged[nlogged++], sizeof logged[0], "%s", msg);
}

static void test_verbs_without_device(void **state)
{
    (void)state;
    if (ndevices() > 0)
        skip();
    kvt_options o;
    kvt_options_init(&o);
    o.backend = KVT_BACKEND_VERBS;
    kvt_engine *e = NULL;
    assert_int_equal(kvt_engine_create(&o, &e), KVC_E_NOENT);
    assert_null(e);
    assert_non_null(strstr(kvc_last_error(), "verbs backend unavailable"));
    assert_true(strstr(kvc_last_error(), "no RDMA device") ||
                strstr(kvc_last_error(), "ibv_get_device_list"));
    o.verbs_device = "mlx5_7";
    assert_int_equal(kvt_engine_create(&o, &e), KVC_E_NOENT);
}

static void test_auto_picks_tcp(void **state)
{
    (void)state;
    if (ndevices() > 0)
        skip();
    kvt_options o;
    kvt_options_init(&o);
    o.log = cap_log;
    nlogged = 0;
    kvt_engine *e = NULL;
    assert_int_equal(kvt_engine_create(&o, &e), KVC_OK);
    assert_int_equal(kvt_engine_backend(e), KVT_BACKEND_TCP);
    int lines = 0;
    for (int i = 0; i < nlogged; i++)
        if (strstr(logged[i], "transfer backend: tcp (auto: "))
            lines++;
    assert_int_equal(lines, 1);
    char *d;
    assert_int_equal(kvt_descriptor_export(e, &d), KVC_OK);
    assert_non_null(strstr(d, "\"backend\":\"tcp\""));
    assert_null(strstr(d, "\"verbs\""));
    free(d);
    kvt_engine_destroy(e);
}

static void test_backend_names(void **state)
{
    (void)state;
    kvt_backend b;
    assert_int_equal(kvt_backend_parse("verbs", &b), KVC_OK);
    assert_int_equal(b, KVT_BACKEND_VERBS);
    assert_int_equal(kvt_backend_parse("rdma", &b), KVC_E_INVAL);
    assert_string_equal(kvt_backend_name(KVT_BACKEND_AUTO), "auto");
}

/* ---- GID rules on recorded tables --------------------------------------------------- */

static kvt__gid_entry G(int idx, const char *addr, int type, const char *netdev)
{
    kvt__gid_entry g;
    memset(&g, 0, sizeof g);
    g.index = idx;
    g.type = type;
    if (addr)
        inet_pton(AF_INET6, addr, g.raw);
    snprintf(g.netdev, sizeof g.netdev, "%s", netdev);
    return g;
}

static int choose(const kvt__gid_entry *t, size_t n, int ib, int ov, char *why)
{
    return kvt__gid_choose(t, n, ib, ov, why, 200);
}

/* A typical mlx5 RoCE port: v1/v2 pairs per address. */
static void test_gid_typical(void **state)
{
    (void)state;
    kvt__gid_entry t[] = {
        G(0, "fe80::5054:ff:fe12:3456", KVT_GID_ROCE_V1, "eth0"),
        G(1, "fe80::5054:ff:fe12:3456", KVT_GID_ROCE_V2, "eth0"),
        G(2, "::ffff:10.0.0.5", KVT_GID_ROCE_V1, "eth0"),
        G(3, "::ffff:10.0.0.5", KVT_GID_ROCE_V2, "eth0"),
    };
    char why[200];
    assert_int_equal(choose(t, 4, 0, -1, why), 3);
    assert_non_null(strstr(why, "GID index 3"));
    assert_non_null(strstr(why, "IPv4-mapped routable"));
    assert_non_null(strstr(why, "eth0"));
}

static void test_gid_v1_first(void **state)
{
    (void)state;
    kvt__gid_entry t[] = {
        G(0, "::ffff:10.0.0.5", KVT_GID_ROCE_V1, "eth0"),
        G(1, "fe80::1", KVT_GID_ROCE_V2, "eth0"),
    };
    char why[200];
    assert_int_equal(choose(t, 2, 0, -1, why), 1); /* v1 never, even routable */
}

static void test_gid_link_local_tie(void **state)
{
    (void)state;
    kvt__gid_entry t[] = {
        G(0, "fe80::1", KVT_GID_ROCE_V2, "eth0"),
        G(1, "::ffff:169.254.3.4", KVT_GID_ROCE_V2, "eth0"),
        G(5, "::ffff:192.168.1.2", KVT_GID_ROCE_V2, "eth0"),
    };
    char why[200];
    assert_int_equal(choose(t, 3, 0, -1, why), 5);
}

static void test_gid_netdev_and_zero(void **state)
{
    (void)state;
    kvt__gid_entry t[] = {
        G(0, NULL, KVT_GID_ROCE_V2, "eth0"),              /* zero GID */
        G(2, "::ffff:10.0.0.9", KVT_GID_ROCE_V2, ""),     /* no netdev: stale */
        G(3, "2001:db8::7", KVT_GID_ROCE_V2, "eth1"),     /* global IPv6 */
        G(4, "::ffff:10.0.0.7", KVT_GID_ROCE_V2, "eth1"), /* IPv4-mapped */
    };
    char why[200];
    assert_int_equal(choose(t, 4, 0, -1, why), 4);
    assert_int_equal(choose(t, 3, 0, -1, why), 3); /* without idx 4: global IPv6 */
    assert_int_equal(choose(t, 2, 0, -1, why), -1);
    assert_non_null(strstr(why, "no RoCEv2 GID attached to a netdev"));
}

static void test_gid_override(void **state)
{
    (void)state;
    kvt__gid_entry t[] = {
        G(0, "fe80::1", KVT_GID_ROCE_V1, "eth0"),
        G(1, "::ffff:10.0.0.5", KVT_GID_ROCE_V2, "eth0"),
        G(2, NULL, KVT_GID_ROCE_V2, "eth0"),
    };
    char why[200];
    assert_int_equal(choose(t, 3, 0, 0, why), 0);
    assert_non_null(strstr(why, "override"));
    assert_int_equal(choose(t, 3, 0, 2, why), -1); /* zero GID */
    assert_non_null(strstr(why, "GID index 2 (override) is not a valid GID"));
    assert_int_equal(choose(t, 3, 0, 9, why), -1); /* absent */
}

static void test_gid_infiniband(void **state)
{
    (void)state;
    kvt__gid_entry t[] = {
        G(1, "fe80::2", KVT_GID_IB, ""),
        G(0, "fe80::1", KVT_GID_IB, ""),
    };
    char why[200];
    assert_int_equal(choose(t, 2, 1, -1, why), 0);
    assert_int_equal(choose(t, 0, 1, -1, why), -1);
}

/* ---- registration errors ------------------------------------------------------------- */

static void test_register_errors(void **state)
{
    (void)state;
    kvt_options o;
    kvt_options_init(&o);
    o.backend = KVT_BACKEND_TCP;
    kvt_engine *e;
    assert_int_equal(kvt_engine_create(&o, &e), KVC_OK);
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    char *p = mmap(NULL, 4 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    munmap(p + 2 * pg, pg); /* a hole */
    assert_int_equal(kvt_mr_register(e, p, 4 * pg, NULL), KVC_E_SYS);
    assert_non_null(strstr(kvc_last_error(), "range not mapped"));
    assert_int_equal(kvt_mr_register(e, p + 1, pg, NULL), KVC_OK);        /* unaligned is fine */
    assert_int_equal(kvt_mr_register(e, p + 100, 10, NULL), KVC_E_INVAL); /* overlap */
    assert_non_null(strstr(kvc_last_error(), "overlaps"));
    assert_int_equal(kvt_mr_register(e, p, 0, NULL), KVC_E_INVAL);
    assert_int_equal(kvt_mr_deregister(e, p + 1), KVC_OK);
    assert_int_equal(kvt_mr_deregister(e, p + 1), KVC_E_NOENT);
    kvt_engine_destroy(e);
    munmap(p, 2 * pg);
    munmap(p + 3 * pg, pg);
    /* What ibv_reg_mr's ENOMEM looks like: names RLIMIT_MEMLOCK's limits. */
    assert_int_equal(kvt__reg_error(ENOMEM, 0x1000, 1ull << 40, "ibv_reg_mr"), KVC_E_SYS);
    assert_non_null(strstr(kvc_last_error(), "RLIMIT_MEMLOCK soft"));
    assert_non_null(strstr(kvc_last_error(), "hard"));
    assert_non_null(strstr(kvc_last_error(), "ibv_reg_mr"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_verbs_without_device), cmocka_unit_test(test_auto_picks_tcp),
        cmocka_unit_test(test_backend_names),        cmocka_unit_test(test_gid_typical),
        cmocka_unit_test(test_gid_v1_first),         cmocka_unit_test(test_gid_link_local_tie),
        cmocka_unit_test(test_gid_netdev_and_zero),  cmocka_unit_test(test_gid_override),
        cmocka_unit_test(test_gid_infiniband),       cmocka_unit_test(test_register_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
