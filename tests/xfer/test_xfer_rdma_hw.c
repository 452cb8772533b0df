/* test_xfer_rdma_hw.c - runs only where ibv_get_device_list() finds an
 * RDMA device; elsewhere it says why and exits 77 (ctest: skipped).
 * With a device: a verbs engine opens it, registers memory (a real MR:
 * the descriptor carries its rkey and the chosen GID), and two verbs
 * engines in one process move 8 MiB by RDMA WRITE (RC QPs set up over the
 * control channel, one TCP connection; the end-of-room SEND makes the room
 * Success on both sides), verified byte for byte; 2048 scattered 2 KiB
 * runs in a second room (more than one send queue's worth), the same
 * scattered runs read back by RDMA READ; then the receiver is destroyed
 * and the next room fails on the sender, naming the peer. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xfer_util.h"

static void log_line(void *ctx, int level, const char *msg)
{
    (void)ctx;
    (void)level;
    printf("  log: %s\n", msg);
}

int main(void)
{
    int n = 0;
    errno = 0;
    struct ibv_device **l = ibv_get_device_list(&n);
    if (!l || n == 0) {
        printf("SKIP: no RDMA device found by ibv_get_device_list (%s); the verbs hardware test "
               "needs one\n",
               l ? "device list empty" : strerror(errno));
        if (l)
            ibv_free_device_list(l);
        return 77;
    }
    ibv_free_device_list(l);
    kvt_options o;
    kvt_options_init(&o);
    o.backend = KVT_BACKEND_VERBS;
    o.log = log_line;
    kvt_engine *a, *b;
    if (kvt_engine_create(&o, &a) || kvt_engine_create(&o, &b)) {
        printf("FAIL: verbs engine: %s\n", kvc_last_error());
        return 1;
    }
    size_t len = 8u << 20;
    unsigned char *src = xu_map(len), *dst = xu_map(len);
    xu_fill(src, len, 1);
    char *d;
    kvt_peer *p;
    if (kvt_mr_register(a, src, len, NULL) || kvt_mr_register(b, dst, len, NULL) ||
        kvt_descriptor_export(b, &d) || kvt_peer_import(a, d, strlen(d), &p)) {
        printf("FAIL: setup: %s\n", kvc_last_error());
        return 1;
    }
    printf("descriptor: %s\n", d);
    if (!strstr(d, "\"verbs\"")) {
        printf("FAIL: descriptor lacks the verbs section\n");
        return 1;
    }
    kvt_run run = {(uint64_t)(uintptr_t)src, (uint64_t)(uintptr_t)dst, len};
    if (kvt_submit(a, p, 1, &run, 1, 0)) {
        printf("FAIL: submit: %s\n", kvc_last_error());
        return 1;
    }
    int ok = 0, rok = 0;
    for (int i = 0; i < 400 && (!ok || !rok); i++) {
        kvt_event ev[4];
        size_t k;
        kvt_progress(b, 0, ev, 4, &k);
        for (size_t j = 0; j < k; j++)
            rok = ev[j].state == KVC_POLL_SUCCESS ? 1 : -1;
        kvt_progress(a, 25, ev, 4, &k);
        for (size_t j = 0; j < k; j++) {
            ok = ev[j].state == KVC_POLL_SUCCESS ? 1 : -1;
            if (ok != 1)
                printf("sender room failed: %s\n", ev[j].reason);
        }
    }
    if (ok != 1 || rok != 1 || memcmp(src, dst, len)) {
        printf("FAIL: transfer did not complete (sender %d, receiver %d) or bytes differ\n", ok,
               rok);
        return 1;
    }
    kvt_peer_info pi;
    kvt_peer_stat(a, p, &pi);
    printf("peer: %u connection(s) up, %llu bytes acknowledged\n", pi.conns_up,
           (unsigned long long)pi.bytes_sent);
    if (pi.conns_up != 1) {
        printf("FAIL: expected only the control connection (RDMA data path), got %u\n",
               pi.conns_up);
        return 1;
    }
    /* Scattered pages: 2048 runs of 2 KiB (more than a send queue holds,
     * so the backlog is posted as completions free room), reversed order
     * on the far side. */
    xu_fill(src, len, 2);
    enum { NR = 2048, RL = 2048, STRIDE = 4096 };
    kvt_run *runs = calloc(NR, sizeof *runs);
    for (uint64_t i = 0; i < NR; i++)
        runs[i] = (kvt_run){(uint64_t)(uintptr_t)src + i * STRIDE,
                            (uint64_t)(uintptr_t)dst + (NR - 1 - i) * STRIDE, RL};
    if (kvt_submit(a, p, 2, runs, NR, 0)) {
        printf("FAIL: submit: %s\n", kvc_last_error());
        return 1;
    }
    ok = rok = 0;
    for (int i = 0; i < 400 && (!ok || !rok); i++) {
        kvt_event ev[4];
        size_t k;
        kvt_progress(b, 0, ev, 4, &k);
        for (size_t j = 0; j < k; j++)
            rok = ev[j].state == KVC_POLL_SUCCESS ? 1 : -1;
        kvt_progress(a, 25, ev, 4, &k);
        for (size_t j = 0; j < k; j++)
            ok = ev[j].state == KVC_POLL_SUCCESS ? 1 : -1;
    }
    for (uint64_t i = 0; i < NR && ok == 1; i++)
        if (memcmp(src + i * STRIDE, dst + (NR - 1 - i) * STRIDE, RL))
            ok = -2;
    if (ok != 1 || rok != 1) {
        printf("FAIL: scattered room: sender %d, receiver %d\n", ok, rok);
        return 1;
    }
    /* RDMA READ: a pulls b's region back, scattered (reversed order),
     * every byte in place at the reader's event. */
    xu_fill(dst, len, 3);
    memset(src, 0, len);
    for (uint64_t i = 0; i < NR; i++)
        runs[i] = (kvt_run){(uint64_t)(uintptr_t)src + i * STRIDE,
                            (uint64_t)(uintptr_t)dst + (NR - 1 - i) * STRIDE, RL};
    if (kvt_submit_read(a, p, 4, runs, NR, 0)) {
        printf("FAIL: submit_read: %s\n", kvc_last_error());
        return 1;
    }
    ok = 0;
    for (int i = 0; i < 400 && !ok; i++) {
        kvt_event ev[4];
        size_t k;
        kvt_progress(b, 0, ev, 4, &k);
        kvt_progress(a, 25, ev, 4, &k);
        for (size_t j = 0; j < k; j++) {
            ok = ev[j].state == KVC_POLL_SUCCESS && ev[j].side == KVT_SIDE_READER ? 1 : -1;
            if (ok != 1)
                printf("read room failed: %s\n", ev[j].reason);
        }
    }
    for (uint64_t i = 0; i < NR && ok == 1; i++)
        if (memcmp(src + i * STRIDE, dst + (NR - 1 - i) * STRIDE, RL))
            ok = -2;
    if (ok != 1) {
        printf("FAIL: RDMA READ room: %d\n", ok);
        return 1;
    }
    /* The receiver goes away: the next room fails, naming the peer. */
    kvt_engine_destroy(b);
    b = NULL;
    if (kvt_submit(a, p, 3, &run, 1, 0) == KVC_OK) {
        ok = 0;
        kvt_event last = {0};
        for (int i = 0; i < 800 && !ok; i++) {
            kvt_event ev[4];
            size_t k;
            kvt_progress(a, 25, ev, 4, &k);
            for (size_t j = 0; j < k; j++) {
                ok = ev[j].state == KVC_POLL_SUCCESS ? 1 : -1;
                last = ev[j];
            }
        }
        if (ok != -1 || !strstr(last.reason, last.peer)) {
            printf("FAIL: room after the receiver died: %d (%s)\n", ok,
                   ok ? last.reason : "no event");
            return 1;
        }
        printf("room 3 after the receiver died: %s (code %d)\n", last.reason, (int)last.code);
    }
    free(runs);
    printf("OK\n");
    free(d);
    kvt_engine_destroy(a);
    return 0;
}
