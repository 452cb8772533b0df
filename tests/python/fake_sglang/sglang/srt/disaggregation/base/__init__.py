from sglang.srt.disaggregation.base.conn import KVPoll  # noqa: F401 (sglang's re-export)
