/* test_segment.c - create, attach, validate, reuse and recreate segments. */
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "testutil.h"
#include "tu_probe.h"
#include "layout.h"

static void shm_path(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "/dev/shm/%s", name);
}

static void poke_u32(const char *name, size_t off, uint32_t v)
{
    char p[256];
    shm_path(p, sizeof p, name);
    int fd = open(p, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, &v, sizeof v, (off_t)off), sizeof v);
    close(fd);
}

static int count_segments(const char *prefix)
{
    DIR *d = opendir("/dev/shm");
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (!strncmp(de->d_name, prefix, strlen(prefix)))
            n++;
    closedir(d);
    return n;
}

static kvc_err try_open(const char *name, kvc_open_mode mode, kvc_segment **s)
{
    kvc_options o;
    kvc_options_init(&o);
    o.name = name;
    o.mode = mode;
    o.max_ranks = 16;
    o.arena_bytes = 4ull << 20;
    o.max_info_bytes = 1ull << 20;
    return kvc_open(&o, s);
}

static void test_create_attach_mode(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *a = tu_open(name, KVC_OPEN_FRESH, KVC_ROLE_DAEMON);
    char p[256];
    struct stat sb;
    shm_path(p, sizeof p, name);
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0600);
    kvc_segment *b = tu_open(name, KVC_OPEN_ATTACH, KVC_ROLE_WORKER);
    char *info = tu_info(3, 1);
    assert_int_equal(kvc_rank_register(b, 2, "127.0.0.1:16002", info, strlen(info), NULL), KVC_OK);
    kvc_rank_info ri = {0};
    assert_int_equal(kvc_rank_lookup(a, 2, &ri), KVC_OK);
    assert_string_equal(ri.info, info);
    assert_string_equal(ri.session_id, "127.0.0.1:16002");
    kvc_segment_info si;
    assert_int_equal(kvc_segment_stat(a, &si), KVC_OK);
    assert_int_equal(si.layout_version, KVC_LAYOUT_VERSION);
    assert_int_equal(si.max_ranks, 64);
    assert_int_equal(si.ranks_registered, 1);
    assert_int_equal(si.creator_pid, getpid());
    free(info);
    kvc_rank_info_free(&ri);
    kvc_close(b);
    kvc_close(a);
    kvc_unlink(name);
}

static void test_attach_missing_and_bad_names(void **st)
{
    (void)st;
    kvc_segment *s = NULL;
    assert_int_equal(try_open("kvctest-no-such-segment", KVC_OPEN_ATTACH, &s), KVC_E_NOENT);
    assert_non_null(strstr(kvc_last_error(), "kvctest-no-such-segment"));
    assert_null(s);
    const char *bad[] = {"", "a/b", "..", ".", "sp ace", "x\n", "-x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_int_equal(try_open(bad[i], KVC_OPEN_CREATE, &s), KVC_E_INVAL);
    char longname[KVC_NAME_MAX + 2];
    memset(longname, 'a', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    assert_int_equal(kvc_name_check(longname), KVC_E_INVAL);
    char buf[32];
    assert_int_equal(kvc_name_for_port(6789, buf, sizeof buf), KVC_OK);
    assert_string_equal(buf, "kvcoord-6789");
    assert_int_equal(kvc_name_for_port(6789, buf, 5), KVC_E_INVAL);
}

static void test_version_mismatch(void **st)
{
    (void)st;
    const char *name = tu_name();
    kvc_segment *a = NULL;
    assert_int_equal(try_open(name, KVC_OPEN_FRESH, &a), KVC_OK);
    poke_u32(name, offsetof(kvc_header, layout_version), 999);
    kvc_segment *b = NULL;
    assert_int_equal(try_open(name, KVC_OPEN_ATTACH, &b), KVC_E_VERSION);
    char want[128];
    snprintf(want, sizeof want, "layout version 999; this build of kvcoord uses layout version %u",
             KVC_LAYOUT_VERSION);
    assert_non_null(strstr(kvc_last_error(), want));
    /* Its creator (this process) is alive: CREATE must not destroy it. */
    assert_int_equal(try_open(name, KVC_OPEN_CREATE, &b), KVC_E_EXISTS);
    /* Creator dead: CREATE replaces it under the same name. */
    pid_t child = fork();
    if (child == 0)
        _exit(0);
    waitpid(child, NULL, 0);
    poke_u32(name, offsetof(kvc_header, creator_pid), (uint32_t)child);
    assert_int_equal(try_open(name, KVC_OPEN_CREATE, &b), KVC_OK);
    kvc_segment_info si;
    kvc_segment_stat(b, &si);
    assert_int_equal(si.layout_version, KVC_LAYOUT_VERSION);
    kvc_close(b);
    kvc_close(a);
    kvc_unlink(name);
}

static void test_truncated_and_garbage(void **st)
{
    (void)st;
    const char *name = tu_name();
    char p[256];
    shm_path(p, sizeof p, name);
    kvc_segment *a = NULL, *b = NULL;
    assert_int_equal(try_open(name, KVC_OPEN_FRESH, &a), KVC_OK);
    kvc_close(a);
    assert_int_equal(truncate(p, 8192), 0);
    assert_int_equal(try_open(name, KVC_OPEN_ATTACH, &b), KVC_E_CORRUPT);
    assert_non_null(strstr(kvc_last_error(), "truncated"));
    assert_int_equal(truncate(p, 10), 0);
    assert_int_equal(try_open(name, KVC_OPEN_ATTACH, &b), KVC_E_CORRUPT);
    assert_int_equal(try_open(name, KVC_OPEN_CREATE, &b), KVC_OK); /* recreated */
    kvc_close(b);
    poke_u32(name, 0, 0xdeadbeef); /* magic */
    assert_int_equal(try_open(name, KVC_OPEN_ATTACH, &b), KVC_E_CORRUPT);
    assert_int_equal(try_open(name, KVC_OPEN_CREATE, &b), KVC_OK);
    kvc_close(b);
    assert_int_equal(try_open(name, KVC_OPEN_ATTACH, &b), KVC_OK);
    kvc_close(b);
    kvc_unlink(name);
}

static void test_reuse_survives_restart(void **st)
{
    (void)st;
    const char *name = tu_name();
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s", name);
    for (int round = 0; round < 5; round++) {
        kvc_segment *s = NULL;
        assert_int_equal(try_open(name, KVC_OPEN_CREATE, &s), KVC_OK);
        kvc_rank_info ri = {0};
        if (round == 0) {
            assert_int_equal(kvc_rank_lookup(s, 1, &ri), KVC_E_NOENT);
            assert_int_equal(kvc_rank_register(s, 1, "[2001:db8::1]:16051", "{}", 2, NULL), KVC_OK);
        } else {
            assert_int_equal(kvc_rank_lookup(s, 1, &ri), KVC_OK);
            assert_string_equal(ri.session_id, "[2001:db8::1]:16051");
            assert_int_equal(ri.generation, 1);
        }
        kvc_rank_info_free(&ri);
        kvc_close(s);
        assert_int_equal(count_segments(prefix), 1);
    }
    /* FRESH discards what was there. */
    kvc_segment *s = NULL;
    assert_int_equal(try_open(name, KVC_OPEN_FRESH, &s), KVC_OK);
    kvc_rank_info ri = {0};
    assert_int_equal(kvc_rank_lookup(s, 1, &ri), KVC_E_NOENT);
    kvc_close(s);
    assert_int_equal(count_segments(prefix), 1);
    kvc_unlink(name);
    assert_int_equal(count_segments(prefix), 0);
}

static void test_fresh_refuses_a_live_segment(void **st)
{
    (void)st;
    /* The creator is known alive by the start time it recorded itself. */
    TU_SKIP_UNLESS(tu_probe_self_stat());
    const char *name = tu_name();
    int ready[2], stop[2];
    assert_int_equal(pipe(ready), 0);
    assert_int_equal(pipe(stop), 0);
    pid_t child = fork();
    if (child == 0) { /* another process creates the segment and stays */
        kvc_segment *c = NULL;
        char ch;
        close(stop[1]);
        if (try_open(name, KVC_OPEN_FRESH, &c) || write(ready[1], "r", 1) != 1)
            _exit(1);
        (void)!read(stop[0], &ch, 1);
        kvc_close(c);
        _exit(0);
    }
    char ch;
    assert_int_equal(read(ready[0], &ch, 1), 1);
    kvc_segment *s = NULL;
    assert_int_equal(try_open(name, KVC_OPEN_FRESH, &s), KVC_E_EXISTS);
    assert_non_null(strstr(kvc_last_error(), "is running"));
    assert_int_equal(try_open(name, KVC_OPEN_ATTACH, &s), KVC_OK); /* still there */
    kvc_close(s);
    close(stop[1]);
    assert_int_equal(waitpid(child, NULL, 0), child);
    assert_int_equal(try_open(name, KVC_OPEN_FRESH, &s), KVC_OK); /* creator gone */
    kvc_close(s);
    kvc_unlink(name);
}

static void test_bad_capacities(void **st)
{
    (void)st;
    kvc_options o;
    kvc_options_init(&o);
    o.name = tu_name();
    o.mode = KVC_OPEN_FRESH;
    kvc_segment *s = NULL;
    o.max_ranks = 0;
    assert_int_equal(kvc_open(&o, &s), KVC_E_INVAL);
    kvc_options_init(&o);
    o.name = tu_name();
    o.mode = KVC_OPEN_FRESH;
    o.arena_bytes = 1 << 20;
    o.max_info_bytes = 1 << 20; /* more than half the arena */
    assert_int_equal(kvc_open(&o, &s), KVC_E_INVAL);
    assert_non_null(strstr(kvc_last_error(), "max info bytes"));
    assert_int_equal(kvc_open(NULL, &s), KVC_E_INVAL);
    /* CREATE over a valid segment reuses it whatever the capacities say;
     * they only matter (and are refused) when it has to be created. */
    const char *name = tu_name();
    assert_int_equal(try_open(name, KVC_OPEN_FRESH, &s), KVC_OK);
    kvc_options_init(&o);
    o.name = name;
    o.mode = KVC_OPEN_CREATE;
    o.arena_bytes = 1 << 20; /* less than twice the default max info bytes */
    kvc_segment *t = NULL;
    assert_int_equal(kvc_open(&o, &t), KVC_OK);
    kvc_close(t);
    kvc_close(s);
    kvc_unlink(name);
    assert_int_equal(kvc_open(&o, &t), KVC_E_INVAL);
    assert_non_null(strstr(kvc_last_error(), "max info bytes"));
}

static void test_strerror(void **st)
{
    (void)st;
    for (int e = 0; e <= KVC_E_EXISTS; e++)
        assert_true(strlen(kvc_strerror((kvc_err)e)) > 0);
    assert_string_equal(kvc_strerror((kvc_err)12345), "unknown error");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_attach_mode),
        cmocka_unit_test(test_attach_missing_and_bad_names),
        cmocka_unit_test(test_version_mismatch),
        cmocka_unit_test(test_truncated_and_garbage),
        cmocka_unit_test(test_reuse_survives_restart),
        cmocka_unit_test(test_fresh_refuses_a_live_segment),
        cmocka_unit_test(test_bad_capacities),
        cmocka_unit_test(test_strerror),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
