/*
 * diag_etcd.c - the etcd options of `cluster` and `pd`, and the connection.
 */
#include "diag_etcd.h"

enum { O_ETCD = 1000, O_CLUSTER, O_USER, O_PW, O_CA, O_CERT, O_KEY };

const struct option diag_etcd_longopts[] = {
    {"etcd", required_argument, NULL, O_ETCD},
    {"cluster", required_argument, NULL, O_CLUSTER},
    {"etcd-user", required_argument, NULL, O_USER},
    {"etcd-password-file", required_argument, NULL, O_PW},
    {"etcd-cacert", required_argument, NULL, O_CA},
    {"etcd-cert", required_argument, NULL, O_CERT},
    {"etcd-key", required_argument, NULL, O_KEY},
    {0},
};

int diag_etcd_opt(void *ctx, int opt, const char *arg)
{
    struct diag_etcd_opts *o = ctx;
    switch (opt) {
    case O_ETCD: o->etcd = arg; return 0;
    case O_CLUSTER: o->cluster = arg; return 0;
    case O_USER: o->user = arg; return 0;
    case O_PW: o->pwfile = arg; return 0;
    case O_CA: o->cacert = arg; return 0;
    case O_CERT: o->cert = arg; return 0;
    case O_KEY: o->key = arg; return 0;
    default: return -1;
    }
}

etcd *diag_etcd_open(const diag *d, const char *cmd, const struct diag_etcd_opts *o)
{
    struct etcd_conf conf = {.endpoints = o->etcd,
                             .user = o->user,
                             .password_file = o->pwfile,
                             .cacert = o->cacert,
                             .cert = o->cert,
                             .key = o->key,
                             .timeout_ms = 2000};
    char err[512];
    etcd *c;
    if (etcd_open(&conf, &c, err, sizeof err)) {
        fprintf(stderr, "%s %s: %s\n", d->prog, cmd, err);
        return NULL;
    }
    return c;
}
