"""sglang's decode.py imports the poll all-reduces by name."""

from sglang.srt.disaggregation.utils import (  # noqa: F401
    poll_and_all_reduce,
    poll_and_all_reduce_with_staging,
)


def pop_transferred(queue, gloo_group):
    """The decode transfer queue's step: poll every receiver, agreed over the group."""
    return poll_and_all_reduce([dr.kv_receiver for dr in queue], gloo_group)
