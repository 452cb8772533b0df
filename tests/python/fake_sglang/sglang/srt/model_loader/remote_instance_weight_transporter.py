"""sglang's remote-instance weight transporter shape (sglang 5d2c83e6,
RemoteInstanceWeightTransporter.init_engine): the seed's engine is
`mooncake.engine.TransferEngine`, initialized with P2PHANDSHAKE, its session
id host:rpc_port; the new instance reads the weights with
batch_transfer_sync_read."""

import logging
import os

logger = logging.getLogger(__name__)


class RemoteInstanceWeightTransporter:
    def __init__(self, tp_rank, local_ip="127.0.0.1"):
        self.tp_rank = tp_rank
        self.local_ip = local_ip
        self.engine = None
        self.session_id = ""

    def init_engine(self):
        try:
            from mooncake.engine import TransferEngine
        except ImportError:
            logger.warning("Please install mooncake for using remote instance transfer engine")
            return
        self.engine = TransferEngine()
        self.engine.initialize(self.local_ip, "P2PHANDSHAKE",
                               os.environ.get("MOONCAKE_PROTOCOL", "rdma"),
                               os.environ.get("MOONCAKE_DEVICE", ""))
        self.session_id = "%s:%d" % (self.local_ip, self.engine.get_rpc_port())
