"""sglang's prefill.py imports the poll all-reduces by name."""

from sglang.srt.disaggregation.utils import (  # noqa: F401
    poll_and_all_reduce,
    poll_and_all_reduce_attn_cp_tp_group,
)
