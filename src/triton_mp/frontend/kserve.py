"""The core's answers as KServe v2 / Triton ``inference.*`` protos, for both transports.

Imported by the frontend's transports: the gRPC servicer sends these messages, and the HTTP
routes print them as Triton's JSON (``http.routes.proto_to_json``), so both answer with the
same fields. The core (``server_api``, ``repository_api``, ``stats_api``) never builds a
proto; the conversions below are the only place its plain answers meet grpc_service.proto.
"""

from __future__ import annotations

from collections.abc import Iterable

from triton_mp._proto import grpc_service_pb2 as pb
from triton_mp.frontend.admin.repository import IndexEntry
from triton_mp.frontend.admin.server import ModelMetadata, ServerMetadata, TensorMetadata
from triton_mp.ipc.protocol.reports import ModelStats, StatDuration


def server_metadata(m: ServerMetadata) -> pb.ServerMetadataResponse:
    """``inference.ServerMetadataResponse``."""
    return pb.ServerMetadataResponse(name=m.name, version=m.version, extensions=list(m.extensions))


def _tensor(t: TensorMetadata) -> pb.ModelMetadataResponse.TensorMetadata:
    return pb.ModelMetadataResponse.TensorMetadata(
        name=t.name, datatype=t.datatype, shape=list(t.shape)
    )


def model_metadata(m: ModelMetadata) -> pb.ModelMetadataResponse:
    """``inference.ModelMetadataResponse``."""
    return pb.ModelMetadataResponse(
        name=m.name,
        versions=list(m.versions),
        platform=m.platform,
        inputs=[_tensor(t) for t in m.inputs],
        outputs=[_tensor(t) for t in m.outputs],
    )


def index_entry(e: IndexEntry) -> pb.RepositoryIndexResponse.ModelIndex:
    """One ``RepositoryIndexResponse.ModelIndex``."""
    return pb.RepositoryIndexResponse.ModelIndex(
        name=e.name, version=e.version, state=e.state, reason=e.reason
    )


def repository_index(entries: Iterable[IndexEntry]) -> pb.RepositoryIndexResponse:
    """``inference.RepositoryIndexResponse``."""
    return pb.RepositoryIndexResponse(models=[index_entry(e) for e in entries])


def _duration(d: StatDuration) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=d.count, ns=d.ns)


def model_statistics(st: ModelStats) -> pb.ModelStatistics:
    """The scheduler's ModelStats as ``inference.ModelStatistics`` (durations in ns)."""
    return pb.ModelStatistics(
        name=st.name,
        version=str(st.version),
        last_inference=st.last_inference_ms,
        inference_count=st.inference_count,
        execution_count=st.execution_count,
        inference_stats=pb.InferStatistics(
            success=_duration(st.success),
            fail=_duration(st.fail),
            queue=_duration(st.queue),
            compute_input=_duration(st.compute_input),
            compute_infer=_duration(st.compute_infer),
            compute_output=_duration(st.compute_output),
            cache_hit=_duration(st.cache_hit),
            cache_miss=_duration(st.cache_miss),
        ),
        batch_stats=[
            pb.InferBatchStatistics(
                batch_size=b.batch_size,
                compute_input=_duration(b.compute_input),
                compute_infer=_duration(b.compute_infer),
                compute_output=_duration(b.compute_output),
            )
            for _, b in sorted(st.batch_stats.items())
        ],
    )


def statistics(stats: Iterable[ModelStats]) -> pb.ModelStatisticsResponse:
    """``inference.ModelStatisticsResponse``."""
    return pb.ModelStatisticsResponse(model_stats=[model_statistics(s) for s in stats])
