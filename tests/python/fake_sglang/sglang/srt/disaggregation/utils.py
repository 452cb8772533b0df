"""sglang's disaggregation/utils.py shape: the poll all-reduces (MIN of
uint8 polls over a gloo group), with the failure injection and metadata
gate helpers they call."""

import os
import random

import torch
import torch.distributed as dist

from sglang.srt.disaggregation.base import KVPoll


def _get_failure_prob():
    return float(os.environ.get("DISAGGREGATION_TEST_FAILURE_PROB", "0"))


def _poll_with_failure_injection(pollers):
    prob = _get_failure_prob()
    if prob > 0:
        return [int(KVPoll.Failed) if random.random() < prob else int(p.poll()) for p in pollers]
    return [int(p.poll()) for p in pollers]


def _apply_metadata_gate(polls, decode_reqs, metadata_buffers, server_args):
    """Success whose metadata has not landed (room 0 in the buffer) is Transferring."""
    for i, v in enumerate(polls):
        if v == int(KVPoll.Success):
            dr = decode_reqs[i]
            if metadata_buffers.bootstrap_room[dr.metadata_buffer_index] == 0:
                polls[i] = int(KVPoll.Transferring)


def _min(polls, group):
    t = torch.tensor(polls, dtype=torch.uint8, device="cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    return t.tolist()


def poll_and_all_reduce(pollers, gloo_group, decode_reqs=None, metadata_buffers=None,
                        server_args=None):
    polls = _poll_with_failure_injection(pollers)
    if decode_reqs is not None and metadata_buffers is not None and server_args is not None:
        _apply_metadata_gate(polls, decode_reqs, metadata_buffers, server_args)
    return _min(polls, gloo_group)


def poll_and_all_reduce_attn_cp_tp_group(pollers, attn_cp_cpu_group, attn_tp_cpu_group):
    polls = poll_and_all_reduce(pollers, attn_tp_cpu_group)
    return _min(polls, attn_cp_cpu_group)


def poll_and_all_reduce_with_staging(decode_reqs, staging_handler, gloo_group,
                                     metadata_buffers=None, server_args=None):
    for dr in decode_reqs:
        if dr.kv_receiver.require_staging and not staging_handler.is_done(dr):
            staging_handler.advance_scatter(dr)
    polls = _poll_with_failure_injection([dr.kv_receiver for dr in decode_reqs])
    for i, dr in enumerate(decode_reqs):
        if polls[i] == int(KVPoll.Success) and dr.kv_receiver.require_staging \
                and not staging_handler.is_done(dr):
            polls[i] = int(KVPoll.Transferring)
    if metadata_buffers is not None and server_args is not None:
        _apply_metadata_gate(polls, decode_reqs, metadata_buffers, server_args)
    return _min(polls, gloo_group)
