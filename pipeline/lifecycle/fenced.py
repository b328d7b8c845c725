"""The fenced write: a conditional write that leaves a mark on the row it is fenced on, settled
by reading that row back whenever its answer is not a plain yes.

Every row whose writes race — a task row (claims, commits, failures, revocations), a job row
(the releaser's lease, the finisher's hold, its mail, its end) — carries ``LastWrite``, a
random mark each of these writes sets. A write refused (412, or a transaction refused on any
of its rows) or left unanswered (a connection reset, storage restarting, a 5xx) may still
have applied: the storage client retries a request whose answer it lost, and its retry of a
write that applied is refused, since that write changed the row. So the row is read back,
and the write is its own exactly when the row shows its mark: never guessed, never retried
blindly into a 412 that would make an applied write look like a lost race. What a caller
does with a write that did not apply — read the row and try again, take another path, give
up — is its own; only the settling is here.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ResourceModifiedError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.data.tables import TableTransactionError

READ_TRIES = 10  # reads of the row back while storage does not answer (waits 1, 2, 4 … 10 s)


class Marked(Protocol):
    """A row type that keeps the mark of its last fenced write."""

    @property
    def last_write(self) -> str: ...


A = TypeVar("A")
R = TypeVar("R", bound=Marked)


@dataclass(frozen=True)
class Written(Generic[A, R]):
    """How a fenced write ended: ``applied`` or not; its own ``answer`` when it came, else
    the row as read back (``back``) and the error that stood in for the answer (``error``)."""

    applied: bool
    answer: A | None = None
    back: R | None = None
    error: AzureError | None = None

    @property
    def row(self) -> R:
        """The row as read back after an unsure answer (there is none after a plain yes)."""
        if self.back is None:
            raise ValueError("the write was answered: no row was read back")
        return self.back

    @property
    def unanswered(self) -> bool:
        """Whether the error was a lost answer (no answer at all, or a 5xx), not a refusal."""
        return isinstance(self.error, (ServiceRequestError, ServiceResponseError)) or (
            isinstance(self.error, HttpResponseError) and not isinstance(self.error, TableTransactionError)
            and (self.error.status_code or 0) >= 500)


def mark() -> str:
    """A new write's mark."""
    return uuid.uuid4().hex


def unsure(exc: AzureError) -> bool:
    """Whether a write that raised ``exc`` may have applied, or was refused on a condition:
    either way only the row read back can say."""
    if isinstance(exc, (ServiceRequestError, ServiceResponseError, TableTransactionError, ResourceModifiedError)):
        return True
    return isinstance(exc, HttpResponseError) and ((exc.status_code or 0) == 412 or (exc.status_code or 0) >= 500)


def write(submit: Callable[[], A], read_back: Callable[[], R], its_mark: str) -> Written[A, R]:
    """Make the write ``submit`` (which sets ``its_mark`` on the row ``read_back`` reads);
    when it raises an error after which it may have applied (:func:`unsure`), read the row
    back — again and again while storage does not answer — and say whether the write is
    there. Any other error is the caller's."""
    try:
        return Written(True, answer=submit())
    except AzureError as exc:
        if not unsure(exc):
            raise
        back = _read(read_back)
        return Written(back.last_write == its_mark, back=back, error=exc)


def _read(read_back: Callable[[], R]) -> R:
    for attempt in range(READ_TRIES):
        try:
            return read_back()
        except (ServiceRequestError, ServiceResponseError):
            time.sleep(min(2**attempt, 10))
    return read_back()
