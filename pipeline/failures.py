"""Failure classes of an attempt (the ModisAzure paper's Table 2 and ours), and how an
exception is classified."""

from __future__ import annotations

import errno
import socket
from enum import Enum, StrEnum

from azure.core.exceptions import (
    HttpResponseError,
    IncompleteReadError,
    ResourceExistsError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)


class FailureClass(StrEnum):
    SOURCE_DOWNLOAD = "source_download_failed"  # an archive did not deliver a source file
    BAD_SOURCE = "source_unreadable"  # a delivered source is not the raster it should be
    BLOB_READ = "blob_read_failed"  # a blob could not be read (missing, refused)
    CORRUPT_BLOB = "corrupt_blob_read"  # a blob's content did not match its checksum
    BLOB_EXISTS = "blob_already_exists"  # a write found its blob already there
    CONNECTION = "connection_failure"  # storage or an archive could not be reached
    SERVER_BUSY = "server_busy"  # storage throttled (503/500)
    OPERATION_TIMEOUT = "operation_timeout"  # a storage call timed out
    EXECUTION_TIMEOUT = "execution_timeout"  # the monitor revoked an overdue attempt
    HEARTBEAT_LOST = "heartbeat_lost"  # the attempt's worker stopped heartbeating
    WORKER_SLOW = "worker_slow"  # its worker was found slow and gave the attempt up to another
    USER_CODE = "user_code_error"  # a stage or reduction program failed on its own
    DEPENDENCY_FAILED = "dependency_failed"  # a reduction's tile tasks did not all succeed
    OUT_OF_DISK = "out_of_disk_space"  # the worker's disk is full
    UNKNOWN = "unknown"  # none of the above

    @property
    def transient(self) -> bool:
        """Whether a retry may well succeed (the cause is not the data itself)."""
        return self in TRANSIENT


TRANSIENT = frozenset(
    {
        FailureClass.CONNECTION,
        FailureClass.SERVER_BUSY,
        FailureClass.OPERATION_TIMEOUT,
        FailureClass.CORRUPT_BLOB,
        FailureClass.EXECUTION_TIMEOUT,
        FailureClass.HEARTBEAT_LOST,
        FailureClass.WORKER_SLOW,
        FailureClass.BLOB_READ,
    }
)


class StageFailure(Exception):
    """A failure a stage classifies itself (e.g. an archive that refused a source)."""

    def __init__(self, failure: FailureClass, message: str) -> None:
        super().__init__(message)
        self.failure = failure


def error_code(exc: BaseException) -> str | None:
    """The storage error code of a failed call (``x-ms-error-code``), if it has one: the
    storage SDKs set it on the exceptions they raise, azure-core does not declare it."""
    code = getattr(exc, "error_code", None)
    if isinstance(code, Enum):  # the blob and table SDKs' error code enums: their wire value
        code = code.value
    return str(code) if code is not None else None


def classify(exc: BaseException) -> FailureClass:
    """The failure class of an exception raised while running an attempt."""
    if isinstance(exc, StageFailure):
        return exc.failure
    if isinstance(exc, ResourceExistsError):
        return FailureClass.BLOB_EXISTS
    if isinstance(exc, ResourceNotFoundError):
        return FailureClass.BLOB_READ
    if isinstance(exc, (ServiceRequestError, ConnectionError, IncompleteReadError)):
        return FailureClass.CONNECTION
    if isinstance(exc, ServiceResponseError):
        return FailureClass.OPERATION_TIMEOUT if "timed out" in str(exc) else FailureClass.CONNECTION
    if isinstance(exc, HttpResponseError):
        if exc.status_code is None and exc.__cause__ is not None:  # the SDK's wrap of a broken read
            return classify(exc.__cause__)
        if exc.status_code in (500, 503):
            return FailureClass.SERVER_BUSY
        if exc.status_code == 408:
            return FailureClass.OPERATION_TIMEOUT
        return FailureClass.BLOB_READ
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return FailureClass.OPERATION_TIMEOUT
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return FailureClass.OUT_OF_DISK
    if isinstance(exc, (ValueError, TypeError, KeyError, ArithmeticError, RuntimeError)):
        return FailureClass.USER_CODE
    return FailureClass.UNKNOWN
