/*
 * bench_sock.c - the same-block baseline of `kvcoord-bench transfer
 * --compare` (bench_transfer.h): iperf3's loop at any block size.
 *
 * iperf3 refuses writes above 1 MiB, so at a 4 MiB block it cannot show
 * what a plain program moving 4 MiB blocks gets.  This is that program:
 * one TCP connection over loopback, a forked receiver recv()ing into one
 * block-sized buffer (each call asks for the rest of the block, as
 * iperf3's read of -l bytes does), this process send()ing one block-sized
 * buffer again and again (blocking, as iperf3's write), default socket
 * buffers (autotuned, as iperf3's), no TCP_NODELAY (iperf3's default).
 * Both buffers are reused, so the working set is the engine's with
 * --working-set 1: one block on each side.
 */
#include <errno.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_transfer.h"
#include "clock.h"

static void sock_pin(int cpu)
{
    if (cpu < 0)
        return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    (void)sched_setaffinity(0, sizeof set, &set);
}

static void *block_map(size_t n)
{
    void *p =
        mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* The forked receiver: accept one connection on l, read until EOF. */
static void sock_receiver(int l, size_t block, int cpu)
{
    sock_pin(cpu);
    int c = accept(l, NULL, NULL);
    char *b = block_map(block);
    if (c < 0 || !b)
        _exit(1);
    for (size_t off = 0;;) {
        ssize_t n = recv(c, b + off, block - off, 0);
        if (n == 0)
            _exit(0);
        if (n < 0 && errno != EINTR)
            _exit(1);
        if (n > 0)
            off = (off + (size_t)n) % block;
    }
}

static double tv_secs(const struct timeval *t)
{
    return (double)t->tv_sec + (double)t->tv_usec / 1e6;
}

int bench_sock_run(const bt_args *a, double *gbs, double *cpu_s_per_gb)
{
    size_t block = (size_t)a->block;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (l < 0 || bind(l, (struct sockaddr *)&sa, sizeof sa) ||
        getsockname(l, (struct sockaddr *)&sa, &sl) || listen(l, 1)) {
        perror("kvcoord-bench: send/recv baseline: listen");
        if (l >= 0)
            close(l);
        return -1;
    }
    pid_t pid = fork();
    if (pid == 0)
        sock_receiver(l, block, a->pin_recv);
    close(l);
    if (pid < 0) {
        perror("kvcoord-bench: fork");
        return -1;
    }
    sock_pin(a->pin_send);
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    char *b = block_map(block);
    int rc = s < 0 || !b || connect(s, (struct sockaddr *)&sa, sizeof sa) ? -1 : 0;
    if (rc)
        perror("kvcoord-bench: send/recv baseline: connect");
    else
        memset(b, 0x5a, block);
    struct rusage r0, r1, rr;
    getrusage(RUSAGE_SELF, &r0);
    uint64_t t0 = kvc__mono_ns(), end = t0 + (uint64_t)(a->duration * 1e9), bytes = 0;
    while (!rc && kvc__mono_ns() < end) {
        for (size_t off = 0; off < block;) {
            ssize_t n = send(s, b + off, block - off, MSG_NOSIGNAL);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) {
                perror("kvcoord-bench: send/recv baseline: send");
                rc = -1;
                break;
            }
            off += (size_t)n;
            bytes += (uint64_t)n;
        }
    }
    /* The receiver exits at EOF, once it has read every byte: the time
     * runs until then, so bytes still in the socket buffers count only
     * when they have arrived. */
    if (s >= 0)
        shutdown(s, SHUT_WR);
    int st = 0;
    if (wait4(pid, &st, 0, &rr) < 0) {
        memset(&rr, 0, sizeof rr);
        rc = -1;
    }
    double secs = (double)(kvc__mono_ns() - t0) / 1e9;
    getrusage(RUSAGE_SELF, &r1);
    if (s >= 0)
        close(s);
    if (b)
        munmap(b, block);
    if (rc || !WIFEXITED(st) || WEXITSTATUS(st) || !bytes) {
        fprintf(stderr, "kvcoord-bench: send/recv baseline failed (receiver status %d)\n", st);
        return -1;
    }
    double cpu = tv_secs(&r1.ru_utime) + tv_secs(&r1.ru_stime) - tv_secs(&r0.ru_utime) -
                 tv_secs(&r0.ru_stime) + tv_secs(&rr.ru_utime) + tv_secs(&rr.ru_stime);
    *gbs = (double)bytes / secs / 1e9;
    *cpu_s_per_gb = cpu / ((double)bytes / 1e9);
    return 0;
}
