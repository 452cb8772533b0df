/*
 * diag_rdma.c - `kvcoord-diag rdma`: what the verbs transfer backend would
 * find on this host - RDMA devices, their ports (state, link layer), GID
 * tables with type and netdev, the GID index kvcoord would choose and why,
 * devices whose uverbs node is missing, and the RLIMIT_MEMLOCK limits that
 * memory registration runs into.
 */
#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "diag.h"

#define SYS_VERBS "/sys/class/infiniband_verbs"
#define MEMLOCK_LOW (64ull << 20)

static const char rdma_help[] =
    "DESCRIPTION\n"
    "  Lists the RDMA devices libibverbs finds, as the verbs transfer backend would:\n"
    "  for each device its uverbs node, node GUID and firmware; for each port its\n"
    "  state, link layer (InfiniBand or Ethernet) and active MTU, and its GID table -\n"
    "  index, type (IB, RoCEv1, RoCEv2), address and the netdev it belongs to, read\n"
    "  as the engine reads it - then the GID index the engine uses and why, by the\n"
    "  engine's own rule: on InfiniBand the lowest valid index; on Ethernet only\n"
    "  RoCEv2 GIDs with a netdev, IPv4-mapped routable first, then global IPv6, then\n"
    "  link-local (fe80::/10 or 169.254/16: chosen only when nothing better exists),\n"
    "  ties to the lowest index.  Devices that are listed but cannot be used are shown as\n"
    "  skipped with the reason - typically a missing /dev/infiniband/uverbsN node in\n"
    "  a container.  Finally the soft and hard RLIMIT_MEMLOCK: memory regions are\n"
    "  pinned, and registering more than the soft limit fails with ENOMEM.\n"
    "\n"
    "  On a host without RDMA devices it says so, with libibverbs' reason and what\n"
    "  sysfs shows (e.g. no /sys/class/infiniband_verbs: the kernel has no RDMA verbs\n"
    "  support loaded).  The segment is not read.\n"
    "\n"
    "OPTIONS\n"
    "  -R, --require   exit 3 unless at least one device has an active port with a\n"
    "                  usable GID\n"
    "\n"
    "OUTPUT\n"
    "  --json: {\"schema\", \"command\": \"rdma\", \"segment\", \"devices\": [{\"name\",\n"
    "  \"uverbs\", \"uverbs_path\", \"node_guid\", \"fw_ver\", \"ports\": [{\"port\", \"state\",\n"
    "  \"active\", \"link_layer\" (InfiniBand|Ethernet|unspecified), \"active_mtu\",\n"
    "  \"gid_table_len\", \"gids\": [{\"index\", \"type\", \"gid\", \"netdev\"}],\n"
    "  \"chosen_gid_index\" (-1: none), \"chosen_reason\"}]}], \"skipped\": [{\"name\",\n"
    "  \"reason\"}], \"usable\" (devices with an active port and a chosen GID),\n"
    "  \"reason\" (why there is no device, or null), \"memlock\": {\"soft\", \"hard\" (bytes,\n"
    "  null: unlimited), \"low\"}}.\n"
    "\n"
    "  Exit status: 0, also when there is no RDMA device (the usual case on hosts\n"
    "  without RDMA NICs); 3 with --require and no usable device.\n";

struct rdma_opts {
    int require;
};

static int rdma_opt(void *ctx, int opt, const char *arg)
{
    (void)arg;
    struct rdma_opts *o = ctx;
    if (opt != 'R')
        return -1;
    o->require = 1;
    return 0;
}

static const char *link_layer_name(uint8_t ll)
{
    return ll == IBV_LINK_LAYER_INFINIBAND ? "InfiniBand"
           : ll == IBV_LINK_LAYER_ETHERNET ? "Ethernet"
                                           : "unspecified";
}

/* One port: attributes, GID table, choice.  *usable set when active with a GID. */
static json_t *port_json(struct ibv_context *ctx, int port, int *usable)
{
    struct ibv_port_attr pa;
    json_t *o = json_object();
    json_object_set_new(o, "port", diag_jint(port));
    if (ibv_query_port(ctx, (uint8_t)port, &pa)) {
        json_object_set_new(o, "error", json_string(strerror(errno)));
        return o;
    }
    json_object_set_new(o, "state", json_string(ibv_port_state_str(pa.state)));
    json_object_set_new(o, "active", json_boolean(pa.state == IBV_PORT_ACTIVE));
    json_object_set_new(o, "link_layer", json_string(link_layer_name(pa.link_layer)));
    json_object_set_new(o, "active_mtu", diag_jint(128 << pa.active_mtu));
    json_object_set_new(o, "gid_table_len", diag_jint(pa.gid_tbl_len));
    /* The table as the engine reads it, and the engine's own choice. */
    size_t cap = pa.gid_tbl_len > 0 ? (size_t)pa.gid_tbl_len : 1;
    kvt__gid_entry *tab = calloc(cap, sizeof *tab);
    size_t n = tab ? kvt__gid_read_table(ctx, port, tab, cap) : 0;
    int chosen = diag_gid_port(o, tab, n, pa.link_layer == IBV_LINK_LAYER_INFINIBAND);
    free(tab);
    if (pa.state == IBV_PORT_ACTIVE && chosen >= 0)
        *usable = 1;
    return o;
}

static json_t *skipped(const char *name, const char *reason)
{
    json_t *o = json_object();
    json_object_set_new(o, "name", diag_jstr(name));
    json_object_set_new(o, "reason", diag_jstr(reason));
    return o;
}

/* One device: NULL (and *skip filled) when it cannot be used. */
static json_t *device_json(struct ibv_device *dev, json_t **skip, int *usable)
{
    const char *name = ibv_get_device_name(dev);
    char node[128], reason[256];
    snprintf(node, sizeof node, "/dev/infiniband/%s", dev->dev_name);
    if (access(node, F_OK) < 0) {
        snprintf(reason, sizeof reason,
                 "uverbs node %s is missing (listed in sysfs but not "
                 "present here: not passed into this container?)",
                 node);
        *skip = skipped(name, reason);
        return NULL;
    }
    struct ibv_context *ctx = ibv_open_device(dev);
    struct ibv_device_attr da;
    if (!ctx || ibv_query_device(ctx, &da)) {
        snprintf(reason, sizeof reason, "%s: %s", ctx ? "ibv_query_device" : "ibv_open_device",
                 strerror(errno));
        *skip = skipped(name, reason);
        if (ctx)
            ibv_close_device(ctx);
        return NULL;
    }
    json_t *o = json_object(), *ports = json_array();
    char guid[32];
    snprintf(guid, sizeof guid, "0x%016llx", (unsigned long long)be64toh(ibv_get_device_guid(dev)));
    json_object_set_new(o, "name", diag_jstr(name));
    json_object_set_new(o, "uverbs", diag_jstr(dev->dev_name));
    json_object_set_new(o, "uverbs_path", diag_jstr(node));
    json_object_set_new(o, "node_guid", json_string(guid));
    json_object_set_new(o, "fw_ver", diag_jstr(da.fw_ver));
    for (int p = 1; p <= da.phys_port_cnt; p++)
        json_array_append_new(ports, port_json(ctx, p, usable));
    json_object_set_new(o, "ports", ports);
    ibv_close_device(ctx);
    return o;
}

/* Why there is no device: libibverbs' errno and what sysfs shows. */
static void no_device_reason(int err, char *buf, size_t cap)
{
    struct stat st;
    const char *sys = stat(SYS_VERBS, &st) < 0 ? SYS_VERBS
                          " does not exist: the kernel has no RDMA verbs support "
                          "loaded (no ib_uverbs, or no RDMA NIC driver)"
                                               : "no uverbs device is registered in " SYS_VERBS;
    snprintf(buf, cap, "no RDMA devices found (libibverbs: %s; %s)",
             err ? strerror(err) : "the device list is empty", sys);
}

static json_t *memlock_json(void)
{
    struct rlimit rl;
    json_t *o = json_object();
    if (getrlimit(RLIMIT_MEMLOCK, &rl) < 0) {
        json_object_set_new(o, "error", json_string(strerror(errno)));
        return o;
    }
    json_object_set_new(
        o, "soft", rl.rlim_cur == RLIM_INFINITY ? json_null() : diag_jint((int64_t)rl.rlim_cur));
    json_object_set_new(
        o, "hard", rl.rlim_max == RLIM_INFINITY ? json_null() : diag_jint((int64_t)rl.rlim_max));
    json_object_set_new(o, "low",
                        json_boolean(rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < MEMLOCK_LOW));
    return o;
}

/* The whole report as a JSON document; *usable counts usable devices. */
static json_t *rdma_doc(const diag *d, int *usable)
{
    json_t *doc = diag_jdoc(d, "rdma"), *devs = json_array(), *skips = json_array();
    int n = 0;
    errno = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    int err = errno;
    *usable = 0;
    for (int i = 0; list && i < n; i++) {
        json_t *skip = NULL;
        int u = 0;
        json_t *dev = device_json(list[i], &skip, &u);
        if (dev)
            json_array_append_new(devs, dev);
        if (skip)
            json_array_append_new(skips, skip);
        *usable += u;
    }
    if (list)
        ibv_free_device_list(list);
    char reason[384];
    json_object_set_new(doc, "devices", devs);
    json_object_set_new(doc, "skipped", skips);
    json_object_set_new(doc, "usable", diag_jint(*usable));
    if (!list || n == 0)
        no_device_reason(err, reason, sizeof reason);
    json_object_set_new(doc, "reason", !list || n == 0 ? json_string(reason) : json_null());
    json_object_set_new(doc, "memlock", memlock_json());
    return doc;
}

/* ---- text ------------------------------------------------------------------ */

static void port_text(json_t *p)
{
    printf("  port %lld: %s, %s, MTU %lld\n", json_integer_value(json_object_get(p, "port")),
           json_string_value(json_object_get(p, "state")),
           json_string_value(json_object_get(p, "link_layer")),
           json_integer_value(json_object_get(p, "active_mtu")));
    static const char *const head[] = {"INDEX", "TYPE", "GID", "NETDEV"};
    diag_table *t = diag_table_new(4, head, "rlll");
    size_t i;
    json_t *g;
    json_array_foreach(json_object_get(p, "gids"), i, g) diag_table_addf(
        t, "%lld\t%s\t%s\t%s", json_integer_value(json_object_get(g, "index")),
        json_string_value(json_object_get(g, "type")), json_string_value(json_object_get(g, "gid")),
        json_string_value(json_object_get(g, "netdev"))[0]
            ? json_string_value(json_object_get(g, "netdev"))
            : "-");
    diag_table_print(t, stdout, 4);
    long long chosen = json_integer_value(json_object_get(p, "chosen_gid_index"));
    printf("    chosen GID index: %s%lld - %s\n", chosen < 0 ? "none " : "",
           chosen < 0 ? -1 : chosen, json_string_value(json_object_get(p, "chosen_reason")));
}

static void memlock_text(json_t *m)
{
    char b[32];
    printf("\nRLIMIT_MEMLOCK (pinned memory for memory regions)\n");
    const char *keys[] = {"soft", "hard"};
    for (int i = 0; i < 2; i++) {
        json_t *v = json_object_get(m, keys[i]);
        if (json_is_integer(v))
            printf("  %s  %s (%lld bytes)\n", keys[i],
                   diag_bytes((uint64_t)json_integer_value(v), b, sizeof b), json_integer_value(v));
        else
            printf("  %s  unlimited\n", keys[i]);
    }
    if (json_is_true(json_object_get(m, "low")))
        printf(
            "  low: registering more than the soft limit fails with ENOMEM (raise it: ulimit -l,\n"
            "  LimitMEMLOCK= in a systemd unit, or --ulimit memlock=-1 for a container)\n");
}

static void rdma_text(json_t *doc)
{
    size_t i, j;
    json_t *dev, *p;
    printf("RDMA devices\n");
    if (json_is_string(json_object_get(doc, "reason")))
        printf("  %s\n", json_string_value(json_object_get(doc, "reason")));
    json_array_foreach(json_object_get(doc, "devices"), i, dev)
    {
        printf("\n%s (%s, node GUID %s, firmware %s)\n",
               json_string_value(json_object_get(dev, "name")),
               json_string_value(json_object_get(dev, "uverbs_path")),
               json_string_value(json_object_get(dev, "node_guid")),
               json_string_value(json_object_get(dev, "fw_ver")));
        json_array_foreach(json_object_get(dev, "ports"), j, p) port_text(p);
    }
    if (json_array_size(json_object_get(doc, "skipped"))) {
        printf("\nskipped devices\n");
        json_array_foreach(json_object_get(doc, "skipped"), i, dev)
            printf("  %s: %s\n", json_string_value(json_object_get(dev, "name")),
                   json_string_value(json_object_get(dev, "reason")));
    }
    memlock_text(json_object_get(doc, "memlock"));
}

static int run_rdma(diag *d, int argc, char **argv)
{
    static const struct option longopts[] = {{"require", no_argument, NULL, 'R'}, {0}};
    struct rdma_opts o = {0};
    int rc =
        diag_parse_exit(diag_parse(d, &diag_cmd_rdma, argc, argv, "R", longopts, rdma_opt, &o));
    if (rc >= 0)
        return rc;
    if (optind < argc) {
        diag_usage_error(d, &diag_cmd_rdma, "unexpected argument '%s'", argv[optind]);
        return DIAG_EXIT_USAGE;
    }
    int usable = 0;
    json_t *doc = rdma_doc(d, &usable);
    if (d->json) {
        diag_jprint(doc);
    } else {
        rdma_text(doc);
        json_decref(doc);
    }
    return o.require && usable == 0 ? DIAG_EXIT_NO_RDMA : DIAG_EXIT_OK;
}

const diag_cmd diag_cmd_rdma = {
    "rdma",
    "RDMA devices, ports, GID tables, the GID kvcoord chooses, memlock limits",
    "rdma [--require]",
    rdma_help,
    run_rdma,
};
