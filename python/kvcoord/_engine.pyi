# Type stub of the C extension kvcoord._engine (python/ext/engine.c), the
# transfer engine under kvcoord.mooncake (users call kvcoord.mooncake, not
# this).  Addresses and lengths are ints (bytes, this process's virtual
# addresses or the peer's); a method of a closed Engine raises ValueError.
# Methods that answer an int status return it (0 done, < 0 failed: the
# reason is in last_error()) rather than raising.
from typing import Dict, List, Optional, Sequence, Tuple, final

WRITE: int
READ: int
HAVE_READ: int  # 1 when this build can read (pull) from a peer
HAVE_FETCH: int  # 1 when this build can fetch a peer's descriptor
PROTOCOL_VERSION: int

def last_error() -> Tuple[int, str]:
    """(monotonic ns, reason) of the calling thread's last failure."""

def local_addresses() -> List[Tuple[str, str, bool]]:
    """This host's IPv4 and IPv6 addresses: (interface, address, is_loopback)."""

@final  # not subclassable (no Py_TPFLAGS_BASETYPE)
class Engine:
    def __init__(
        self,
        host: str,
        backend: str = "auto",
        device: Optional[str] = None,
        timeout_s: float = 30.0,
        token: Optional[str] = None,
        fetch_ms: int = 5000,
        port: int = 0,
    ) -> None:
        """Raises ValueError (backend not auto/tcp/verbs, timeout_s <= 0,
        port outside 0..65535), RuntimeError (initialized twice), OSError
        (the engine could not start: the reason)."""
    def close(self) -> None: ...
    def session_id(self) -> str: ...
    def rpc_port(self) -> int: ...
    def backend(self) -> str: ...
    def register(self, addr: int, len: int, /) -> int: ...
    def unregister(self, addr: int, /) -> int: ...
    def transfer(
        self,
        session_id: str,
        op: int,
        buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        /,
    ) -> int: ...
    def transfer_one(
        self, session_id: str, op: int, buffer: int, peer_buffer_address: int, length: int, /
    ) -> int: ...
    def submit(
        self,
        session_id: str,
        op: int,
        buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        /,
    ) -> int:
        """A batch id; 0 when the submission failed."""
    def batch_wait(self, id: int, block: bool, /) -> int:
        """1 done, -1 failed, -2 its deadline passed, 0 still pending."""
    def probe(self, session_id: str, /) -> int: ...
    def peer_add(self, json: str, /) -> int: ...
    def descriptor(self) -> str: ...
    def engine_last_error(self) -> Tuple[int, str]: ...
    def log_take(self) -> List[Tuple[int, str]]: ...
    def stats(self) -> Dict[str, int]: ...
