"""sglang's distributed/device_communicators/mooncake_transfer_engine.py
shape (sglang 00157bdc): the shared MooncakeTransferEngine imports
`mooncake.engine.TransferEngine` when constructed, initializes it with
P2PHANDSHAKE and builds its session id from the host and get_rpc_port();
its methods turn exceptions into -1 and log failures at debug level."""

import logging
import os

logger = logging.getLogger(__name__)

_mooncake_transfer_engine = None


class MooncakeTransferEngine:
    def __init__(self, hostname, gpu_id=None, ib_device=None):
        try:
            from mooncake.engine import TransferEngine
        except ImportError as e:
            raise ImportError("Please install mooncake") from e
        self.engine = TransferEngine()
        self.hostname = hostname
        self.gpu_id = gpu_id if gpu_id is not None else 0
        self.ib_device = "" if os.environ.get("MC_FORCE_TCP") == "1" else ib_device
        self.initialize(hostname=self.hostname, device_name=self.ib_device)
        self.session_id = "%s:%d" % (self.hostname, self.engine.get_rpc_port())

    def register(self, ptr, length):
        try:
            ret_value = self.engine.register_memory(ptr, length)
        except Exception:
            ret_value = -1
        if ret_value != 0:
            logger.debug("Mooncake memory registration %s failed.", ptr)

    def deregister(self, ptr):
        try:
            ret_value = self.engine.unregister_memory(ptr)
        except Exception:
            ret_value = -1
        if ret_value != 0:
            logger.debug("Mooncake memory deregistration %s failed.", ptr)

    def batch_register(self, ptrs, lengths):
        try:
            ret_value = self.engine.batch_register_memory(ptrs, lengths)
        except Exception:
            ret_value = -1
        return ret_value

    def batch_deregister(self, ptrs):
        try:
            ret_value = self.engine.batch_unregister_memory(ptrs)
        except Exception:
            ret_value = -1
        return ret_value

    def initialize(self, hostname, device_name):
        protocol = os.environ.get("MOONCAKE_PROTOCOL", "rdma")
        ret_value = self.engine.initialize(hostname, "P2PHANDSHAKE", protocol,
                                           device_name if device_name is not None else "")
        if ret_value != 0:
            raise RuntimeError("Mooncake Transfer Engine initialization failed.")

    def transfer_sync(self, session_id, buffer, peer_buffer_address, length):
        try:
            ret = self.engine.transfer_sync_write(session_id, buffer, peer_buffer_address, length)
        except Exception:
            ret = -1
        return ret

    def batch_transfer_sync(self, session_id, buffers, peer_buffer_addresses, lengths):
        try:
            ret = self.engine.batch_transfer_sync_write(session_id, buffers,
                                                        peer_buffer_addresses, lengths)
        except Exception:
            ret = -1
        if ret < 0:
            logger.debug("Failed to batch transfer data. Session: %s", session_id)
        return ret

    def get_session_id(self):
        return self.session_id

    def send_probe(self, peer_session_id):
        return self.engine.send_probe(peer_session_id)

    def get_engine(self):
        return self.engine.get_engine()


def init_mooncake_transfer_engine(hostname, gpu_id=None, ib_device=None):
    global _mooncake_transfer_engine
    if _mooncake_transfer_engine is not None:
        return _mooncake_transfer_engine
    _mooncake_transfer_engine = MooncakeTransferEngine(hostname=hostname, gpu_id=gpu_id,
                                                       ib_device=ib_device)
    return _mooncake_transfer_engine


def get_mooncake_transfer_engine():
    return _mooncake_transfer_engine
