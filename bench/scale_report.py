"""What ``bench.scale`` writes: its parts' results, a Markdown section each, assembled into
``docs/scale.md`` with their plots (matplotlib, Agg, PNG beside it)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after the backend is chosen
from matplotlib.figure import Figure

from bench.sim.core import Cost


@dataclass
class Part:
    """One part's results: figures for the last-line JSON, its section of docs/scale.md."""

    figures: dict[str, Any]
    markdown: str


@dataclass
class Context:
    """What the parts share: a scratch folder, the options, where docs go, and results
    another part may reuse (the calibrated costs)."""

    tmp: Path
    args: argparse.Namespace
    docs: Path
    shared: dict[str, Any] = field(default_factory=dict)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"
        return f"{v:,}" if isinstance(v, int) else str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def save(fig: Figure, docs: Path, name: str) -> str:
    """Write ``fig`` as docs/<name>.png; returns its Markdown image link."""
    docs.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(docs / f"{name}.png", dpi=110)
    plt.close(fig)
    return f"![{name}]({name}.png)"


def cost_rows(costs: dict[str, Cost]) -> list[list[Any]]:
    return [[kind, round(c.client_s * 1e3, 2), round(c.client_per_unit * 1e3, 3), round(c.server_s * 1e3, 2),
             round(c.server_per_unit * 1e3, 3), round(c.wait.median * 1e3, 2)] for kind, c in costs.items()
            if kind != "blob"]


COST_HEADERS = ("cost kind", "caller CPU ms", "+ per unit", "server CPU ms", "+ per unit", "other wait ms")


def hours(seconds: float) -> str:
    return f"{seconds / 3600:,.1f} h" if seconds >= 5400 else f"{seconds / 60:,.1f} min"
