"""Credentials out of every text bagpipe keeps or shows: error messages on task and attempt
rows, the portal's view, log lines and telemetry.

A source URL may carry a SAS signature (``?...&sig=...``), an FTP ``user:password@``, an
access token or a subscription key in its query; an exception may quote a connection string,
an ``Authorization`` header or Planetary Computer's ``Ocp-Apim-Subscription-Key``.
:func:`redact` replaces the secret part and keeps the rest (the host, the path, the SAS's
expiry), so that an error still says what failed where.
"""

from __future__ import annotations

import logging
import re

MASK = "***"

# scheme://user:password@host -> scheme://***@host (a user alone is kept: it is no secret)
_USERINFO = re.compile(r"(?P<scheme>\b[a-z][a-z0-9+.-]*://)[^/\s@:?#]*:[^/\s@?#]*@", re.IGNORECASE)
# query parameters that carry a secret: a SAS's signature, tokens, keys, passwords
_QUERY = re.compile(
    r"(?P<name>[?&;](?:sig|signature|token|access_token|id_token|refresh_token|code|api[-_]?key|key|"
    r"password|passwd|secret|client_secret|x-functions-key|subscription-key)=)[^&\s#\"'<>]+",
    re.IGNORECASE,
)
# header-like and connection-string-like secrets
_BEARER = re.compile(r"(?P<name>\b(?:Bearer|Basic)\s+)[A-Za-z0-9._~+/=-]{8,}")
_PAIRS = re.compile(
    r"(?P<name>\b(?:AccountKey|SharedAccessSignature|SharedAccessKey|Password|Pwd|ClientSecret|"
    r"x-functions-key|x-bagpipe-token|x-ms-token-aad-[a-z-]+|x-ms-(?:copy-source-)?authorization|Authorization|"
    r"Ocp-Apim-Subscription-Key)"
    r"['\"]?\s*[=:]\s*['\"]?)[^;,\s'\"]+",  # a header's name quoted too: a dict of headers, printed
    re.IGNORECASE,
)
# a personal API token anywhere (pipeline.web.identity): its id is kept, its secret is not
_TOKEN = re.compile(r"\b(?P<name>bgp_[0-9a-f]{16}_)[A-Za-z0-9_-]{43}")


def redact(text: str) -> str:
    """``text`` with every credential it quotes replaced by ``***``."""
    if not text:
        return text
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", text)
    text = _QUERY.sub(lambda m: f"{m['name']}{MASK}", text)
    text = _BEARER.sub(lambda m: f"{m['name']}{MASK}", text)
    text = _TOKEN.sub(lambda m: f"{m['name']}{MASK}", text)
    return _PAIRS.sub(lambda m: f"{m['name']}{MASK}", text)


class RedactingFilter(logging.Filter):
    """A logging filter that redacts each record's message (with its arguments merged in)
    and its exception text, so no handler ever writes a credential."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def protect_logging() -> None:
    """Put the redacting filter on every handler of the root logger (and on the handler of
    last resort), so that nothing this process logs carries a credential."""
    for handler in [*logging.getLogger().handlers, logging.lastResort]:
        if handler is not None and not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
