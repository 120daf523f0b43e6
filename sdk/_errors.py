"""Typed errors of the SDK, built from the service's problem documents (docs/pages/http-api.md,
Error codes).

Every error the SDK raises is a `KafkaException`. Its typed attributes (`code`, `status`,
`detail`, `retriable`, `txn_requires_abort`, `fatal`) say what happened and what to do; for
code ported from confluent-kafka, `exc.args[0]` is a `KafkaError` with the same methods
(`code()`, `retriable()`, `txn_requires_abort()`, `fatal()`, `str()`).

    KafkaException                       every SDK error; args[0] is a KafkaError
     ├── ConfigError (also ValueError)   a configuration key or value refused (_INVALID_ARG)
     ├── IllegalStateError               a call not allowed in the client's state (_STATE)
     ├── KafkaTimeoutError               a call's timeout passed first; retriable (_TIMED_OUT)
     ├── TransportError                  no answer from the service; retriable (_TRANSPORT)
     ├── MessageTimedOut                 a record not delivered in delivery.timeout.ms
     ├── MessagePurged                   a record dropped by abort_transaction (_PURGE_QUEUE)
     ├── MessageSizeTooLarge             a record over message.max.bytes
     └── ServiceError                    the service answered with a problem document
          ├── RetriableError             retriable: send the same request again
          │    ├── CoordinatorNotAvailable, ConcurrentTransactions,
          │    ├── UnstableOffsetCommit, InternalError
          │    └── EffectClaimed         another owner holds the side effect's lease
          ├── FatalError                 fatal: close the producer; a new one may start over
          │    ├── ProducerFenced, InvalidProducerEpoch, InvalidProducerIdMapping
          │    └── TransactionalIdAuthorizationFailed
          ├── TransactionTimedOut        the coordinator aborted the transaction: init again
          ├── UnknownProducerId          producer state gone (KIP-360): abort, or a new pid
          ├── OutOfOrderSequenceNumber   a gap in sequence numbers: abort, or a new pid
          ├── InvalidTxnState, TransactionalIdNotFound, InvalidTransactionTimeout
          ├── FencedClaim                the side effect's claim was lost to another owner
          ├── EffectNotFound             no claim and no result for the key
          ├── UnknownMemberId, FencedMemberEpoch   a group member fenced: rejoin (KIP-447)
          ├── GroupIdNotFound, NonEmptyGroup
          ├── UnknownTopicOrPartition, TopicAlreadyExists, RecordListTooLarge
          ├── AuthenticationFailed, AuthorizationFailed
          └── InvalidRequest, NotFound

`retriable`, `fatal` and `txn_requires_abort` default per class; an error that fails a record
inside a transaction carries `txn_requires_abort=True` whatever its class, as in librdkafka.
"""

from __future__ import annotations

import builtins
from typing import Any, ClassVar

__all__ = [
    "AuthenticationFailed",
    "AuthorizationFailed",
    "ConcurrentTransactions",
    "ConfigError",
    "CoordinatorNotAvailable",
    "EffectClaimed",
    "EffectNotFound",
    "FatalError",
    "FencedClaim",
    "FencedMemberEpoch",
    "GroupIdNotFound",
    "IllegalStateError",
    "InternalError",
    "InvalidProducerEpoch",
    "InvalidProducerIdMapping",
    "InvalidRequest",
    "InvalidTransactionTimeout",
    "InvalidTxnState",
    "KafkaError",
    "KafkaException",
    "KafkaTimeoutError",
    "MessagePurged",
    "MessageSizeTooLarge",
    "MessageTimedOut",
    "NonEmptyGroup",
    "NotFound",
    "OutOfOrderSequenceNumber",
    "ProducerFenced",
    "RecordListTooLarge",
    "RetriableError",
    "ServiceError",
    "TopicAlreadyExists",
    "TransactionTimedOut",
    "TransactionalIdAuthorizationFailed",
    "TransactionalIdNotFound",
    "TransportError",
    "UnknownMemberId",
    "UnknownProducerId",
    "UnknownTopicOrPartition",
    "UnstableOffsetCommit",
    "error_for",
]


class KafkaError:
    """An error value with confluent-kafka's methods: what delivery callbacks receive as `err`,
    what `Message.error()` returns, and `args[0]` of every `KafkaException`.

    Codes are strings: the API's codes (`KafkaError.PRODUCER_FENCED == "PRODUCER_FENCED"`) and,
    for conditions found by the client, confluent-kafka's underscore names (`_PARTITION_EOF`).
    """

    # Client-side conditions, named as in confluent-kafka.
    _PARTITION_EOF: ClassVar[str] = "_PARTITION_EOF"
    _TIMED_OUT: ClassVar[str] = "_TIMED_OUT"
    _MSG_TIMED_OUT: ClassVar[str] = "_MSG_TIMED_OUT"
    _PURGE_QUEUE: ClassVar[str] = "_PURGE_QUEUE"
    _MSG_SIZE_TOO_LARGE: ClassVar[str] = "_MSG_SIZE_TOO_LARGE"
    _STATE: ClassVar[str] = "_STATE"
    _TRANSPORT: ClassVar[str] = "_TRANSPORT"
    _INVALID_ARG: ClassVar[str] = "_INVALID_ARG"
    _AUTO_OFFSET_RESET: ClassVar[str] = "_AUTO_OFFSET_RESET"
    _BAD_MSG: ClassVar[str] = "_BAD_MSG"
    _MAX_POLL_EXCEEDED: ClassVar[str] = "_MAX_POLL_EXCEEDED"
    # The API's codes.
    INVALID_REQUEST: ClassVar[str] = "INVALID_REQUEST"
    INVALID_TRANSACTION_TIMEOUT: ClassVar[str] = "INVALID_TRANSACTION_TIMEOUT"
    UNKNOWN_TOPIC_OR_PARTITION: ClassVar[str] = "UNKNOWN_TOPIC_OR_PARTITION"
    TRANSACTIONAL_ID_NOT_FOUND: ClassVar[str] = "TRANSACTIONAL_ID_NOT_FOUND"
    TOPIC_ALREADY_EXISTS: ClassVar[str] = "TOPIC_ALREADY_EXISTS"
    PRODUCER_FENCED: ClassVar[str] = "PRODUCER_FENCED"
    TRANSACTION_TIMED_OUT: ClassVar[str] = "TRANSACTION_TIMED_OUT"
    INVALID_PRODUCER_EPOCH: ClassVar[str] = "INVALID_PRODUCER_EPOCH"
    INVALID_PRODUCER_ID_MAPPING: ClassVar[str] = "INVALID_PRODUCER_ID_MAPPING"
    INVALID_TXN_STATE: ClassVar[str] = "INVALID_TXN_STATE"
    CONCURRENT_TRANSACTIONS: ClassVar[str] = "CONCURRENT_TRANSACTIONS"
    OUT_OF_ORDER_SEQUENCE_NUMBER: ClassVar[str] = "OUT_OF_ORDER_SEQUENCE_NUMBER"
    UNKNOWN_PRODUCER_ID: ClassVar[str] = "UNKNOWN_PRODUCER_ID"
    UNSTABLE_OFFSET_COMMIT: ClassVar[str] = "UNSTABLE_OFFSET_COMMIT"
    UNKNOWN_MEMBER_ID: ClassVar[str] = "UNKNOWN_MEMBER_ID"
    FENCED_MEMBER_EPOCH: ClassVar[str] = "FENCED_MEMBER_EPOCH"
    GROUP_ID_NOT_FOUND: ClassVar[str] = "GROUP_ID_NOT_FOUND"
    NON_EMPTY_GROUP: ClassVar[str] = "NON_EMPTY_GROUP"
    RECORD_LIST_TOO_LARGE: ClassVar[str] = "RECORD_LIST_TOO_LARGE"
    EFFECT_CLAIMED: ClassVar[str] = "EFFECT_CLAIMED"
    FENCED_CLAIM: ClassVar[str] = "FENCED_CLAIM"
    EFFECT_NOT_FOUND: ClassVar[str] = "EFFECT_NOT_FOUND"
    CORRUPT_MESSAGE: ClassVar[str] = "CORRUPT_MESSAGE"
    INVALID_RECORD: ClassVar[str] = "INVALID_RECORD"
    INVALID_CONFIG: ClassVar[str] = "INVALID_CONFIG"
    OFFSET_OUT_OF_RANGE: ClassVar[str] = "OFFSET_OUT_OF_RANGE"
    COORDINATOR_NOT_AVAILABLE: ClassVar[str] = "COORDINATOR_NOT_AVAILABLE"
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED: ClassVar[str] = "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
    TOPIC_AUTHORIZATION_FAILED: ClassVar[str] = "TOPIC_AUTHORIZATION_FAILED"
    GROUP_AUTHORIZATION_FAILED: ClassVar[str] = "GROUP_AUTHORIZATION_FAILED"
    CLUSTER_AUTHORIZATION_FAILED: ClassVar[str] = "CLUSTER_AUTHORIZATION_FAILED"
    UNAUTHENTICATED: ClassVar[str] = "UNAUTHENTICATED"
    NOT_FOUND: ClassVar[str] = "NOT_FOUND"
    METHOD_NOT_ALLOWED: ClassVar[str] = "METHOD_NOT_ALLOWED"
    INTERNAL_ERROR: ClassVar[str] = "INTERNAL_ERROR"

    __slots__ = ("_code", "_fatal", "_reason", "_retriable", "_status", "_txn_requires_abort")

    def __init__(
        self,
        code: str,
        reason: str = "",
        *,
        fatal: bool = False,
        retriable: bool = False,
        txn_requires_abort: bool = False,
        status: int | None = None,
    ) -> None:
        self._code = code
        self._reason = reason or code
        self._fatal = fatal
        self._retriable = retriable
        self._txn_requires_abort = txn_requires_abort
        self._status = status

    def code(self) -> str:
        return self._code

    def name(self) -> str:
        return self._code

    def str(self) -> str:
        return self._reason

    def fatal(self) -> bool:
        return self._fatal

    def retriable(self) -> bool:
        return self._retriable

    def txn_requires_abort(self) -> bool:
        return self._txn_requires_abort

    def status(self) -> int | None:
        """The HTTP status of the service's answer, or None for a client-side condition."""
        return self._status

    def exception(self) -> KafkaException:
        """The typed exception for this error (its class chosen by the code), ready to raise."""
        return _class_for(self._code)(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, KafkaError):
            return self._code == other._code
        if isinstance(other, str):
            return self._code == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._code)

    def __str__(self) -> builtins.str:
        return f"{self._code}: {self._reason}" if self._reason != self._code else self._code

    def __repr__(self) -> builtins.str:
        flags = [n for n in ("fatal", "retriable", "txn_requires_abort") if getattr(self, "_" + n)]
        shown = "".join(f", {flag}=True" for flag in flags)
        return f"KafkaError({self._code!r}, {self._reason!r}{shown})"


class KafkaException(Exception):
    """Root of every error the SDK raises. See the module docstring for the tree.

    Construct with a detail sentence (the class supplies code and flags) or, as in
    confluent-kafka, with a `KafkaError` (`raise KafkaException(msg.error())`).
    """

    default_code: ClassVar[str] = "_UNKNOWN"
    default_retriable: ClassVar[bool] = False
    default_fatal: ClassVar[bool] = False
    default_txn_requires_abort: ClassVar[bool] = False

    def __init__(
        self,
        error: KafkaError | str,
        *,
        code: str | None = None,
        status: int | None = None,
        retriable: bool | None = None,
        fatal: bool | None = None,
        txn_requires_abort: bool | None = None,
    ) -> None:
        if isinstance(error, str):
            error = KafkaError(
                code or self.default_code,
                error,
                fatal=self.default_fatal if fatal is None else fatal,
                retriable=self.default_retriable if retriable is None else retriable,
                txn_requires_abort=(
                    self.default_txn_requires_abort
                    if txn_requires_abort is None
                    else txn_requires_abort
                ),
                status=status,
            )
        super().__init__(error)
        self.error: KafkaError = error

    @property
    def code(self) -> str:
        return self.error.code()

    @property
    def status(self) -> int | None:
        return self.error.status()

    @property
    def detail(self) -> str:
        return self.error.str()

    @property
    def retriable(self) -> bool:
        return self.error.retriable()

    @property
    def fatal(self) -> bool:
        return self.error.fatal()

    @property
    def txn_requires_abort(self) -> bool:
        return self.error.txn_requires_abort()

    def with_abort_required(self) -> KafkaException:
        """The same error, marked as failing the current transaction (caller must abort)."""
        return type(self)(
            self.detail,
            code=self.code,
            status=self.status,
            retriable=False,
            fatal=self.fatal,
            txn_requires_abort=not self.fatal,
        )

    def __str__(self) -> str:
        return str(self.error)


class ConfigError(KafkaException, ValueError):
    """A configuration key or value the SDK refuses; fix the configuration."""

    default_code = KafkaError._INVALID_ARG


class IllegalStateError(KafkaException):
    """A call not allowed in the client's current state (closed, or the wrong transaction
    state, e.g. `produce()` before `begin_transaction()`); a bug in the calling code."""

    default_code = KafkaError._STATE


class KafkaTimeoutError(KafkaException):
    """The call's timeout passed before it finished; the same call may be made again."""

    default_code = KafkaError._TIMED_OUT
    default_retriable = True


class TransportError(KafkaException):
    """The service could not be reached, or no answer came back; retriable. A request that
    changes state may or may not have been applied."""

    default_code = KafkaError._TRANSPORT
    default_retriable = True


class MessageTimedOut(KafkaException):
    """A record was not acknowledged within `delivery.timeout.ms`; it may have been written."""

    default_code = KafkaError._MSG_TIMED_OUT


class MessagePurged(KafkaException):
    """A record was dropped before it was sent, by `abort_transaction()` or `close()`."""

    default_code = KafkaError._PURGE_QUEUE


class MessageSizeTooLarge(KafkaException):
    """A record larger than `message.max.bytes`; it was not queued."""

    default_code = KafkaError._MSG_SIZE_TOO_LARGE


class ServiceError(KafkaException):
    """The service answered with a problem document; `status` is its HTTP status."""


class RetriableError(ServiceError):
    """The service asks for the same request again; the SDK already retried until its timeout."""

    default_retriable = True


class CoordinatorNotAvailable(RetriableError):
    default_code = KafkaError.COORDINATOR_NOT_AVAILABLE


class ConcurrentTransactions(RetriableError):
    default_code = KafkaError.CONCURRENT_TRANSACTIONS


class UnstableOffsetCommit(RetriableError):
    """A transaction still holds pending offsets for the partitions asked about."""

    default_code = KafkaError.UNSTABLE_OFFSET_COMMIT


class EffectClaimed(RetriableError):
    """Another owner holds the side effect's lease (its `detail` names the owner and when the
    lease ends): wait until it completes (then its result is yours) or its lease runs out."""

    default_code = KafkaError.EFFECT_CLAIMED


class InternalError(RetriableError):
    """A bug in the service; nothing was changed."""

    default_code = KafkaError.INTERNAL_ERROR


class FatalError(ServiceError):
    """The producer cannot go on: close it. Its open transaction is (or will be) aborted."""

    default_fatal = True


class ProducerFenced(FatalError):
    """A newer producer with the same transactional.id exists (this one is a zombie)."""

    default_code = KafkaError.PRODUCER_FENCED


class InvalidProducerEpoch(FatalError):
    default_code = KafkaError.INVALID_PRODUCER_EPOCH


class InvalidProducerIdMapping(FatalError):
    default_code = KafkaError.INVALID_PRODUCER_ID_MAPPING


class TransactionalIdAuthorizationFailed(FatalError):
    default_code = KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


class TransactionTimedOut(ServiceError):
    """The coordinator aborted the transaction because it outlived `transaction.timeout.ms`.
    Call `init_transactions()` again (this fences any other instance with the same
    transactional.id), then begin a new transaction from the last committed input offsets."""

    default_code = KafkaError.TRANSACTION_TIMED_OUT


class UnknownProducerId(ServiceError):
    """The service no longer has this producer's state on a partition (KIP-360). An idempotent
    producer recovers by itself with a new producer id; a transactional one must abort."""

    default_code = KafkaError.UNKNOWN_PRODUCER_ID
    default_txn_requires_abort = True


class OutOfOrderSequenceNumber(ServiceError):
    default_code = KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER
    default_txn_requires_abort = True


class UnknownMemberId(ServiceError):
    """Not (or no longer) a member of the group: it left, or its session or rebalance timeout
    passed. Nothing was committed. A subscribed consumer rejoins by itself (its partitions are
    lost: `on_lost`); inside a transaction, abort it and rewind to the committed offsets."""

    default_code = KafkaError.UNKNOWN_MEMBER_ID


class FencedMemberEpoch(ServiceError):
    """The member's epoch is stale, or it does not own a partition it committed (it was given to
    another member). Nothing was committed; as for `UnknownMemberId`."""

    default_code = KafkaError.FENCED_MEMBER_EPOCH


class GroupIdNotFound(ServiceError):
    default_code = KafkaError.GROUP_ID_NOT_FOUND


class NonEmptyGroup(ServiceError):
    """The group still has members; they must leave before it can be deleted."""

    default_code = KafkaError.NON_EMPTY_GROUP


class InvalidTxnState(ServiceError):
    default_code = KafkaError.INVALID_TXN_STATE


class TransactionalIdNotFound(ServiceError):
    default_code = KafkaError.TRANSACTIONAL_ID_NOT_FOUND


class InvalidTransactionTimeout(ServiceError):
    default_code = KafkaError.INVALID_TRANSACTION_TIMEOUT


class FencedClaim(ServiceError):
    """The fencing token is no longer the key's current one: the lease ran out and another owner
    claimed the key (or it was released). Nothing was stored; the effect may have happened
    twice unless the outside system checked the fencing token."""

    default_code = KafkaError.FENCED_CLAIM


class EffectNotFound(ServiceError):
    """The key has no claim and no result (never claimed, released, or expired)."""

    default_code = KafkaError.EFFECT_NOT_FOUND


class UnknownTopicOrPartition(ServiceError):
    default_code = KafkaError.UNKNOWN_TOPIC_OR_PARTITION


class TopicAlreadyExists(ServiceError):
    default_code = KafkaError.TOPIC_ALREADY_EXISTS


class RecordListTooLarge(ServiceError):
    default_code = KafkaError.RECORD_LIST_TOO_LARGE


class AuthenticationFailed(ServiceError):
    """No token, or one the service does not know (`coordinator.token`)."""

    default_code = KafkaError.UNAUTHENTICATED


class AuthorizationFailed(ServiceError):
    """The token's principal may not do this (topic, group or cluster)."""

    default_code = KafkaError.TOPIC_AUTHORIZATION_FAILED


class InvalidRequest(ServiceError):
    default_code = KafkaError.INVALID_REQUEST


class NotFound(ServiceError):
    """No such path or method on the service (an older service, or a wrong URL)."""

    default_code = KafkaError.NOT_FOUND


_BY_CODE: dict[str, type[KafkaException]] = {
    cls.default_code: cls
    for cls in (
        ConfigError,
        IllegalStateError,
        KafkaTimeoutError,
        TransportError,
        MessageTimedOut,
        MessagePurged,
        MessageSizeTooLarge,
        CoordinatorNotAvailable,
        ConcurrentTransactions,
        UnstableOffsetCommit,
        InternalError,
        EffectClaimed,
        FencedClaim,
        EffectNotFound,
        ProducerFenced,
        InvalidProducerEpoch,
        InvalidProducerIdMapping,
        TransactionalIdAuthorizationFailed,
        TransactionTimedOut,
        UnknownProducerId,
        OutOfOrderSequenceNumber,
        InvalidTxnState,
        TransactionalIdNotFound,
        InvalidTransactionTimeout,
        UnknownMemberId,
        FencedMemberEpoch,
        GroupIdNotFound,
        NonEmptyGroup,
        UnknownTopicOrPartition,
        TopicAlreadyExists,
        RecordListTooLarge,
        AuthenticationFailed,
        InvalidRequest,
        NotFound,
    )
}
_BY_CODE.update(
    {
        KafkaError.GROUP_AUTHORIZATION_FAILED: AuthorizationFailed,
        KafkaError.TOPIC_AUTHORIZATION_FAILED: AuthorizationFailed,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED: AuthorizationFailed,
        KafkaError.METHOD_NOT_ALLOWED: NotFound,
    }
)


def _class_for(code: str) -> type[KafkaException]:
    # A code the table does not know: the service's (upper case) or the client's ("_X").
    fallback = KafkaException if code.startswith("_") else ServiceError
    return _BY_CODE.get(code, fallback)


def error_for(code: str, detail: str, status: int | None = None, **flags: Any) -> KafkaException:
    """The typed exception for an API code; `flags` (retriable, fatal, txn_requires_abort)
    override the class defaults, e.g. with the `retriable` the service put in its answer."""
    return _class_for(code)(detail, code=code, status=status, **flags)
