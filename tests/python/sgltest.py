"""Helpers of the kvcoord.sglang tests: the sglang-shaped fixture package
(tests/python/fake_sglang, put first on sys.path) and torch.distributed gloo
groups of forked ranks on CPU.  The parent never imports torch or the
fixture: each forked rank does, after fork."""

import os
import sys
import tempfile

FAKE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_sglang")
HAVE_COLLECTIVE = None


def use_fixture():
    """Import the fixture's `sglang` (not any other on sys.path)."""
    if FAKE not in sys.path:
        sys.path.insert(0, FAKE)
    import sglang

    assert sglang.__file__.startswith(FAKE), sglang.__file__
    return sglang


def store_path():
    """A fresh file:// rendezvous for one torch.distributed world."""
    fd, path = tempfile.mkstemp(prefix="kvctest-gloo-")
    os.close(fd)
    os.unlink(path)
    return path


def gloo(rank, size, store):
    """torch.distributed initialised on CPU with gloo (world `size`, this `rank`)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=size)
    return dist


def has_collective():
    import kvcoord

    return hasattr(kvcoord.Segment, "allreduce_min")
