"""sglang's older disaggregation/mooncake/transfer_engine.py shape (sglang
052cf935): the same construction, protocol "rdma" fixed."""

from sglang.srt.distributed.device_communicators import mooncake_transfer_engine as _shared


class MooncakeTransferEngine(_shared.MooncakeTransferEngine):
    def __init__(self, hostname, gpu_id, ib_device=None):
        try:
            from mooncake.engine import TransferEngine
        except ImportError as e:
            raise ImportError("Please install mooncake") from e
        self.engine = TransferEngine()
        self.hostname = hostname
        self.gpu_id = gpu_id
        self.ib_device = ib_device
        ret_value = self.engine.initialize(hostname, "P2PHANDSHAKE", "rdma",
                                           ib_device if ib_device is not None else "")
        if ret_value != 0:
            raise RuntimeError("Mooncake Transfer Engine initialization failed.")
        self.session_id = f"{self.hostname}:{self.engine.get_rpc_port()}"
