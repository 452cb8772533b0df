/*
 * xfer_cma.c - the same-host data path (xfer_cma.h): this process's
 * identity, the per-connection negotiation that proves the peer's
 * process, the copy by process_vm_readv(2), and the frame a data write or
 * read takes on a same-host connection.
 */
#include "xfer_cma.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "sock_holder.h"
#include "xfer_conn.h"

/* ---- identity ------------------------------------------------------------------ */

/* The starttime field (22) of /proc/PID/stat: clock ticks after boot.
 * 0: unreadable (no such process). */
static uint64_t proc_start(uint32_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold anything */
    if (!p)
        return 0;
    p++;
    /* after ')': field 3 (state) onwards; starttime is the 20th of them */
    for (int field = 3; field < 22; field++) {
        while (*p == ' ')
            p++;
        while (*p && *p != ' ')
            p++;
    }
    return strtoull(p, NULL, 10);
}

static bool env_forced(void)
{
    const char *v = getenv(KVT_FORCE_SOCKET_ENV);
    if (!v || !*v)
        return false;
    static const char *const off[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < sizeof off / sizeof off[0]; i++)
        if (!strcasecmp(v, off[i]))
            return false;
    return true;
}

void kvt__cma_init(kvt_engine *e)
{
    e->cma_on = false;
    if (e->o.force_socket || env_forced()) {
        kvt__log(e, KVT_LOG_INFO, "same-host copy off (%s): data through the socket",
                 e->o.force_socket ? "force_socket" : KVT_FORCE_SOCKET_ENV);
        return;
    }
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    char id[64] = "";
    if (f) {
        if (!fgets(id, sizeof id, f))
            id[0] = '\0';
        fclose(f);
    }
    id[strcspn(id, "\n")] = '\0';
    struct stat st;
    e->pid = (uint32_t)getpid();
    e->start_ticks = proc_start(e->pid);
    if (strlen(id) != 36 || stat("/proc/self/ns/pid", &st) || !e->start_ticks) {
        kvt__log(e, KVT_LOG_DEBUG, "same-host copy off: this process's identity is unreadable");
        return;
    }
    memcpy(e->boot_id, id, 37);
    e->pidns_dev = (uint64_t)st.st_dev;
    e->pidns_ino = (uint64_t)st.st_ino;
    e->cma_on = true;
}

/* The identity a CMA_HELLO carries (92 bytes, little-endian):
 *   36  boot_id (ASCII)      8  pid namespace st_dev   8  its st_ino
 *    4  pid    4  0          8  start time (ticks)     8  slot address
 *   16  nonce (what the receiver must put into its slot) */
#define CMA_ID_LEN 92u

typedef struct cma_id {
    char boot_id[37];
    uint64_t dev, ino, start, slot;
    uint32_t pid;
    uint8_t nonce[16];
} cma_id;

static size_t id_encode(const kvt_engine *e, const kvt__conn *c, uint8_t *p)
{
    memcpy(p, e->boot_id, 36);
    kvt__put64(p + 36, e->pidns_dev);
    kvt__put64(p + 44, e->pidns_ino);
    kvt__put32(p + 52, e->pid);
    kvt__put32(p + 56, 0);
    kvt__put64(p + 60, e->start_ticks);
    kvt__put64(p + 68, (uint64_t)(uintptr_t)c->cma_slot);
    memcpy(p + 76, c->cma_nonce, 16);
    return CMA_ID_LEN;
}

static int id_decode(const uint8_t *p, size_t len, cma_id *id)
{
    if (len != CMA_ID_LEN)
        return -1;
    memcpy(id->boot_id, p, 36);
    id->boot_id[36] = '\0';
    id->dev = kvt__get64(p + 36);
    id->ino = kvt__get64(p + 44);
    id->pid = kvt__get32(p + 52);
    id->start = kvt__get64(p + 60);
    id->slot = kvt__get64(p + 68);
    memcpy(id->nonce, p + 76, 16);
    return 0;
}

static void nonce_new(uint8_t out[16])
{
    if (getrandom(out, 16, GRND_NONBLOCK) == 16)
        return;
    /* No entropy yet (early boot): still unpredictable enough to tell a
     * process from another, which is all it proves. */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t a = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t b = ((uint64_t)ts.tv_sec << 32 ^ (uint64_t)ts.tv_nsec) * 0xbf58476d1ce4e5b9ull;
    memcpy(out, &a, 8);
    memcpy(out + 8, &b, 8);
}

/* ---- the copy ------------------------------------------------------------------ */

/* An errno in words with its name, for the ones a copy meets. */
static void errno_words(int err, char *out, size_t cap)
{
    const char *name = err == ESRCH    ? "ESRCH"
                       : err == EFAULT ? "EFAULT"
                       : err == EPERM  ? "EPERM"
                       : err == ENOMEM ? "ENOMEM"
                       : err == EACCES ? "EACCES"
                       : err == ENOSYS ? "ENOSYS"
                                       : NULL;
    if (name)
        kvt__str(out, cap, "%s (%s)", strerror(err), name);
    else
        kvt__str(out, cap, "%s (errno %d)", strerror(err), err);
}

static const char *peer_name(const kvt__conn *c)
{
    return c->client ? c->peer->sid : c->rpeer ? c->rpeer->sid : "(before handshake)";
}

/* The peer's process has exited (its pidfd is readable): its pid may name
 * another process any time now. */
static bool peer_exited(const kvt__conn *c)
{
    if (c->cma_pidfd < 0)
        return false;
    struct pollfd pf = {c->cma_pidfd, POLLIN, 0};
    return poll(&pf, 1, 0) > 0 && (pf.revents & POLLIN);
}

/* The copy loop: 0 or the errno; *bytes: what was copied. */
static int pull_pid(pid_t pid, struct iovec *local, struct iovec *remote, size_t n, uint64_t *out)
{
    size_t li = 0, ri = 0;
    int err = 0;
    uint64_t bytes = 0;
    while (!err && li < n) {
        /* process_vm_readv takes at most IOV_MAX (1024) of each; n <= 257 */
        ssize_t k = process_vm_readv(pid, local + li, n - li, remote + ri, n - ri, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            err = k < 0 ? errno : EFAULT;
            break;
        }
        bytes += (uint64_t)k;
        /* A partial copy (a fault part way): advance both sides by k, resume. */
        for (size_t left = (size_t)k; left;) {
            size_t s = local[li].iov_len < left ? local[li].iov_len : left;
            local[li].iov_base = (char *)local[li].iov_base + s;
            local[li].iov_len -= s;
            left -= s;
            if (!local[li].iov_len)
                li++;
        }
        for (size_t left = (size_t)k; left;) {
            size_t s = remote[ri].iov_len < left ? remote[ri].iov_len : left;
            remote[ri].iov_base = (char *)remote[ri].iov_base + s;
            remote[ri].iov_len -= s;
            left -= s;
            if (!remote[ri].iov_len)
                ri++;
        }
    }
    *out = bytes;
    return err;
}

/* The copy helper: a thread of the engine that copies the second half of
 * a large copy while the engine's thread copies the first.  Measured here
 * (2 vCPUs, AMD EPYC, kernel 6.18): process_vm_readv moves 1.2 / 2.2 /
 * 3.3 GB per CPU-second at 4 KiB / 64 KiB / 1 MiB runs, against 6-10 for
 * a user-space memcpy of the same pages; one thread would copy slower than
 * the socket path, whose two copies run on both sides' CPUs at once.  Made
 * on the first copy of at least KVT_CMA_SPLIT_MIN bytes; joined at
 * destroy. */
#define KVT_CMA_SPLIT_MIN (512u << 10)

struct kvt__cma_worker {
    pthread_t thr;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    bool job, finished, stop;
    pid_t pid;
    struct iovec l[KVT_READ_ENTS_MAX + 1], r[KVT_READ_ENTS_MAX + 1];
    size_t n;
    int err;
    uint64_t bytes;
};

static void *worker_main(void *arg)
{
    struct kvt__cma_worker *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->job && !w->stop)
            pthread_cond_wait(&w->go, &w->mu);
        if (w->stop)
            break;
        pthread_mutex_unlock(&w->mu);
        uint64_t bytes = 0;
        int err = pull_pid(w->pid, w->l, w->r, w->n, &bytes);
        pthread_mutex_lock(&w->mu);
        w->err = err;
        w->bytes = bytes;
        w->job = false;
        w->finished = true;
        pthread_cond_signal(&w->done);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* The helper, started on first use; NULL when it cannot be (the copy is
 * then made by the engine's thread alone). */
static struct kvt__cma_worker *worker(kvt_engine *e)
{
    if (e->cmaw || e->cmaw_failed)
        return e->cmaw;
    struct kvt__cma_worker *w = calloc(1, sizeof *w);
    if (w) {
        pthread_mutex_init(&w->mu, NULL);
        pthread_cond_init(&w->go, NULL);
        pthread_cond_init(&w->done, NULL);
        /* Signals stay with the caller's threads. */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        int rc = pthread_create(&w->thr, NULL, worker_main, w);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (!rc) {
            e->cmaw = w;
            return w;
        }
        pthread_cond_destroy(&w->done);
        pthread_cond_destroy(&w->go);
        pthread_mutex_destroy(&w->mu);
        free(w);
    }
    e->cmaw_failed = true;
    kvt__log(e, KVT_LOG_DEBUG, "same-host copy: no helper thread, one thread copies");
    return NULL;
}

void kvt__cma_fini(kvt_engine *e)
{
    struct kvt__cma_worker *w = e->cmaw;
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_signal(&w->go);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thr, NULL);
    pthread_cond_destroy(&w->done);
    pthread_cond_destroy(&w->go);
    pthread_mutex_destroy(&w->mu);
    free(w);
    e->cmaw = NULL;
}

/* Copy n paired runs (local[i] and remote[i] of the same length) from
 * c's peer: a large copy split in two halves by bytes (a run cut in two
 * where the middle falls), the second half by the helper.  0 or the
 * errno; *out: the bytes copied by both. */
static int pull(kvt_engine *e, const kvt__conn *c, struct iovec *local, struct iovec *remote,
                size_t n, uint64_t *out)
{
    *out = 0;
    if (peer_exited(c))
        return ESRCH;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += local[i].iov_len;
    struct kvt__cma_worker *w = total >= KVT_CMA_SPLIT_MIN ? worker(e) : NULL;
    if (!w)
        return pull_pid((pid_t)c->cma_pid, local, remote, n, out);
    /* The first half: runs [0, k) and the head of run k (h bytes). */
    uint64_t half = total / 2, acc = 0;
    size_t k = 0;
    while (acc + local[k].iov_len <= half)
        acc += local[k++].iov_len;
    size_t h = (size_t)(half - acc);
    pthread_mutex_lock(&w->mu);
    w->pid = (pid_t)c->cma_pid;
    w->n = n - k;
    for (size_t i = k; i < n; i++) {
        w->l[i - k] = local[i];
        w->r[i - k] = remote[i];
    }
    w->l[0].iov_base = (char *)w->l[0].iov_base + h;
    w->l[0].iov_len -= h;
    w->r[0].iov_base = (char *)w->r[0].iov_base + h;
    w->r[0].iov_len -= h;
    w->job = true;
    w->finished = false;
    pthread_cond_signal(&w->go);
    pthread_mutex_unlock(&w->mu);
    size_t mine = k;
    if (h) { /* the head of run k is ours */
        local[k].iov_len = h;
        remote[k].iov_len = h;
        mine++;
    }
    uint64_t b1 = 0;
    int err = mine ? pull_pid((pid_t)c->cma_pid, local, remote, mine, &b1) : 0;
    pthread_mutex_lock(&w->mu);
    while (!w->finished)
        pthread_cond_wait(&w->done, &w->mu);
    int err2 = w->err;
    *out = b1 + w->bytes;
    pthread_mutex_unlock(&w->mu);
    return err ? err : err2;
}

int kvt__cma_pull(kvt_engine *e, kvt__conn *c, struct iovec *local, struct iovec *remote, size_t n,
                  char *why, size_t cap)
{
    uint64_t bytes = 0;
    int err = pull(e, c, local, remote, n, &bytes);
    e->st.same_host_bytes += bytes;
    if (!err) {
        e->st.same_host_copies++;
        return 0;
    }
    char w[96];
    errno_words(err, w, sizeof w);
    kvt__str(why, cap,
             "same-host copy from peer %s (pid %u) failed after %llu bytes: process_vm_readv: %s%s",
             peer_name(c), c->cma_pid, (unsigned long long)bytes, w,
             err == ESRCH    ? ": the process is gone"
             : err == EFAULT ? ": a range is not mapped in it"
                             : "");
    return err;
}

/* ---- negotiation --------------------------------------------------------------- */

/* Check a peer's identity: same host and pid namespace, the pid's process
 * started when the peer says.  0, or an errno with the reason. */
static int id_check(kvt_engine *e, const cma_id *id, char *why, size_t cap)
{
    if (memcmp(id->boot_id, e->boot_id, 36)) {
        kvt__str(why, cap, "another host (boot_id %.36s)", id->boot_id);
        return EXDEV;
    }
    if (id->dev != e->pidns_dev || id->ino != e->pidns_ino) {
        kvt__str(why, cap, "another pid namespace on this host");
        return EXDEV;
    }
    uint64_t st = id->pid ? proc_start(id->pid) : 0;
    if (!st || st != id->start) {
        kvt__str(why, cap, "pid %u %s", id->pid,
                 st ? "is another process than the peer says (start time)" : "not found");
        return ESRCH;
    }
    return 0;
}

/* ---- whose socket ------------------------------------------------------------------ */

/* The inode of the socket at the other end of connection fd, from this
 * network namespace's table (src/common/sock_holder.h: its row has the
 * peer's address as local and ours as remote).  0: not found (the peer is
 * in another network namespace, or gone). */
static uint64_t peer_socket_inode(int fd)
{
    struct sockaddr_storage me, him;
    socklen_t ml = sizeof me, hl = sizeof him;
    if (getsockname(fd, (struct sockaddr *)&me, &ml) ||
        getpeername(fd, (struct sockaddr *)&him, &hl))
        return 0;
    struct kvc__sock_row row;
    kvc__sock_find_pair(&him, &me, &row);
    return row.found ? row.inode : 0;
}

/* Open a pidfd on the peer (best effort: without one, exit is seen by
 * ESRCH alone), then prove the peer is that process: its slot, read from
 * its memory, holds the nonce we chose (so the copy is permitted too), and
 * it holds the other end of this very connection (so the peer cannot name
 * a process that merely placed the nonce for it, e.g. another engine it
 * handed the nonce to).  0, or an errno with the reason. */
static int prove(kvt__conn *c, const cma_id *id, char *why, size_t cap)
{
    c->cma_pid = id->pid;
    if (c->cma_pidfd < 0) {
#ifdef SYS_pidfd_open
        c->cma_pidfd = (int)syscall(SYS_pidfd_open, (pid_t)id->pid, 0);
        if (c->cma_pidfd >= 0)
            (void)fcntl(c->cma_pidfd, F_SETFD, FD_CLOEXEC);
#endif
    }
    /* After the pidfd: it names the process whose start time is checked. */
    if (proc_start(id->pid) != id->start) {
        kvt__str(why, cap, "pid %u exited during the handshake", id->pid);
        return ESRCH;
    }
    uint8_t got[16];
    struct iovec l = {got, sizeof got}, r = {(void *)(uintptr_t)c->cma_peer_slot, sizeof got};
    uint64_t bytes;
    int rc = peer_exited(c) ? ESRCH : pull_pid((pid_t)id->pid, &l, &r, 1, &bytes);
    if (rc) {
        char w[96];
        errno_words(rc, w, sizeof w);
        kvt__str(why, cap, "process_vm_readv of pid %u: %s", id->pid, w);
        return rc;
    }
    if (memcmp(got, c->cma_nonce, 16)) {
        kvt__str(why, cap, "pid %u does not hold the handshake's nonce: not the peer", id->pid);
        return EACCES;
    }
    uint64_t ino = peer_socket_inode(c->fd);
    if (!ino) {
        kvt__str(why, cap, "the peer's end of the connection is not in this network namespace");
        return EXDEV;
    }
    rc = kvc__sock_pid_holds((int32_t)id->pid, ino);
    if (rc == ENOENT) {
        kvt__str(why, cap, "pid %u does not hold the peer's end of the connection: not the peer",
                 id->pid);
        return EACCES;
    }
    if (rc) {
        char w[96];
        errno_words(rc, w, sizeof w);
        kvt__str(why, cap, "listing pid %u's fds: %s", id->pid, w);
    }
    return rc;
}

/* Queue a CMA frame (status, payload) on c and send it. */
static void cma_send(kvt_engine *e, kvt__conn *c, uint8_t type, int32_t status, const void *p,
                     uint32_t n)
{
    kvt__wr *w = kvt__ctl_wr(type, 0, 0, 0, status, p, n);
    if (!w) {
        kvt__conn_fail(e, c, ENOMEM, "handshake", "out of memory");
        return;
    }
    kvt__conn_enqueue(c, w);
    e->net->kick(e, c);
}

/* Client: the negotiation ended without the copy; the connection goes up
 * on the socket path.  A refusal on this host is logged once per peer. */
static void client_off(kvt_engine *e, kvt__conn *c, int code, const char *why)
{
    c->cma = KVT_CMA_OFF;
    if (code != EXDEV) {
        e->st.same_host_fallbacks++;
        if (!c->peer->cma_logged) {
            c->peer->cma_logged = true;
            kvt__log(e, KVT_LOG_WARN,
                     "peer %s is on this host but the same-host copy is refused (%s): its data "
                     "goes through the socket",
                     c->peer->sid, why);
        }
    } else {
        kvt__log(e, KVT_LOG_DEBUG, "peer %s: no same-host copy: %s", c->peer->sid, why);
    }
    kvt__cma_forget(c);
    kvt__rx_up(e, c);
}

bool kvt__cma_client_start(kvt_engine *e, kvt__conn *c, uint32_t peer_flags)
{
    if (!(peer_flags & KVT_HELLO_F_CMA) || !e->cma_on || c->peer->verbs)
        return false;
    uint8_t p[CMA_ID_LEN];
    nonce_new(c->cma_nonce);
    id_encode(e, c, p);
    c->cma = KVT_CMA_HELLO;
    cma_send(e, c, KVT_F_CMA_HELLO, 0, p, CMA_ID_LEN);
    return true;
}

void kvt__cma_on_hello(kvt_engine *e, kvt__conn *c)
{
    char why[KVC_REASON_MAX + 1];
    cma_id id;
    if (c->client) {
        if (c->cma != KVT_CMA_HELLO) {
            kvt__conn_fail(e, c, EPROTO, "handshake", "unexpected CMA_HELLO");
            return;
        }
        if (c->cur.status) {
            kvt__str(why, sizeof why, "%.*s", (int)c->ctl_len, c->ctl);
            client_off(e, c, c->cur.status, why);
            return;
        }
        if (id_decode((const uint8_t *)c->ctl, c->ctl_len, &id)) {
            kvt__conn_fail(e, c, EPROTO, "handshake", "malformed CMA_HELLO");
            return;
        }
        int rc = id_check(e, &id, why, sizeof why);
        if (!rc) {
            c->cma_peer_slot = id.slot;
            rc = prove(c, &id, why, sizeof why);
        }
        if (rc) {
            client_off(e, c, rc, why);
            return;
        }
        /* The server is proven: put its nonce into our slot, ask it to
         * check us. */
        memcpy(c->cma_slot, id.nonce, 16);
        c->cma = KVT_CMA_CHECK;
        cma_send(e, c, KVT_F_CMA_CHECK, 0, NULL, 0);
        return;
    }
    if (!c->cma_offer || c->cma != KVT_CMA_OFF || c->cur.status ||
        id_decode((const uint8_t *)c->ctl, c->ctl_len, &id)) {
        kvt__rx_proto_error(e, c, EPROTO, "unexpected or malformed CMA_HELLO");
        return;
    }
    int rc = id_check(e, &id, why, sizeof why);
    if (rc) {
        cma_send(e, c, KVT_F_CMA_HELLO, rc, why, (uint32_t)strlen(why));
        return;
    }
    /* Prove this process to the client (its nonce in our slot), and ask
     * for the same (ours in its slot, checked on CMA_CHECK). */
    c->cma_pid = id.pid;
    c->cma_start = id.start;
    c->cma_peer_slot = id.slot;
    memcpy(c->cma_slot, id.nonce, 16);
    nonce_new(c->cma_nonce);
    uint8_t p[CMA_ID_LEN];
    id_encode(e, c, p);
    c->cma = KVT_CMA_CHECK;
    cma_send(e, c, KVT_F_CMA_HELLO, 0, p, CMA_ID_LEN);
}

void kvt__cma_on_check(kvt_engine *e, kvt__conn *c)
{
    char why[KVC_REASON_MAX + 1];
    if (c->client) {
        if (c->cma != KVT_CMA_CHECK) {
            kvt__conn_fail(e, c, EPROTO, "handshake", "unexpected CMA_CHECK");
            return;
        }
        if (c->cur.status) {
            kvt__str(why, sizeof why, "%.*s", (int)c->ctl_len, c->ctl);
            client_off(e, c, c->cur.status, why);
            return;
        }
        c->cma = KVT_CMA_ON;
        kvt__log(e, KVT_LOG_DEBUG, "peer %s (pid %u): same-host copy on", c->peer->sid, c->cma_pid);
        kvt__rx_up(e, c);
        return;
    }
    if (c->cma != KVT_CMA_CHECK) {
        kvt__rx_proto_error(e, c, EPROTO, "unexpected CMA_CHECK");
        return;
    }
    cma_id id = {.pid = c->cma_pid, .start = c->cma_start};
    int rc = prove(c, &id, why, sizeof why);
    if (rc) {
        c->cma = KVT_CMA_OFF;
        kvt__cma_forget(c);
        e->st.same_host_fallbacks++;
        cma_send(e, c, KVT_F_CMA_CHECK, rc, why, (uint32_t)strlen(why));
        return;
    }
    c->cma = KVT_CMA_ON;
    cma_send(e, c, KVT_F_CMA_CHECK, 0, NULL, 0);
}

/* ---- sending ------------------------------------------------------------------- */

bool kvt__cma_frame(kvt__conn *c, kvt__wr *w, const void **pay, uint32_t *plen)
{
    if (c->cma != KVT_CMA_ON || !w->room)
        return false;
    if (w->rbytes) { /* a READ request: the same payload, answered by a grant */
        memcpy(w->chdr, w->hdr, KVT_HDR_LEN);
        w->chdr[4] = KVT_F_CMA_READ;
        *pay = w->payload;
        *plen = w->plen;
        return true;
    }
    if (!w->ncma)
        return false;
    kvt__frame f = {.type = KVT_F_CMA_WRITE,
                    .len = w->ncma * KVT_CMA_ENT_LEN,
                    .seq = w->seq,
                    .room = w->room->room,
                    .addr = kvt__wr_cost(w)};
    kvt__frame_encode(&f, w->chdr);
    *pay = w->cma;
    *plen = f.len;
    return true;
}

bool kvt__cma_falls_back(int err) { return err != EFAULT; }

void kvt__cma_fell(kvt_engine *e, kvt__conn *c, int err, const char *why)
{
    if (c->cma == KVT_CMA_FELL)
        return;
    c->cma = KVT_CMA_FELL;
    c->cma_err = err;
    e->st.same_host_fallbacks++;
    bool *logged = c->client ? &c->peer->cma_logged : c->rpeer ? &c->rpeer->cma_logged : NULL;
    if (logged && !*logged) {
        *logged = true;
        kvt__log(e, KVT_LOG_WARN,
                 "%s; the data of this connection to peer %s goes through the socket from now on",
                 why, peer_name(c));
    }
}

void kvt__cma_forget(kvt__conn *c)
{
    if (c->cma_pidfd >= 0)
        close(c->cma_pidfd);
    c->cma_pidfd = -1;
}
