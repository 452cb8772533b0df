from sglang.srt.disaggregation.mooncake.conn import (  # noqa: F401 (sglang's re-exports)
    MooncakeKVManager,
    MooncakeKVReceiver,
    MooncakeKVSender,
)
