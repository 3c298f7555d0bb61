"""The broker's network side: Kafka requests in, responses out, one request at a time per connection (as Kafka).

Requests and responses are kafka-python's schema classes; each handler below reads one request and builds its
response from BrokerStorage (topics, records, committed offsets) and GroupCoordinator (consumer groups).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kafka import errors as kafka_errors
from kafka.protocol.admin.groups import (
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from kafka.protocol.admin.topics import CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest, DeleteTopicsResponse
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafka.protocol.consumer.group import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.consumer.offsets import ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse
from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
from kafka.protocol.producer.transaction import InitProducerIdRequest, InitProducerIdResponse

from deploy.local.kafka_broker.groups import GroupCoordinator, GroupError
from deploy.local.kafka_broker.partition_log import CorruptBatchError
from deploy.local.kafka_broker.storage import BrokerStorage, CommittedOffset, TopicError
from scorers.errors import UserError

log = logging.getLogger("convowatch.kafka_broker")

FRAME_SIZE = struct.Struct(">i")
REQUEST_KEY_AND_VERSION = struct.Struct(">hh")
LATEST, EARLIEST = -1, -2  # ListOffsets timestamps


@dataclass(frozen=True)
class BrokerSettings:
    """Where the broker listens (and what it advertises) and the limits it keeps."""

    host: str = "127.0.0.1"
    port: int = 9092
    node_id: int = 0
    cluster_id: str = "convowatch-embedded"
    auto_create_topics: bool = True
    default_partitions: int = 1
    max_request_bytes: int = 100 * 1024 * 1024
    tick_interval_s: float = 0.1


def _error(name: str | None) -> int:
    """The wire code of a kafka.errors class named ``name`` (0 for None)."""
    return 0 if name is None else int(getattr(kafka_errors, name).errno)


Handler = Callable[[Any, str], Awaitable[Any]]


class KafkaBroker:
    """One broker node serving ``storage`` and ``coordinator`` on ``settings.host``:``settings.port``."""

    def __init__(self, storage: BrokerStorage, coordinator: GroupCoordinator, settings: BrokerSettings) -> None:
        self.storage = storage
        self.coordinator = coordinator
        self.settings = settings
        self._appended = asyncio.Condition()
        self._server: asyncio.Server | None = None
        self._ticker: asyncio.Task[None] | None = None
        # api key → (request class, lowest and highest version served, handler)
        self.apis: dict[int, tuple[Any, int, int, Handler]] = {
            ApiVersionsRequest.API_KEY: (ApiVersionsRequest, 0, 3, self.api_versions),
            MetadataRequest.API_KEY: (MetadataRequest, 0, 8, self.metadata),
            ProduceRequest.API_KEY: (ProduceRequest, 3, 8, self.produce),
            InitProducerIdRequest.API_KEY: (InitProducerIdRequest, 0, 1, self.init_producer_id),
            FetchRequest.API_KEY: (FetchRequest, 4, 6, self.fetch),
            ListOffsetsRequest.API_KEY: (ListOffsetsRequest, 1, 5, self.list_offsets),
            FindCoordinatorRequest.API_KEY: (FindCoordinatorRequest, 0, 3, self.find_coordinator),
            JoinGroupRequest.API_KEY: (JoinGroupRequest, 0, 5, self.join_group),
            SyncGroupRequest.API_KEY: (SyncGroupRequest, 0, 3, self.sync_group),
            HeartbeatRequest.API_KEY: (HeartbeatRequest, 0, 3, self.heartbeat),
            LeaveGroupRequest.API_KEY: (LeaveGroupRequest, 0, 3, self.leave_group),
            OffsetCommitRequest.API_KEY: (OffsetCommitRequest, 2, 7, self.offset_commit),
            OffsetFetchRequest.API_KEY: (OffsetFetchRequest, 1, 7, self.offset_fetch),
            DescribeGroupsRequest.API_KEY: (DescribeGroupsRequest, 0, 4, self.describe_groups),
            ListGroupsRequest.API_KEY: (ListGroupsRequest, 0, 2, self.list_groups),
            CreateTopicsRequest.API_KEY: (CreateTopicsRequest, 2, 4, self.create_topics),
            DeleteTopicsRequest.API_KEY: (DeleteTopicsRequest, 1, 3, self.delete_topics),
        }

    # --- lifecycle --------------------------------------------------------------------------------------------

    async def start(self) -> None:
        s = self.settings
        self._server = await asyncio.start_server(self._serve_connection, s.host, s.port)
        self._ticker = asyncio.create_task(self._tick())
        log.info("serving the Kafka protocol on %s:%d from %s", s.host, s.port, self.storage.data_dir)

    async def close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        self.storage.close()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.settings.tick_interval_s)
            self.coordinator.tick()

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        client_host = str(peer[0]) if peer else ""
        try:
            while True:
                (size,) = FRAME_SIZE.unpack(await reader.readexactly(FRAME_SIZE.size))
                if not 0 < size <= self.settings.max_request_bytes:
                    log.warning("closing %s: a request of %d bytes (limit %d)", peer, size, self.settings.max_request_bytes)
                    return
                frame = await reader.readexactly(size)
                response = await self._respond(frame, client_host)
                if response is not None:
                    writer.write(response)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except _CloseConnection as reason:
            log.warning("closing %s: %s", peer, reason)
        except Exception:  # a request that does not decode (or a fault of ours): that connection only
            log.exception("closing %s: could not answer its request", peer)
        finally:
            writer.close()

    async def _respond(self, frame: bytes, client_host: str) -> bytes | None:
        api_key, version = REQUEST_KEY_AND_VERSION.unpack_from(frame)
        api = self.apis.get(api_key)
        if api is None:
            raise _CloseConnection(f"API key {api_key} is not served")
        request_class, lowest, highest, handler = api
        if not lowest <= version <= highest:
            if api_key != ApiVersionsRequest.API_KEY:
                raise _CloseConnection(f"{request_class.__name__} v{version} is not served (v{lowest}-v{highest})")
            request = ApiVersionsRequest.decode(frame, version=0, header=True)
            response = self._api_versions_response(0, _error("UnsupportedVersionError"))
            response.with_header(correlation_id=request.header.correlation_id)
            return bytes(response.encode(header=True, framed=True))
        request = request_class.decode(frame, version=version, header=True)
        response = await handler(request, client_host)
        if response is None:
            return None
        response.with_header(correlation_id=request.header.correlation_id)
        return bytes(response.encode(header=True, framed=True))

    # --- handlers ---------------------------------------------------------------------------------------------

    def _api_versions_response(self, version: int, error_code: int) -> ApiVersionsResponse:
        versions = [
            ApiVersionsResponse.ApiVersion(api_key=key, min_version=lo, max_version=hi)
            for key, (_, lo, hi, _) in sorted(self.apis.items())
        ]
        return ApiVersionsResponse(version=version, error_code=error_code, api_keys=versions, throttle_time_ms=0)

    async def api_versions(self, request: Any, client_host: str) -> Any:
        return self._api_versions_response(request.API_VERSION, 0)

    async def metadata(self, request: Any, client_host: str) -> Any:
        s, storage = self.settings, self.storage
        wanted = list(storage.topics) if request.topics is None else [t.name for t in request.topics]
        if request.API_VERSION == 0 and not wanted:
            wanted = list(storage.topics)
        auto_create = s.auto_create_topics and request.allow_auto_topic_creation is not False
        topics = []
        for name in wanted:
            error = None
            if name not in storage.topics and auto_create:
                try:
                    storage.create_topic(name, s.default_partitions, {})
                except TopicError as e:
                    error = e.kafka_error
            topic = storage.topics.get(name)
            if topic is None:
                error = error or "UnknownTopicOrPartitionError"
            partitions = [
                MetadataResponse.MetadataResponseTopic.MetadataResponsePartition(
                    error_code=0,
                    partition_index=i,
                    leader_id=s.node_id,
                    leader_epoch=0,
                    replica_nodes=[s.node_id],
                    isr_nodes=[s.node_id],
                    offline_replicas=[],
                )
                for i in range(len(topic.partitions) if topic else 0)
            ]
            topics.append(
                MetadataResponse.MetadataResponseTopic(
                    error_code=_error(error), name=name, is_internal=False, partitions=partitions
                )
            )
        broker = MetadataResponse.MetadataResponseBroker(node_id=s.node_id, host=s.host, port=s.port, rack=None)
        return MetadataResponse(
            version=request.API_VERSION,
            throttle_time_ms=0,
            brokers=[broker],
            cluster_id=s.cluster_id,
            controller_id=s.node_id,
            topics=topics,
        )

    async def produce(self, request: Any, client_host: str) -> Any:
        results = []
        appended = False
        for topic_data in request.topic_data:
            partitions = []
            for data in topic_data.partition_data:
                error, base = None, -1
                partition = self.storage.partition(topic_data.name, data.index)
                if request.transactional_id is not None:
                    error = "TransactionalIdAuthorizationFailedError"
                elif partition is None:
                    error = "UnknownTopicOrPartitionError"
                elif data.records:
                    try:
                        base = partition.append(bytes(data.records))
                        appended = True
                    except CorruptBatchError as e:
                        log.warning("refused a batch for %s-%d: %s", topic_data.name, data.index, e)
                        error = "CorruptRecordError"
                partitions.append(
                    ProduceResponse.TopicProduceResponse.PartitionProduceResponse(
                        index=data.index, error_code=_error(error), base_offset=base, log_append_time_ms=-1, log_start_offset=0
                    )
                )
            results.append(ProduceResponse.TopicProduceResponse(name=topic_data.name, partition_responses=partitions))
        if appended:
            async with self._appended:
                self._appended.notify_all()
        if request.acks == 0:
            return None
        return ProduceResponse(version=request.API_VERSION, responses=results, throttle_time_ms=0)

    async def init_producer_id(self, request: Any, client_host: str) -> Any:
        """A new producer id for an idempotent producer; transactions are refused."""
        if request.transactional_id is not None:
            return InitProducerIdResponse(
                version=request.API_VERSION,
                throttle_time_ms=0,
                error_code=_error("TransactionalIdAuthorizationFailedError"),
                producer_id=-1,
                producer_epoch=-1,
            )
        return InitProducerIdResponse(
            version=request.API_VERSION,
            throttle_time_ms=0,
            error_code=0,
            producer_id=self.storage.new_producer_id(),
            producer_epoch=0,
        )

    def _fetch_once(self, request: Any) -> tuple[list[Any], int]:
        budget = request.max_bytes if request.API_VERSION >= 3 else 1 << 31
        topics, total = [], 0
        for fetch_topic in request.topics:
            partitions = []
            for wanted in fetch_topic.partitions:
                error, records, high = None, b"", -1
                partition = self.storage.partition(fetch_topic.topic, wanted.partition)
                if partition is None:
                    error = "UnknownTopicOrPartitionError"
                elif not 0 <= wanted.fetch_offset <= partition.next_offset:
                    error, high = "OffsetOutOfRangeError", partition.next_offset
                else:
                    high = partition.next_offset
                    limit = min(wanted.partition_max_bytes, max(budget - total, 0))
                    records = partition.read(wanted.fetch_offset, limit) if limit > 0 or total == 0 else b""
                    total += len(records)
                partitions.append(
                    FetchResponse.FetchableTopicResponse.PartitionData(
                        partition_index=wanted.partition,
                        error_code=_error(error),
                        high_watermark=high,
                        last_stable_offset=high,
                        log_start_offset=0,
                        aborted_transactions=[],
                        records=records,
                    )
                )
            topics.append(FetchResponse.FetchableTopicResponse(topic=fetch_topic.topic, partitions=partitions))
        return topics, total

    async def fetch(self, request: Any, client_host: str) -> Any:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + request.max_wait_ms / 1000
        topics, total = self._fetch_once(request)
        while total < max(request.min_bytes, 1) and loop.time() < deadline:
            async with self._appended:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._appended.wait(), deadline - loop.time())
            topics, total = self._fetch_once(request)
        return FetchResponse(version=request.API_VERSION, throttle_time_ms=0, error_code=0, session_id=0, responses=topics)

    async def list_offsets(self, request: Any, client_host: str) -> Any:
        topics = []
        for topic in request.topics:
            partitions = []
            for wanted in topic.partitions:
                error, offset = None, -1
                partition = self.storage.partition(topic.name, wanted.partition_index)
                if partition is None:
                    error = "UnknownTopicOrPartitionError"
                elif wanted.timestamp == LATEST:
                    offset = partition.next_offset
                elif wanted.timestamp == EARLIEST:
                    offset = partition.log_start_offset
                else:
                    offset = partition.offset_for_timestamp(wanted.timestamp)
                partitions.append(
                    ListOffsetsResponse.ListOffsetsTopicResponse.ListOffsetsPartitionResponse(
                        partition_index=wanted.partition_index,
                        error_code=_error(error),
                        timestamp=-1,
                        offset=offset,
                        leader_epoch=0,
                    )
                )
            topics.append(ListOffsetsResponse.ListOffsetsTopicResponse(name=topic.name, partitions=partitions))
        return ListOffsetsResponse(version=request.API_VERSION, throttle_time_ms=0, topics=topics)

    async def find_coordinator(self, request: Any, client_host: str) -> Any:
        s = self.settings
        if request.key_type not in (0, None):  # 1: a transaction coordinator
            return FindCoordinatorResponse(
                version=request.API_VERSION,
                throttle_time_ms=0,
                error_code=_error("CoordinatorNotAvailableError"),
                error_message="transactions are not supported by the embedded broker",
                node_id=-1,
                host="",
                port=-1,
            )
        return FindCoordinatorResponse(
            version=request.API_VERSION,
            throttle_time_ms=0,
            error_code=0,
            error_message=None,
            node_id=s.node_id,
            host=s.host,
            port=s.port,
        )

    async def join_group(self, request: Any, client_host: str) -> Any:
        rebalance_ms = request.rebalance_timeout_ms if request.API_VERSION >= 1 else request.session_timeout_ms
        try:
            joined = await self.coordinator.join(
                request.group_id,
                request.member_id,
                client_id=request.header.client_id or "",
                client_host=client_host,
                session_timeout_s=request.session_timeout_ms / 1000,
                rebalance_timeout_s=rebalance_ms / 1000,
                protocol_type=request.protocol_type,
                protocols=[(p.name, bytes(p.metadata)) for p in request.protocols],
            )
        except GroupError as e:
            return JoinGroupResponse(
                version=request.API_VERSION,
                throttle_time_ms=0,
                error_code=_error(e.kafka_error),
                generation_id=-1,
                protocol_name="",
                leader="",
                member_id=request.member_id,
                members=[],
            )
        members = [
            JoinGroupResponse.JoinGroupResponseMember(member_id=mid, group_instance_id=None, metadata=meta)
            for mid, meta in joined.members
        ]
        return JoinGroupResponse(
            version=request.API_VERSION,
            throttle_time_ms=0,
            error_code=0,
            generation_id=joined.generation,
            protocol_type=joined.protocol_type,
            protocol_name=joined.protocol_name,
            leader=joined.leader,
            member_id=joined.member_id,
            members=members,
        )

    async def sync_group(self, request: Any, client_host: str) -> Any:
        assignments = {a.member_id: bytes(a.assignment) for a in request.assignments}
        error, assignment = None, b""
        try:
            assignment = await self.coordinator.sync(request.group_id, request.generation_id, request.member_id, assignments)
        except GroupError as e:
            error = e.kafka_error
        return SyncGroupResponse(version=request.API_VERSION, throttle_time_ms=0, error_code=_error(error), assignment=assignment)

    async def heartbeat(self, request: Any, client_host: str) -> Any:
        error = None
        try:
            self.coordinator.heartbeat(request.group_id, request.generation_id, request.member_id)
        except GroupError as e:
            error = e.kafka_error
        return HeartbeatResponse(version=request.API_VERSION, throttle_time_ms=0, error_code=_error(error))

    async def leave_group(self, request: Any, client_host: str) -> Any:
        member_ids = [request.member_id] if request.API_VERSION < 3 else [m.member_id for m in request.members]
        errors = self.coordinator.leave(request.group_id, member_ids)
        members = [
            LeaveGroupResponse.MemberResponse(member_id=mid, group_instance_id=None, error_code=_error(e))
            for mid, e in errors.items()
        ]
        first_error = next((e for e in errors.values() if e is not None), None)
        return LeaveGroupResponse(
            version=request.API_VERSION,
            throttle_time_ms=0,
            error_code=_error(first_error) if request.API_VERSION < 3 else 0,
            members=members,
        )

    async def offset_commit(self, request: Any, client_host: str) -> Any:
        error = None
        try:
            self.coordinator.check_commit(request.group_id, request.generation_id_or_member_epoch, request.member_id)
        except GroupError as e:
            error = e.kafka_error
        entries, topics = {}, []
        for topic in request.topics:
            partitions = []
            for p in topic.partitions:
                partition_error = error
                if error is None and self.storage.partition(topic.name, p.partition_index) is None:
                    partition_error = "UnknownTopicOrPartitionError"
                elif error is None:
                    entries[(topic.name, p.partition_index)] = CommittedOffset(p.committed_offset, p.committed_metadata or "")
                partitions.append(
                    OffsetCommitResponse.OffsetCommitResponseTopic.OffsetCommitResponsePartition(
                        partition_index=p.partition_index, error_code=_error(partition_error)
                    )
                )
            topics.append(OffsetCommitResponse.OffsetCommitResponseTopic(name=topic.name, partitions=partitions))
        if entries:
            self.storage.commit(request.group_id, entries)
        return OffsetCommitResponse(version=request.API_VERSION, throttle_time_ms=0, topics=topics)

    async def offset_fetch(self, request: Any, client_host: str) -> Any:
        committed = self.storage.offsets.get(request.group_id, {})
        if request.topics is None:
            wanted: dict[str, list[int]] = {}
            for topic, partition in committed:
                wanted.setdefault(topic, []).append(partition)
        else:
            wanted = {t.name: list(t.partition_indexes) for t in request.topics}
        topic_class = OffsetFetchResponse.OffsetFetchResponseTopic
        topics = []
        for name, partitions in wanted.items():
            rows = []
            for partition in partitions:
                found = committed.get((name, partition))
                rows.append(
                    topic_class.OffsetFetchResponsePartition(
                        partition_index=partition,
                        committed_offset=found.offset if found else -1,
                        committed_leader_epoch=-1,
                        metadata=found.metadata if found else "",
                        error_code=0,
                    )
                )
            topics.append(topic_class(name=name, partitions=rows))
        return OffsetFetchResponse(version=request.API_VERSION, throttle_time_ms=0, topics=topics, error_code=0)

    async def describe_groups(self, request: Any, client_host: str) -> Any:
        described = []
        for group_id in request.groups:
            group = self.coordinator.groups.get(group_id)
            members = [
                DescribeGroupsResponse.DescribedGroup.DescribedGroupMember(
                    member_id=m.member_id,
                    group_instance_id=None,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    member_metadata=m.metadata(group.protocol_name) if group and group.protocol_name else b"",
                    member_assignment=m.assignment,
                )
                for m in (group.members.values() if group else [])
            ]
            described.append(
                DescribeGroupsResponse.DescribedGroup(
                    error_code=0,
                    group_id=group_id,
                    group_state=group.state.value if group else "Dead",
                    protocol_type=group.protocol_type if group else "",
                    protocol_data=group.protocol_name if group else "",
                    members=members,
                )
            )
        return DescribeGroupsResponse(version=request.API_VERSION, throttle_time_ms=0, groups=described)

    async def list_groups(self, request: Any, client_host: str) -> Any:
        known = set(self.coordinator.groups) | set(self.storage.offsets)
        groups = [
            ListGroupsResponse.ListedGroup(
                group_id=g, protocol_type=self.coordinator.groups[g].protocol_type if g in self.coordinator.groups else ""
            )
            for g in sorted(known)
        ]
        return ListGroupsResponse(version=request.API_VERSION, throttle_time_ms=0, error_code=0, groups=groups)

    async def create_topics(self, request: Any, client_host: str) -> Any:
        results = []
        for wanted in request.topics:
            error, message = None, None
            partitions = self.settings.default_partitions if wanted.num_partitions == -1 else wanted.num_partitions
            configs = {c.name: c.value for c in wanted.configs}
            if wanted.replication_factor not in (-1, 1):
                error, message = "InvalidReplicationFactorError", "one broker: replication factor 1 (or -1)"
            elif not request.validate_only:
                try:
                    self.storage.create_topic(wanted.name, partitions, configs)
                except TopicError as e:
                    error, message = e.kafka_error, str(e)
            results.append(
                CreateTopicsResponse.CreatableTopicResult(name=wanted.name, error_code=_error(error), error_message=message)
            )
        return CreateTopicsResponse(version=request.API_VERSION, throttle_time_ms=0, topics=results)

    async def delete_topics(self, request: Any, client_host: str) -> Any:
        results = []
        for name in request.topic_names:
            error = None
            try:
                self.storage.delete_topic(name)
            except TopicError as e:
                error = e.kafka_error
            results.append(DeleteTopicsResponse.DeletableTopicResult(name=name, error_code=_error(error)))
        return DeleteTopicsResponse(version=request.API_VERSION, throttle_time_ms=0, responses=results)


class _CloseConnection(UserError):
    """A request this broker cannot answer: Kafka closes the connection, and so do we."""
