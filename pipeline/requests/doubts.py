"""What to ask a scientist before a request runs: a region or a size that looks like a slip.

A box whose west and east are swapped (``-109,35,-110,36`` for ``-110,35,-109,36``) is a
valid box across ±180°, nearly the whole world at that latitude, and it made 1,436 tasks
where two were meant. Nothing here refuses a request; the API's estimate lists these doubts
(``confirm``), and the command line and the portal ask before they submit.
"""

from __future__ import annotations

from pipeline.requests.request import JobRequest

WIDE_DEGREES = 180.0  # a box wider than this, in longitude, is asked about
FAR_LARGER = 10  # a request with this many times the tasks of the user's last job is asked about
FEW_TASKS = 200  # below this many tasks, no size is asked about


def doubts(request: JobRequest, tasks: int, last: tuple[str, int] | None) -> list[str]:
    """Why ``request`` (making ``tasks`` tasks) may not be what its user meant, each a
    sentence that says what to check: a box wider than 180° of longitude (naming the box with
    west and east swapped when it crosses ±180°), or far more tasks than ``last`` (the user's
    last job and its tasks). Empty when nothing looks amiss."""
    found = []
    box = request.region.bbox if request.region is not None else None
    if box is not None:
        west, south, east, north = box
        width = east - west if west < east else east - west + 360
        if width > WIDE_DEGREES:
            swapped = (f"; west {west:g} > east {east:g} crosses ±180°: did you mean {east:g},{south:g},{west:g},"
                       f"{north:g}?" if west > east else "")
            found.append(f"the box is {width:.0f}° of longitude wide{swapped}")
    if last is not None and tasks >= FEW_TASKS and tasks >= FAR_LARGER * max(last[1], 1):
        found.append(f"{tasks:,} tasks, {tasks // max(last[1], 1):,}× your last job's ({last[0]}: {last[1]:,})")
    return found
