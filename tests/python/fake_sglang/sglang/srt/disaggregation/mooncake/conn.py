"""sglang's mooncake/conn.py shape: the sender and receiver share one
failure_exception (a mixin, as sglang's): conclude Failed, clear, pop this
rank's record; with none, the "unknown reason from another rank" text and
is_from_another_rank=True."""

from sglang.srt.disaggregation.base.conn import KVPoll
from sglang.srt.disaggregation.common.conn import (
    CommonKVManager,
    CommonKVReceiver,
    CommonKVSender,
    KVTransferError,
)

UNKNOWN = "Failed due to an unknown reason from another rank"


class MooncakeKVManager(CommonKVManager):
    def get_session_id(self):
        return "127.0.0.1:%d" % (17000 + self.engine_rank)


class MooncakeFailureExceptionMixin:
    def failure_exception(self):
        if self.conclude_state is None:
            self.conclude_state = KVPoll.Failed
        self.clear()
        with self.kv_mgr.failure_lock:
            reason = self.kv_mgr.failure_records.pop(self.bootstrap_room, None)
        from_other = reason is None
        raise KVTransferError(self.bootstrap_room, UNKNOWN if from_other else reason,
                              is_from_another_rank=from_other)


class MooncakeKVSender(MooncakeFailureExceptionMixin, CommonKVSender):
    def poll(self):
        if self.conclude_state is not None:
            return self.conclude_state
        status = self.kv_mgr.check_status(self.bootstrap_room)
        if status in (KVPoll.Success, KVPoll.Failed):
            self.conclude_state = status
        return status


class MooncakeKVReceiver(MooncakeFailureExceptionMixin, CommonKVReceiver):
    def poll(self):
        if self.conclude_state is not None:
            return self.conclude_state
        status = self.kv_mgr.check_status(self.bootstrap_room)
        if status in (KVPoll.Success, KVPoll.Failed):
            self.conclude_state = status
        return status


def send_kvcache_chunk(kv_mgr, engine, room, session_id, srcs, dsts, lengths, endpoint):
    """A transfer thread's step of sglang's MooncakeKVManager.transfer_worker:
    batch_transfer_sync of the chunk's pages; on failure the room's failure
    record with sglang's own text, and the room Failed."""
    ret = engine.batch_transfer_sync(session_id, srcs, dsts, lengths)
    if ret != 0:
        kv_mgr.record_failure(room, f"Failed to send kv chunk of {room} to {endpoint}")
        kv_mgr.update_status(room, KVPoll.Failed)
    return ret
