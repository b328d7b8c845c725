"""Logs, traces and metrics with the job, task, attempt and stage on every record.

Each attempt runs inside :func:`attempt_scope`: a context (``contextvars``, so every thread
and log call under it sees the same fields) and an OpenTelemetry span. :func:`setup` makes
the process's logging carry those fields — as JSON lines (``BAGPIPE_LOG_FORMAT=json``) or
text — and, where ``APPLICATIONINSIGHTS_CONNECTION_STRING`` is set (in Azure), sends traces,
logs and metrics to Azure Monitor through ``azure-monitor-opentelemetry``. The same code
logs the same fields locally and in Azure.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from opentelemetry import metrics, trace

from pipeline.redact import protect_logging
from pipeline.settings import Settings

FIELDS = ("job", "task", "attempt", "stage")
_scope: ContextVar[dict[str, Any] | None] = ContextVar("bagpipe_scope", default=None)
tracer = trace.get_tracer("bagpipe")
meter = metrics.get_meter("bagpipe")
attempts_ended = meter.create_counter("bagpipe.attempts", description="attempts ended, by stage and outcome")
attempt_seconds = meter.create_histogram("bagpipe.attempt.duration", unit="s",
                                         description="runtime of attempts, by stage and outcome")


@contextmanager
def attempt_scope(job: str, task: str, attempt: int, stage: str) -> Iterator[trace.Span]:
    """Everything logged or traced inside belongs to this attempt."""
    fields: dict[str, str | int] = {"job": job, "task": task, "attempt": attempt, "stage": stage}
    token = _scope.set(fields)
    try:
        with tracer.start_as_current_span(f"attempt {stage}", attributes={f"bagpipe.{k}": v
                                                                          for k, v in fields.items()}) as span:
            yield span
    finally:
        _scope.reset(token)


def attempt_ended(stage: str, outcome: str, seconds: float) -> None:
    """Count an ended attempt and its runtime (the metrics behind the job page's histogram)."""
    labels = {"bagpipe.stage": stage, "bagpipe.outcome": outcome}
    attempts_ended.add(1, labels)
    attempt_seconds.record(seconds, labels)


class ScopeFilter(logging.Filter):
    """Puts the attempt's fields on every record (as ``record.job`` … for formatters, and
    so as attributes of the OpenTelemetry log record)."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = _scope.get() or {}
        for name in FIELDS:
            if not hasattr(record, name):
                setattr(record, name, fields.get(name, ""))
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the attempt's fields, and the
    exception if any."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname, "logger": record.name, "message": record.getMessage(),
        }
        line |= {name: getattr(record, name, "") for name in FIELDS}
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line)


TEXT = "%(asctime)s %(levelname)s %(name)s [%(job)s %(task)s %(attempt)s %(stage)s]: %(message)s"


def setup(settings: Settings, verbose: bool = False) -> None:
    """The process's logging (and, in Azure, its OpenTelemetry export)."""
    root = logging.getLogger()
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    if not any(getattr(h, "_bagpipe", False) for h in root.handlers):
        handler = logging.StreamHandler()
        handler._bagpipe = True  # type: ignore[attr-defined]  # our mark: set up once per process
        handler.setFormatter(JsonFormatter() if settings.log_format == "json" else logging.Formatter(TEXT))
        root.addHandler(handler)
    for noisy in ("azure", "mail.log", "opentelemetry", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if settings.appinsights_connection:
        from azure.monitor.opentelemetry import configure_azure_monitor

        # every attempt's trace is kept (the default rate limit, a few traces a second,
        # would drop most of a busy worker's)
        configure_azure_monitor(connection_string=settings.appinsights_connection,
                                enable_live_metrics=False, sampling_ratio=1.0)
    for each in root.handlers:  # every handler, the exporter's too, sees the fields
        if not any(isinstance(f, ScopeFilter) for f in each.filters):
            each.addFilter(ScopeFilter())
    protect_logging()  # and none writes a credential
