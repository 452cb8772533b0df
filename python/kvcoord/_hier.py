"""The handshake that makes a kvcoord.HierGroup (the MIN all-reduce of a
group spanning nodes, include/kvcoord/hier.h) out of a torch.distributed
process group whose ranks run on several nodes, each node with its own
kvcoord segment.

handshake() is collective over the process group (every rank calls it) and
takes three all_gather_object of the group (gloo): the ranks' node identity
(which segment of which machine they attached), then the leaders' listening
addresses, then whether every connection was made.  Every rank therefore
decides the same: every rank gets a HierGroup, or every rank gets None and
the same reason.

Nodes are numbered in the order of their lowest rank; a node's leader is
its lowest rank.  Each leader listens on an ephemeral TCP port (the wildcard
address, or KVCOORD_HIER_HOST when set) only during the handshake, and
advertises its network namespace's addresses (or KVCOORD_HIER_HOST).  The
leader of node i connects to the leaders of the nodes below it, and
accepts the others: one connection per node pair.  A connection is kept
only after the peer presented the group's token (16 random bytes rank 0
drew, shared through the group) and the expected node and rank; anything
else that connects is dropped.
"""

import hashlib
import os
import socket
import struct
import threading
import time
from typing import Any, Dict, Tuple

from . import HierGroup
from ._kvcoord import host_addresses

MAX_NODES = 16
_HELLO = struct.Struct("<8s16sQII")  # magic, token, group id, node, rank
_MAGIC = b"KVCHIER1"
_ACK = b"\x01"
_seen: Dict[Tuple[Any, ...], int] = {}
_seen_lock = threading.Lock()


def boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def node_key_of(segment):
    """What tells a node apart: the machine's boot and the segment's identity."""
    st = segment.stat()
    return (boot_id(), segment.name, st["created_ns"], st["creator_pid"])


def _recv_exact(sock, n, deadline):
    buf = b""
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no answer in time")
        sock.settimeout(left)
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def _connect(addrs, port, hello, deadline):
    """A connection to one of addrs that acknowledged hello."""
    errors = []
    for a in addrs:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        s = None
        try:
            s = socket.create_connection((a, port), timeout=min(left, 5.0))
            s.sendall(hello)
            if _recv_exact(s, 1, deadline) == _ACK:
                s.setblocking(True)
                return s
            errors.append("%s: refused" % a)
        except OSError as e:
            errors.append("%s: %s" % (a, e))
        if s is not None:
            s.close()
    raise ConnectionError("could not reach %s port %d (%s)" % (", ".join(addrs), port,
                                                               "; ".join(errors) or "no time"))


def _accept(lsock, expect, token, gid, deadline):
    """The connections of the leaders of nodes in expect {node: rank}."""
    out = {}
    while len(out) < len(expect):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the leaders of nodes %s did not connect in time"
                               % sorted(set(expect) - set(out)))
        lsock.settimeout(left)
        conn, _ = lsock.accept()
        try:
            magic, tok, g, node, rank = _HELLO.unpack(_recv_exact(conn, _HELLO.size, deadline))
            if magic != _MAGIC or tok != token or g != gid or expect.get(node) != rank or \
                    node in out:
                conn.close()
                continue
            conn.sendall(_ACK)
            conn.setblocking(True)
            out[node] = conn
        except (OSError, struct.error):
            conn.close()
    return out


def _listen():
    host = os.environ.get("KVCOORD_HIER_HOST") or ""
    if host:
        s = socket.create_server((host, 0), backlog=64)
        return s, [host]
    if socket.has_dualstack_ipv6():
        s = socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True,
                                 backlog=64)
    else:
        s = socket.create_server(("", 0), backlog=64)
    return s, host_addresses()


def handshake(segment, pg=None, node_key=None, timeout=30.0):
    """Collective over torch.distributed process group pg (None: the world):
    (HierGroup, None) when the group spans nodes and every rank attached a
    kvcoord segment, else (None, why).  The same outcome on every rank.
    node_key: what tells this rank's node apart (default: boot id and the
    segment's identity).  timeout: seconds for the connections."""
    import torch.distributed as dist

    if pg is None:
        pg = dist.group.WORLD
    size = dist.get_world_size(pg)
    rank = dist.get_rank(pg)
    if segment is not None and node_key is None:
        node_key = node_key_of(segment)
    usable = segment is not None and node_key is not None
    mine = (node_key if usable else None, os.getpid(), os.urandom(16) if rank == 0 else None)
    got = [None] * size
    dist.all_gather_object(got, mine, group=pg)
    keys = [k for k, _, _ in got]
    if any(k is None for k in keys):
        return None, "a rank of the group attached no kvcoord segment"
    order = []
    for k in keys:
        if k not in order:
            order.append(k)
    nodes = len(order)
    if nodes == 1:
        return None, "the group is on one node (segment %s)" % segment.name
    if nodes > MAX_NODES or size > 64:
        return None, "the group has %d ranks on %d nodes (at most 64 on %d)" % (size, nodes,
                                                                               MAX_NODES)
    node_of = [order.index(k) for k in keys]
    leaders = [node_of.index(j) for j in range(nodes)]
    me = node_of[rank]
    leader = leaders[me] == rank
    token = got[0][2]
    members = tuple((k, p) for k, p, _ in got)
    with _seen_lock:
        n = _seen.get(members, 0)
        _seen[members] = n + 1
    gid = int.from_bytes(hashlib.blake2b(repr((members, n)).encode(), digest_size=8).digest(),
                         "little")
    deadline = time.monotonic() + timeout

    # 2. the leaders' addresses
    lsock, info, err = None, None, None
    if leader:
        try:
            lsock, addrs = _listen()
            name = os.environ.get("KVCOORD_NODE_NAME") or (addrs[0] if addrs else
                                                           socket.gethostname())
            info = (addrs, lsock.getsockname()[1], name)
        except OSError as e:
            err = "rank %d could not listen: %s" % (rank, e)
            info = ([], 0, None)
    got2 = [None] * size
    dist.all_gather_object(got2, (info, err), group=pg)
    errs = [e for _, e in got2 if e]
    names = [got2[leaders[j]][0][2] or ("node%d" % j) for j in range(nodes)]

    # 3. the connections, and whether every rank has its part
    conns, group = {}, None
    try:
        if not errs and leader:
            hello = _HELLO.pack(_MAGIC, token, gid, me, rank)
            for j in range(me):
                addrs, port, _ = got2[leaders[j]][0]
                conns[j] = _connect(addrs, port, hello, deadline)
            expect = {j: leaders[j] for j in range(me + 1, nodes)}
            conns.update(_accept(lsock, expect, token, gid, deadline))
        if not errs:
            fds = None
            if leader:
                fds = [conns[j].fileno() if j != me else -1 for j in range(nodes)]
            group = HierGroup(segment, gid, size, rank, node_of, names, fds)
            for c in conns.values():
                c.detach()  # the group owns them now
            conns = {}
    except Exception as e:  # noqa: BLE001 - any failure: every rank falls back together
        err = "rank %d (node %s): %s" % (rank, names[me], e)
    finally:
        if lsock is not None:
            lsock.close()
        for c in conns.values():
            c.close()
    got3 = [None] * size
    dist.all_gather_object(got3, err, group=pg)
    errs = errs + [e for e in got3 if e]
    if errs:
        if group is not None:
            group.close()
        return None, "the connections between the nodes' leaders failed: %s" % errs[0]
    return group, None
