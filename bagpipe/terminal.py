"""What every ``bagpipe`` command writes to: one console, and the one way a command stops
on an error the user can mend (a message in red, exit status 1, no traceback)."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console

console = Console()


def fail(exc: Exception) -> NoReturn:
    console.print(f"[red]error:[/red] {exc}", soft_wrap=True)  # the terminal wraps it: names and links stay whole
    raise typer.Exit(1)


def duration(seconds: float) -> str:
    """A length of time as people read it, as the portal writes it: 8.5 s, 42 s, 12 min, 3.4 h."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
