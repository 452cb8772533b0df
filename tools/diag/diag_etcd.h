/*
 * diag_etcd.h - the etcd options that `cluster` and `pd` share (--etcd,
 * --cluster, --etcd-user, --etcd-password-file, --etcd-cacert, --etcd-cert,
 * --etcd-key: kvcoordd's own names) and the connection they describe.
 */
#ifndef KVC_DIAG_ETCD_H
#define KVC_DIAG_ETCD_H

#include "diag.h"
#include "etcd_client.h"

struct diag_etcd_opts {
    const char *etcd;    /* --etcd URL[,URL...]; NULL: not asked */
    const char *cluster; /* --cluster NAME (keys under /kvcoord/NAME/) */
    const char *user, *pwfile, *cacert, *cert, *key;
};
#define DIAG_ETCD_OPTS_INIT  \
    {                        \
        .cluster = "kvcoord" \
    }

/* The long options, ended by {0}, for diag_parse() with diag_etcd_opt(). */
extern const struct option diag_etcd_longopts[];

/* diag_opt_fn for diag_etcd_longopts; ctx is a struct diag_etcd_opts. */
int diag_etcd_opt(void *ctx, int opt, const char *arg);

/* Connect to o->etcd (2 s per request).  NULL with "PROG CMD: error" on
 * stderr when the options are unusable (a bad URL, an unreadable password
 * file). */
etcd *diag_etcd_open(const diag *d, const char *cmd, const struct diag_etcd_opts *o);

#endif
