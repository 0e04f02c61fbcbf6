"""Type stubs of the extension module ``r2ccl._r2ccl`` (the raw layer under ``r2ccl``)."""

from typing import List, Optional, Sequence, Tuple

class R2cclError(RuntimeError): ...
class BootstrapError(R2cclError): ...
class TransportError(R2cclError): ...
class InvalidArgumentError(R2cclError): ...
class DeviceError(R2cclError): ...
class PeerLostError(R2cclError):
    rank: int
class MismatchError(R2cclError):
    seq: int
class CollectiveTimeoutError(R2cclError):
    seq: int
class NodeIsolatedError(R2cclError):
    seq: int
    node: int
class NoCommonRailError(R2cclError):
    seq: int
class NoPathLeftError(R2cclError):
    seq: int
    rank: int
class CollectiveFailedError(R2cclError):
    seq: int
class AbortedError(R2cclError): ...

class Root:
    @staticmethod
    def create(ip: str) -> "Root": ...
    def unique_id(self) -> str: ...

class CollReport:
    seq: int
    strategy: str
    epoch: int
    seconds: float

class Work:
    def wait(self) -> CollReport: ...
    def is_done(self) -> bool: ...

class RegisteredBuffer:
    addr: int
    nbytes: int
    def free(self) -> None: ...

class Communicator:
    def __init__(
        self,
        rank: int,
        world: int,
        unique_id: str,
        node: Optional[str] = None,
        nics: Optional[Sequence[str]] = None,
        root: Optional[Root] = None,
        fault_injection_from_env: bool = False,
    ) -> None: ...
    @staticmethod
    def from_env() -> "Communicator": ...
    @property
    def rank(self) -> int: ...
    @property
    def world(self) -> int: ...
    @property
    def collective_timeout(self) -> float: ...
    def nodes(self) -> List[int]: ...
    def alloc(self, nbytes: int) -> RegisteredBuffer: ...
    def start(
        self,
        coll: str,
        dtype: str,
        count: int,
        send: int,
        send_nbytes: int,
        recv: int,
        recv_nbytes: int,
        keep: Sequence[object],
        op: Optional[str] = None,
        root: int = 0,
        timeout: Optional[float] = None,
    ) -> Work: ...
    def start_cuda(
        self,
        coll: str,
        dtype: str,
        count: int,
        send: int,
        send_nbytes: int,
        recv: int,
        recv_nbytes: int,
        stream: int,
        keep: Sequence[object],
        op: Optional[str] = None,
        root: int = 0,
        timeout: Optional[float] = None,
    ) -> Work: ...
    def start_group(
        self,
        dtype: str,
        ops: Sequence[Tuple[bool, int, int, int]],
        keep: Sequence[object],
        timeout: Optional[float] = None,
    ) -> Work: ...
    def failed_nics(self) -> List[Tuple[int, int]]: ...
    def take_events(self) -> List[Tuple[int, str]]: ...
    def check_async_error(self) -> None: ...
    def abort(self, reason: str = ...) -> None: ...
    def finalize(self) -> None: ...
    def destroy(self) -> None: ...

def install_prometheus(addr: str) -> str: ...
def version() -> str: ...
