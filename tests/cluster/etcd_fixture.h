/*
 * etcd_fixture.h - a real 3-member etcd cluster (Debian's etcd-server) for a
 * C test: started with tools/etcd-cluster.sh in a fresh directory on ports
 * derived from the test's pid, stopped (and its data removed) at the end.
 */
#ifndef KVC_ETCD_FIXTURE_H
#define KVC_ETCD_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef KVC_SOURCE_DIR
#error "KVC_SOURCE_DIR must name the source tree"
#endif

struct etcd_fixture {
    char dir[256];
    int port;
    char endpoints[256];
};

/* Run tools/etcd-cluster.sh CMD [ARG] --dir DIR; returns its exit status. */
static inline int etcd_fixture_run(const struct etcd_fixture *f, const char *cmd, const char *arg)
{
    char line[1024];
    snprintf(line, sizeof line, "%s/tools/etcd-cluster.sh %s %s --dir %s --port %d >/dev/null",
             KVC_SOURCE_DIR, cmd, arg ? arg : "", f->dir, f->port);
    return system(line);
}

/* Start the cluster; 0 when every member answers, 77 when etcd is not
 * installed (the caller skips), -1 otherwise. */
static inline int etcd_fixture_start(struct etcd_fixture *f)
{
    if (access("/usr/bin/etcd", X_OK))
        return 77;
    /* Below the ephemeral range (32768..): no outgoing connection holds it. */
    f->port = 20000 + (int)(getpid() % 1500) * 8;
    snprintf(f->dir, sizeof f->dir, "/tmp/kvc-etcd-%d", (int)getpid());
    snprintf(f->endpoints, sizeof f->endpoints,
             "http://127.0.0.1:%d,http://127.0.0.1:%d,http://127.0.0.1:%d", f->port, f->port + 2,
             f->port + 4);
    return etcd_fixture_run(f, "start", "--wipe") == 0 ? 0 : -1;
}

/* Stop every member and remove the data directories. */
static inline void etcd_fixture_stop(struct etcd_fixture *f)
{
    etcd_fixture_run(f, "stop", NULL);
    char line[512];
    snprintf(line, sizeof line, "rm -rf %s", f->dir);
    if (system(line)) {
    }
}

#endif
