from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ResultRequest(_message.Message):
    __slots__ = ("job", "member", "fingerprint", "digest")
    JOB_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    FROM_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    job: str
    member: str
    fingerprint: str
    digest: str
    def __init__(self, job: _Optional[str] = ..., member: _Optional[str] = ..., fingerprint: _Optional[str] = ..., digest: _Optional[str] = ..., **kwargs) -> None: ...

class ResultReply(_message.Message):
    __slots__ = ("outcome", "from_peer", "record", "detail")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    FROM_PEER_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    outcome: str
    from_peer: str
    record: str
    detail: str
    def __init__(self, outcome: _Optional[str] = ..., from_peer: _Optional[str] = ..., record: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("step", "round", "epoch", "loss", "samples_per_s", "partners_reached", "partners_planned", "metric", "disagreement", "samples", "segment_misses", "finished", "exchange_s", "lr", "phase", "global_batch", "rejected", "local_batch", "share", "compute_s", "metric_name", "metric_higher_better", "metrics", "skipped_steps", "exported", "exported_round", "intrahost", "data_samples", "data_mode", "job_progress", "fixed_s", "per_sample_s", "training_s", "waited_s", "epochs_read", "rounds_done", "bytes_sent", "bytes_received", "exchange_buckets", "exchange_sum_s", "exchange_count", "checkpoint_round", "checkpoints_written", "collapsed", "collapse_reason", "lr_law", "lr_scale", "outer", "model_source", "training")
    class RejectedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class WaitedSEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    PARTNERS_REACHED_FIELD_NUMBER: _ClassVar[int]
    PARTNERS_PLANNED_FIELD_NUMBER: _ClassVar[int]
    METRIC_FIELD_NUMBER: _ClassVar[int]
    DISAGREEMENT_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_MISSES_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    EXCHANGE_S_FIELD_NUMBER: _ClassVar[int]
    LR_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_BATCH_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    LOCAL_BATCH_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    METRIC_NAME_FIELD_NUMBER: _ClassVar[int]
    METRIC_HIGHER_BETTER_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_STEPS_FIELD_NUMBER: _ClassVar[int]
    EXPORTED_FIELD_NUMBER: _ClassVar[int]
    EXPORTED_ROUND_FIELD_NUMBER: _ClassVar[int]
    INTRAHOST_FIELD_NUMBER: _ClassVar[int]
    DATA_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    DATA_MODE_FIELD_NUMBER: _ClassVar[int]
    JOB_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    FIXED_S_FIELD_NUMBER: _ClassVar[int]
    PER_SAMPLE_S_FIELD_NUMBER: _ClassVar[int]
    TRAINING_S_FIELD_NUMBER: _ClassVar[int]
    WAITED_S_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_READ_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_DONE_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    EXCHANGE_BUCKETS_FIELD_NUMBER: _ClassVar[int]
    EXCHANGE_SUM_S_FIELD_NUMBER: _ClassVar[int]
    EXCHANGE_COUNT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ROUND_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    COLLAPSED_FIELD_NUMBER: _ClassVar[int]
    COLLAPSE_REASON_FIELD_NUMBER: _ClassVar[int]
    LR_LAW_FIELD_NUMBER: _ClassVar[int]
    LR_SCALE_FIELD_NUMBER: _ClassVar[int]
    OUTER_FIELD_NUMBER: _ClassVar[int]
    MODEL_SOURCE_FIELD_NUMBER: _ClassVar[int]
    TRAINING_FIELD_NUMBER: _ClassVar[int]
    step: int
    round: int
    epoch: int
    loss: float
    samples_per_s: float
    partners_reached: int
    partners_planned: int
    metric: float
    disagreement: float
    samples: int
    segment_misses: int
    finished: bool
    exchange_s: float
    lr: float
    phase: str
    global_batch: int
    rejected: _containers.ScalarMap[str, int]
    local_batch: int
    share: float
    compute_s: float
    metric_name: str
    metric_higher_better: bool
    metrics: _containers.ScalarMap[str, float]
    skipped_steps: int
    exported: str
    exported_round: int
    intrahost: str
    data_samples: int
    data_mode: str
    job_progress: float
    fixed_s: float
    per_sample_s: float
    training_s: float
    waited_s: _containers.ScalarMap[str, float]
    epochs_read: float
    rounds_done: int
    bytes_sent: int
    bytes_received: int
    exchange_buckets: _containers.RepeatedScalarFieldContainer[int]
    exchange_sum_s: float
    exchange_count: int
    checkpoint_round: int
    checkpoints_written: int
    collapsed: bool
    collapse_reason: str
    lr_law: str
    lr_scale: float
    outer: str
    model_source: str
    training: bool
    def __init__(self, step: _Optional[int] = ..., round: _Optional[int] = ..., epoch: _Optional[int] = ..., loss: _Optional[float] = ..., samples_per_s: _Optional[float] = ..., partners_reached: _Optional[int] = ..., partners_planned: _Optional[int] = ..., metric: _Optional[float] = ..., disagreement: _Optional[float] = ..., samples: _Optional[int] = ..., segment_misses: _Optional[int] = ..., finished: _Optional[bool] = ..., exchange_s: _Optional[float] = ..., lr: _Optional[float] = ..., phase: _Optional[str] = ..., global_batch: _Optional[int] = ..., rejected: _Optional[_Mapping[str, int]] = ..., local_batch: _Optional[int] = ..., share: _Optional[float] = ..., compute_s: _Optional[float] = ..., metric_name: _Optional[str] = ..., metric_higher_better: _Optional[bool] = ..., metrics: _Optional[_Mapping[str, float]] = ..., skipped_steps: _Optional[int] = ..., exported: _Optional[str] = ..., exported_round: _Optional[int] = ..., intrahost: _Optional[str] = ..., data_samples: _Optional[int] = ..., data_mode: _Optional[str] = ..., job_progress: _Optional[float] = ..., fixed_s: _Optional[float] = ..., per_sample_s: _Optional[float] = ..., training_s: _Optional[float] = ..., waited_s: _Optional[_Mapping[str, float]] = ..., epochs_read: _Optional[float] = ..., rounds_done: _Optional[int] = ..., bytes_sent: _Optional[int] = ..., bytes_received: _Optional[int] = ..., exchange_buckets: _Optional[_Iterable[int]] = ..., exchange_sum_s: _Optional[float] = ..., exchange_count: _Optional[int] = ..., checkpoint_round: _Optional[int] = ..., checkpoints_written: _Optional[int] = ..., collapsed: _Optional[bool] = ..., collapse_reason: _Optional[str] = ..., lr_law: _Optional[str] = ..., lr_scale: _Optional[float] = ..., outer: _Optional[str] = ..., model_source: _Optional[str] = ..., training: _Optional[bool] = ...) -> None: ...

class WorkerReport(_message.Message):
    __slots__ = ("job", "pid", "address", "fingerprint", "progress", "member")
    JOB_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    job: str
    pid: int
    address: str
    fingerprint: str
    progress: Progress
    member: str
    def __init__(self, job: _Optional[str] = ..., pid: _Optional[int] = ..., address: _Optional[str] = ..., fingerprint: _Optional[str] = ..., progress: _Optional[_Union[Progress, _Mapping]] = ..., member: _Optional[str] = ...) -> None: ...

class PeerEndpoint(_message.Message):
    __slots__ = ("peer_id", "address", "locality", "daemon")
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LOCALITY_FIELD_NUMBER: _ClassVar[int]
    DAEMON_FIELD_NUMBER: _ClassVar[int]
    peer_id: str
    address: str
    locality: str
    daemon: str
    def __init__(self, peer_id: _Optional[str] = ..., address: _Optional[str] = ..., locality: _Optional[str] = ..., daemon: _Optional[str] = ...) -> None: ...

class WorkerView(_message.Message):
    __slots__ = ("peers", "stop", "members", "settled", "speeds", "export_path", "finished", "stop_reason")
    PEERS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    SETTLED_FIELD_NUMBER: _ClassVar[int]
    SPEEDS_FIELD_NUMBER: _ClassVar[int]
    EXPORT_PATH_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    peers: _containers.RepeatedCompositeFieldContainer[PeerEndpoint]
    stop: bool
    members: _containers.RepeatedScalarFieldContainer[str]
    settled: bool
    speeds: _containers.RepeatedCompositeFieldContainer[MemberSpeed]
    export_path: str
    finished: _containers.RepeatedScalarFieldContainer[str]
    stop_reason: str
    def __init__(self, peers: _Optional[_Iterable[_Union[PeerEndpoint, _Mapping]]] = ..., stop: _Optional[bool] = ..., members: _Optional[_Iterable[str]] = ..., settled: _Optional[bool] = ..., speeds: _Optional[_Iterable[_Union[MemberSpeed, _Mapping]]] = ..., export_path: _Optional[str] = ..., finished: _Optional[_Iterable[str]] = ..., stop_reason: _Optional[str] = ...) -> None: ...

class MemberSpeed(_message.Message):
    __slots__ = ("peer_id", "samples_per_s", "data_samples", "progress", "fixed_s", "per_sample_s", "epochs_read")
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    DATA_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    FIXED_S_FIELD_NUMBER: _ClassVar[int]
    PER_SAMPLE_S_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_READ_FIELD_NUMBER: _ClassVar[int]
    peer_id: str
    samples_per_s: float
    data_samples: int
    progress: float
    fixed_s: float
    per_sample_s: float
    epochs_read: float
    def __init__(self, peer_id: _Optional[str] = ..., samples_per_s: _Optional[float] = ..., data_samples: _Optional[int] = ..., progress: _Optional[float] = ..., fixed_s: _Optional[float] = ..., per_sample_s: _Optional[float] = ..., epochs_read: _Optional[float] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LocalJob(_message.Message):
    __slots__ = ("name", "state", "spec_fingerprint", "worker_pid", "restarts", "view_size", "progress", "log_path", "workers", "message")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SPEC_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    WORKER_PID_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    VIEW_SIZE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    LOG_PATH_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    name: str
    state: str
    spec_fingerprint: str
    worker_pid: int
    restarts: int
    view_size: int
    progress: Progress
    log_path: str
    workers: _containers.RepeatedCompositeFieldContainer[LocalWorker]
    message: str
    def __init__(self, name: _Optional[str] = ..., state: _Optional[str] = ..., spec_fingerprint: _Optional[str] = ..., worker_pid: _Optional[int] = ..., restarts: _Optional[int] = ..., view_size: _Optional[int] = ..., progress: _Optional[_Union[Progress, _Mapping]] = ..., log_path: _Optional[str] = ..., workers: _Optional[_Iterable[_Union[LocalWorker, _Mapping]]] = ..., message: _Optional[str] = ...) -> None: ...

class LocalWorker(_message.Message):
    __slots__ = ("member", "device", "state", "pid", "restarts", "progress", "log_path", "address", "message")
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    LOG_PATH_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    member: str
    device: str
    state: str
    pid: int
    restarts: int
    progress: Progress
    log_path: str
    address: str
    message: str
    def __init__(self, member: _Optional[str] = ..., device: _Optional[str] = ..., state: _Optional[str] = ..., pid: _Optional[int] = ..., restarts: _Optional[int] = ..., progress: _Optional[_Union[Progress, _Mapping]] = ..., log_path: _Optional[str] = ..., address: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("peer_id", "version", "uptime_s", "peer_address", "locality", "peers_known", "jobs", "not_training")
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LOCALITY_FIELD_NUMBER: _ClassVar[int]
    PEERS_KNOWN_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NOT_TRAINING_FIELD_NUMBER: _ClassVar[int]
    peer_id: str
    version: str
    uptime_s: float
    peer_address: str
    locality: str
    peers_known: int
    jobs: _containers.RepeatedCompositeFieldContainer[LocalJob]
    not_training: str
    def __init__(self, peer_id: _Optional[str] = ..., version: _Optional[str] = ..., uptime_s: _Optional[float] = ..., peer_address: _Optional[str] = ..., locality: _Optional[str] = ..., peers_known: _Optional[int] = ..., jobs: _Optional[_Iterable[_Union[LocalJob, _Mapping]]] = ..., not_training: _Optional[str] = ...) -> None: ...

class ListPeersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PeerInfo(_message.Message):
    __slots__ = ("peer_id", "address", "locality", "version", "jobs", "last_seen_s", "state", "job_states", "not_training")
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LOCALITY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_S_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    JOB_STATES_FIELD_NUMBER: _ClassVar[int]
    NOT_TRAINING_FIELD_NUMBER: _ClassVar[int]
    peer_id: str
    address: str
    locality: str
    version: str
    jobs: _containers.RepeatedScalarFieldContainer[str]
    last_seen_s: float
    state: str
    job_states: _containers.RepeatedCompositeFieldContainer[PeerJob]
    not_training: str
    def __init__(self, peer_id: _Optional[str] = ..., address: _Optional[str] = ..., locality: _Optional[str] = ..., version: _Optional[str] = ..., jobs: _Optional[_Iterable[str]] = ..., last_seen_s: _Optional[float] = ..., state: _Optional[str] = ..., job_states: _Optional[_Iterable[_Union[PeerJob, _Mapping]]] = ..., not_training: _Optional[str] = ...) -> None: ...

class PeerJob(_message.Message):
    __slots__ = ("name", "state", "phase", "round", "lr", "global_batch", "samples_per_s", "local_batch", "share", "member", "device", "epochs", "loss", "metric", "disagreement", "segment_misses", "rejected", "collapsed")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    LR_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_BATCH_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    LOCAL_BATCH_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    METRIC_FIELD_NUMBER: _ClassVar[int]
    DISAGREEMENT_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_MISSES_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    COLLAPSED_FIELD_NUMBER: _ClassVar[int]
    name: str
    state: str
    phase: str
    round: int
    lr: float
    global_batch: int
    samples_per_s: float
    local_batch: int
    share: float
    member: str
    device: str
    epochs: float
    loss: float
    metric: float
    disagreement: float
    segment_misses: int
    rejected: int
    collapsed: bool
    def __init__(self, name: _Optional[str] = ..., state: _Optional[str] = ..., phase: _Optional[str] = ..., round: _Optional[int] = ..., lr: _Optional[float] = ..., global_batch: _Optional[int] = ..., samples_per_s: _Optional[float] = ..., local_batch: _Optional[int] = ..., share: _Optional[float] = ..., member: _Optional[str] = ..., device: _Optional[str] = ..., epochs: _Optional[float] = ..., loss: _Optional[float] = ..., metric: _Optional[float] = ..., disagreement: _Optional[float] = ..., segment_misses: _Optional[int] = ..., rejected: _Optional[int] = ..., collapsed: _Optional[bool] = ...) -> None: ...

class ListPeersReply(_message.Message):
    __slots__ = ("peers",)
    PEERS_FIELD_NUMBER: _ClassVar[int]
    peers: _containers.RepeatedCompositeFieldContainer[PeerInfo]
    def __init__(self, peers: _Optional[_Iterable[_Union[PeerInfo, _Mapping]]] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class JobInfo(_message.Message):
    __slots__ = ("name", "spec_fingerprint", "peer_ids", "local")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SPEC_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    PEER_IDS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    name: str
    spec_fingerprint: str
    peer_ids: _containers.RepeatedScalarFieldContainer[str]
    local: bool
    def __init__(self, name: _Optional[str] = ..., spec_fingerprint: _Optional[str] = ..., peer_ids: _Optional[_Iterable[str]] = ..., local: _Optional[bool] = ...) -> None: ...

class ListJobsReply(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobInfo]
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobInfo, _Mapping]]] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("spec_toml", "spec_dir", "name", "accept_code")
    SPEC_TOML_FIELD_NUMBER: _ClassVar[int]
    SPEC_DIR_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_CODE_FIELD_NUMBER: _ClassVar[int]
    spec_toml: str
    spec_dir: str
    name: str
    accept_code: str
    def __init__(self, spec_toml: _Optional[str] = ..., spec_dir: _Optional[str] = ..., name: _Optional[str] = ..., accept_code: _Optional[str] = ...) -> None: ...

class FetchCodeRequest(_message.Message):
    __slots__ = ("name", "spec_dir")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SPEC_DIR_FIELD_NUMBER: _ClassVar[int]
    name: str
    spec_dir: str
    def __init__(self, name: _Optional[str] = ..., spec_dir: _Optional[str] = ...) -> None: ...

class FetchCodeReply(_message.Message):
    __slots__ = ("name", "spec_fingerprint", "code", "source", "from_peer", "from_address", "files", "size", "path")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SPEC_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    FROM_PEER_FIELD_NUMBER: _ClassVar[int]
    FROM_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    name: str
    spec_fingerprint: str
    code: str
    source: str
    from_peer: str
    from_address: str
    files: _containers.RepeatedScalarFieldContainer[str]
    size: int
    path: str
    def __init__(self, name: _Optional[str] = ..., spec_fingerprint: _Optional[str] = ..., code: _Optional[str] = ..., source: _Optional[str] = ..., from_peer: _Optional[str] = ..., from_address: _Optional[str] = ..., files: _Optional[_Iterable[str]] = ..., size: _Optional[int] = ..., path: _Optional[str] = ...) -> None: ...

class JoinReply(_message.Message):
    __slots__ = ("name", "spec_fingerprint")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SPEC_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    name: str
    spec_fingerprint: str
    def __init__(self, name: _Optional[str] = ..., spec_fingerprint: _Optional[str] = ...) -> None: ...

class LeaveRequest(_message.Message):
    __slots__ = ("name", "drain")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    name: str
    drain: bool
    def __init__(self, name: _Optional[str] = ..., drain: _Optional[bool] = ...) -> None: ...

class LeaveReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PauseRequest(_message.Message):
    __slots__ = ("for_s",)
    FOR_S_FIELD_NUMBER: _ClassVar[int]
    for_s: float
    def __init__(self, for_s: _Optional[float] = ...) -> None: ...

class PauseReply(_message.Message):
    __slots__ = ("not_training",)
    NOT_TRAINING_FIELD_NUMBER: _ClassVar[int]
    not_training: str
    def __init__(self, not_training: _Optional[str] = ...) -> None: ...

class ResumeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResumeReply(_message.Message):
    __slots__ = ("not_training",)
    NOT_TRAINING_FIELD_NUMBER: _ClassVar[int]
    not_training: str
    def __init__(self, not_training: _Optional[str] = ...) -> None: ...

class ExportRequest(_message.Message):
    __slots__ = ("name", "path")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class ExportReply(_message.Message):
    __slots__ = ("path", "round", "step")
    PATH_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    path: str
    round: int
    step: int
    def __init__(self, path: _Optional[str] = ..., round: _Optional[int] = ..., step: _Optional[int] = ...) -> None: ...
