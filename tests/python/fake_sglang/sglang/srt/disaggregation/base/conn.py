"""sglang's base/conn.py shape: KVPoll (plain int constants, as sglang's)
and the abstract sender/receiver."""


class KVPoll:
    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


class BaseKVManager:
    pass


class BaseKVSender:
    def failure_exception(self):
        raise NotImplementedError


class BaseKVReceiver:
    def failure_exception(self):
        raise NotImplementedError
