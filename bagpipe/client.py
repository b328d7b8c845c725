"""The command line's HTTP client of the request API, and the download of results."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bagpipe.stack import STATE_FILE, api_key_for

DEFAULT_HOME = Path(".bagpipe")


class ApiError(RuntimeError):
    def __init__(self, status: int, body: Any) -> None:
        detail = body.get("detail") if isinstance(body, dict) else body
        super().__init__(f"HTTP {status}: {detail}")
        self.status, self.body = status, body


@dataclass
class Api:
    url: str
    key: str
    timeout: float = 60.0

    @classmethod
    def resolve(cls, url: str | None = None, key: str | None = None,
                home: Path = DEFAULT_HOME) -> Api:
        """The API to talk to: flags, else BAGPIPE_API_URL/BAGPIPE_API_KEY, else the local
        stack started by ``bagpipe up`` in ``home``."""
        url = url or os.environ.get("BAGPIPE_API_URL")
        key = key or os.environ.get("BAGPIPE_API_KEY")
        state = home / STATE_FILE
        if not url and state.exists():
            url = json.loads(state.read_text())["api"]
        if not key and (home / "api-key").exists():
            key = api_key_for(home)
        if not url or not key:
            raise RuntimeError("no API: start `bagpipe up`, or pass --api and --key")
        return cls(url.rstrip("/"), key)

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = httpx.request(method, f"{self.url}{path}", timeout=self.timeout,
                                 headers={"x-functions-key": self.key}, **kwargs)
        try:
            body = response.json() if response.content else None
        except ValueError:
            body = response.text
        if response.status_code >= 400:
            raise ApiError(response.status_code, body)
        return body

    def submit(self, request: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/api/jobs", json=request)

    def status(self, job: str) -> dict[str, Any]:
        return self._call("GET", f"/api/jobs/{job}")

    def cancel(self, job: str) -> dict[str, Any]:
        return self._call("POST", f"/api/jobs/{job}/cancel")

    def results(self, job: str) -> dict[str, Any]:
        return self._call("GET", f"/api/jobs/{job}/results")


def download_results(api: Api, job: str, out: Path) -> tuple[Path, int]:
    """Download every product of a finished job into ``out`` (as product/tile/date/name)
    and write ``manifest.json`` naming the local files. Returns (manifest path, files)."""
    found = api.results(job)
    out.mkdir(parents=True, exist_ok=True)
    files = 0
    with httpx.Client(timeout=api.timeout) as http:
        for task in found["tasks"]:
            task["files"] = []
            for blob, link in task.pop("links", {}).items():
                span = f"{task['date']}_{task['last']}" if task.get("last") else task["date"]  # a reduction
                local = Path(task["product"], task["tile"], span, blob.rsplit("/", 1)[-1])
                target = out / local
                target.parent.mkdir(parents=True, exist_ok=True)
                with http.stream("GET", link) as response:
                    response.raise_for_status()
                    with open(target, "wb") as f:
                        for chunk in response.iter_bytes():
                            f.write(chunk)
                task["files"].append(str(local))
                files += 1
    found.pop("manifest_url", None)
    manifest = out / "manifest.json"
    manifest.write_text(json.dumps(found, indent=1))
    return manifest, files
