from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class QueueStatusRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class LevelStatus(_message.Message):
    __slots__ = ("level", "depth", "delayed", "oldest_age_us", "rejected", "timed_out", "delayed_total")
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    DELAYED_FIELD_NUMBER: _ClassVar[int]
    OLDEST_AGE_US_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    DELAYED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    level: int
    depth: int
    delayed: int
    oldest_age_us: int
    rejected: int
    timed_out: int
    delayed_total: int
    def __init__(self, level: _Optional[int] = ..., depth: _Optional[int] = ..., delayed: _Optional[int] = ..., oldest_age_us: _Optional[int] = ..., rejected: _Optional[int] = ..., timed_out: _Optional[int] = ..., delayed_total: _Optional[int] = ...) -> None: ...

class InstanceStatus(_message.Message):
    __slots__ = ("instance_id", "name", "live", "batches_in_flight", "requests_in_flight", "batch_size_in_flight", "executions", "restarts", "waiting_requests")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    BATCHES_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    EXECUTIONS_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    WAITING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    instance_id: int
    name: str
    live: bool
    batches_in_flight: int
    requests_in_flight: int
    batch_size_in_flight: int
    executions: int
    restarts: int
    waiting_requests: int
    def __init__(self, instance_id: _Optional[int] = ..., name: _Optional[str] = ..., live: _Optional[bool] = ..., batches_in_flight: _Optional[int] = ..., requests_in_flight: _Optional[int] = ..., batch_size_in_flight: _Optional[int] = ..., executions: _Optional[int] = ..., restarts: _Optional[int] = ..., waiting_requests: _Optional[int] = ...) -> None: ...

class BatchRecord(_message.Message):
    __slots__ = ("age_us", "batch_size", "requests", "reason", "instance")
    AGE_US_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    age_us: int
    batch_size: int
    requests: int
    reason: str
    instance: str
    def __init__(self, age_us: _Optional[int] = ..., batch_size: _Optional[int] = ..., requests: _Optional[int] = ..., reason: _Optional[str] = ..., instance: _Optional[str] = ...) -> None: ...

class StepStatus(_message.Message):
    __slots__ = ("model", "in_flight", "waiting")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    model: str
    in_flight: int
    waiting: int
    def __init__(self, model: _Optional[str] = ..., in_flight: _Optional[int] = ..., waiting: _Optional[int] = ...) -> None: ...

class ModelQueueStatus(_message.Message):
    __slots__ = ("model", "version", "scheduler", "max_batch_size", "preferred_batch_sizes", "max_queue_delay_us", "levels", "instances", "batch_sizes", "close_reasons", "recent_batches", "steps")
    class BatchSizesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    class CloseReasonsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_BATCH_SIZES_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_DELAY_US_FIELD_NUMBER: _ClassVar[int]
    LEVELS_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZES_FIELD_NUMBER: _ClassVar[int]
    CLOSE_REASONS_FIELD_NUMBER: _ClassVar[int]
    RECENT_BATCHES_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    scheduler: str
    max_batch_size: int
    preferred_batch_sizes: _containers.RepeatedScalarFieldContainer[int]
    max_queue_delay_us: int
    levels: _containers.RepeatedCompositeFieldContainer[LevelStatus]
    instances: _containers.RepeatedCompositeFieldContainer[InstanceStatus]
    batch_sizes: _containers.ScalarMap[int, int]
    close_reasons: _containers.ScalarMap[str, int]
    recent_batches: _containers.RepeatedCompositeFieldContainer[BatchRecord]
    steps: _containers.RepeatedCompositeFieldContainer[StepStatus]
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., scheduler: _Optional[str] = ..., max_batch_size: _Optional[int] = ..., preferred_batch_sizes: _Optional[_Iterable[int]] = ..., max_queue_delay_us: _Optional[int] = ..., levels: _Optional[_Iterable[_Union[LevelStatus, _Mapping]]] = ..., instances: _Optional[_Iterable[_Union[InstanceStatus, _Mapping]]] = ..., batch_sizes: _Optional[_Mapping[int, int]] = ..., close_reasons: _Optional[_Mapping[str, int]] = ..., recent_batches: _Optional[_Iterable[_Union[BatchRecord, _Mapping]]] = ..., steps: _Optional[_Iterable[_Union[StepStatus, _Mapping]]] = ...) -> None: ...

class QueueStatusResponse(_message.Message):
    __slots__ = ("models", "frontend_restarts")
    class FrontendRestartsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    MODELS_FIELD_NUMBER: _ClassVar[int]
    FRONTEND_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelQueueStatus]
    frontend_restarts: _containers.ScalarMap[int, int]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelQueueStatus, _Mapping]]] = ..., frontend_restarts: _Optional[_Mapping[int, int]] = ...) -> None: ...
