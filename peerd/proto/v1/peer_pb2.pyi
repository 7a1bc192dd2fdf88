from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobResultRequest(_message.Message):
    __slots__ = ("name", "spec_fingerprint", "offset", "record_only")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SPEC_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    RECORD_ONLY_FIELD_NUMBER: _ClassVar[int]
    name: str
    spec_fingerprint: str
    offset: int
    record_only: bool
    def __init__(self, name: _Optional[str] = ..., spec_fingerprint: _Optional[str] = ..., offset: _Optional[int] = ..., record_only: _Optional[bool] = ...) -> None: ...

class JobResultReply(_message.Message):
    __slots__ = ("total", "offset", "data", "sha256", "record", "member")
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    total: int
    offset: int
    data: bytes
    sha256: str
    record: str
    member: str
    def __init__(self, total: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., sha256: _Optional[str] = ..., record: _Optional[str] = ..., member: _Optional[str] = ...) -> None: ...

class JobCodeRequest(_message.Message):
    __slots__ = ("name", "code", "offset")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    name: str
    code: str
    offset: int
    def __init__(self, name: _Optional[str] = ..., code: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class JobCodeReply(_message.Message):
    __slots__ = ("code", "total", "offset", "data")
    CODE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    code: str
    total: int
    offset: int
    data: bytes
    def __init__(self, code: _Optional[str] = ..., total: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class JobSpecRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class JobSpecReply(_message.Message):
    __slots__ = ("name", "spec_toml", "spec_fingerprint")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SPEC_TOML_FIELD_NUMBER: _ClassVar[int]
    SPEC_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    name: str
    spec_toml: str
    spec_fingerprint: str
    def __init__(self, name: _Optional[str] = ..., spec_toml: _Optional[str] = ..., spec_fingerprint: _Optional[str] = ...) -> None: ...

class HelloRequest(_message.Message):
    __slots__ = ("peer_id", "address", "version", "realm", "changed", "incarnation", "state_version", "relay")
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REALM_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    STATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    RELAY_FIELD_NUMBER: _ClassVar[int]
    peer_id: str
    address: str
    version: str
    realm: str
    changed: bool
    incarnation: int
    state_version: int
    relay: bool
    def __init__(self, peer_id: _Optional[str] = ..., address: _Optional[str] = ..., version: _Optional[str] = ..., realm: _Optional[str] = ..., changed: _Optional[bool] = ..., incarnation: _Optional[int] = ..., state_version: _Optional[int] = ..., relay: _Optional[bool] = ...) -> None: ...

class JobAd(_message.Message):
    __slots__ = ("name", "spec_fingerprint", "worker_address", "round", "state", "phase", "lr", "global_batch", "samples_per_s", "local_batch", "share", "member", "device", "data_samples", "progress", "fixed_s", "per_sample_s", "epochs_read", "loss", "metric", "disagreement", "segment_misses", "rejected", "collapsed")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SPEC_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    LR_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_BATCH_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    LOCAL_BATCH_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DATA_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    FIXED_S_FIELD_NUMBER: _ClassVar[int]
    PER_SAMPLE_S_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_READ_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    METRIC_FIELD_NUMBER: _ClassVar[int]
    DISAGREEMENT_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_MISSES_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    COLLAPSED_FIELD_NUMBER: _ClassVar[int]
    name: str
    spec_fingerprint: str
    worker_address: str
    round: int
    state: str
    phase: str
    lr: float
    global_batch: int
    samples_per_s: float
    local_batch: int
    share: float
    member: str
    device: str
    data_samples: int
    progress: float
    fixed_s: float
    per_sample_s: float
    epochs_read: float
    loss: float
    metric: float
    disagreement: float
    segment_misses: int
    rejected: int
    collapsed: bool
    def __init__(self, name: _Optional[str] = ..., spec_fingerprint: _Optional[str] = ..., worker_address: _Optional[str] = ..., round: _Optional[int] = ..., state: _Optional[str] = ..., phase: _Optional[str] = ..., lr: _Optional[float] = ..., global_batch: _Optional[int] = ..., samples_per_s: _Optional[float] = ..., local_batch: _Optional[int] = ..., share: _Optional[float] = ..., member: _Optional[str] = ..., device: _Optional[str] = ..., data_samples: _Optional[int] = ..., progress: _Optional[float] = ..., fixed_s: _Optional[float] = ..., per_sample_s: _Optional[float] = ..., epochs_read: _Optional[float] = ..., loss: _Optional[float] = ..., metric: _Optional[float] = ..., disagreement: _Optional[float] = ..., segment_misses: _Optional[int] = ..., rejected: _Optional[int] = ..., collapsed: _Optional[bool] = ...) -> None: ...

class HelloReply(_message.Message):
    __slots__ = ("peer_id", "version", "locality", "jobs", "realm", "not_training", "known", "incarnation", "state_version", "peers")
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LOCALITY_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    REALM_FIELD_NUMBER: _ClassVar[int]
    NOT_TRAINING_FIELD_NUMBER: _ClassVar[int]
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    STATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    peer_id: str
    version: str
    locality: str
    jobs: _containers.RepeatedCompositeFieldContainer[JobAd]
    realm: str
    not_training: str
    known: _containers.RepeatedCompositeFieldContainer[KnownPeer]
    incarnation: int
    state_version: int
    peers: _containers.RepeatedCompositeFieldContainer[PeerState]
    def __init__(self, peer_id: _Optional[str] = ..., version: _Optional[str] = ..., locality: _Optional[str] = ..., jobs: _Optional[_Iterable[_Union[JobAd, _Mapping]]] = ..., realm: _Optional[str] = ..., not_training: _Optional[str] = ..., known: _Optional[_Iterable[_Union[KnownPeer, _Mapping]]] = ..., incarnation: _Optional[int] = ..., state_version: _Optional[int] = ..., peers: _Optional[_Iterable[_Union[PeerState, _Mapping]]] = ...) -> None: ...

class PeerState(_message.Message):
    __slots__ = ("peer_id", "address", "locality", "version", "jobs", "not_training", "incarnation", "state_version", "age_ms")
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LOCALITY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NOT_TRAINING_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    STATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    AGE_MS_FIELD_NUMBER: _ClassVar[int]
    peer_id: str
    address: str
    locality: str
    version: str
    jobs: _containers.RepeatedCompositeFieldContainer[JobAd]
    not_training: str
    incarnation: int
    state_version: int
    age_ms: int
    def __init__(self, peer_id: _Optional[str] = ..., address: _Optional[str] = ..., locality: _Optional[str] = ..., version: _Optional[str] = ..., jobs: _Optional[_Iterable[_Union[JobAd, _Mapping]]] = ..., not_training: _Optional[str] = ..., incarnation: _Optional[int] = ..., state_version: _Optional[int] = ..., age_ms: _Optional[int] = ...) -> None: ...

class KnownPeer(_message.Message):
    __slots__ = ("peer_id", "address")
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    peer_id: str
    address: str
    def __init__(self, peer_id: _Optional[str] = ..., address: _Optional[str] = ...) -> None: ...

class LanesRequest(_message.Message):
    __slots__ = ("job", "fingerprint")
    JOB_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    job: str
    fingerprint: str
    def __init__(self, job: _Optional[str] = ..., fingerprint: _Optional[str] = ...) -> None: ...

class LanesReply(_message.Message):
    __slots__ = ("bulk_port",)
    BULK_PORT_FIELD_NUMBER: _ClassVar[int]
    bulk_port: int
    def __init__(self, bulk_port: _Optional[int] = ...) -> None: ...

class SegmentRequest(_message.Message):
    __slots__ = ("job", "fingerprint", "round", "segment", "peer_id", "wait_s", "stage")
    JOB_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    job: str
    fingerprint: str
    round: int
    segment: int
    peer_id: str
    wait_s: float
    stage: int
    def __init__(self, job: _Optional[str] = ..., fingerprint: _Optional[str] = ..., round: _Optional[int] = ..., segment: _Optional[int] = ..., peer_id: _Optional[str] = ..., wait_s: _Optional[float] = ..., stage: _Optional[int] = ...) -> None: ...

class SegmentChunk(_message.Message):
    __slots__ = ("round", "segment", "offset", "total", "data")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    round: int
    segment: int
    offset: int
    total: int
    data: bytes
    def __init__(self, round: _Optional[int] = ..., segment: _Optional[int] = ..., offset: _Optional[int] = ..., total: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class StateRequest(_message.Message):
    __slots__ = ("job", "fingerprint", "peer_id", "offset", "length", "wait_s")
    JOB_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    job: str
    fingerprint: str
    peer_id: str
    offset: int
    length: int
    wait_s: float
    def __init__(self, job: _Optional[str] = ..., fingerprint: _Optional[str] = ..., peer_id: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., wait_s: _Optional[float] = ...) -> None: ...

class StateChunk(_message.Message):
    __slots__ = ("round", "step", "offset", "total", "data", "progress", "sha256", "params", "extra")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    round: int
    step: int
    offset: int
    total: int
    data: bytes
    progress: float
    sha256: bytes
    params: int
    extra: bytes
    def __init__(self, round: _Optional[int] = ..., step: _Optional[int] = ..., offset: _Optional[int] = ..., total: _Optional[int] = ..., data: _Optional[bytes] = ..., progress: _Optional[float] = ..., sha256: _Optional[bytes] = ..., params: _Optional[int] = ..., extra: _Optional[bytes] = ...) -> None: ...
