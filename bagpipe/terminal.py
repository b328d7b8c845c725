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
