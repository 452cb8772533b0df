/*
 * diag_gid.c - `rdma`'s view of one port's GID table: the entries as JSON
 * and the GID the transfer engine uses, chosen by the engine's own rule
 * (kvt__gid_choose, src/xfer/gid/: this file restates none of it).  No
 * device needed, so tests feed it recorded tables (tests/diag/test_gid.c).
 */
#include "diag.h"

int diag_gid_port(json_t *port, const kvt__gid_entry *t, size_t n, int infiniband)
{
    json_t *gids = json_array();
    char addr[64], why[512];
    for (size_t i = 0; i < n; i++) {
        json_t *g = json_object();
        kvt__gid_text(t[i].raw, addr, sizeof addr);
        json_object_set_new(g, "index", json_integer(t[i].index));
        json_object_set_new(g, "type", json_string(kvt__gid_type_name(t[i].type)));
        json_object_set_new(g, "gid", json_string(addr));
        json_object_set_new(g, "netdev", json_string(t[i].netdev));
        json_array_append_new(gids, g);
    }
    int chosen = kvt__gid_choose(t, n, infiniband, -1, why, sizeof why);
    json_object_set_new(port, "gids", gids);
    json_object_set_new(port, "chosen_gid_index", json_integer(chosen));
    json_object_set_new(port, "chosen_reason", json_string(why));
    return chosen;
}
