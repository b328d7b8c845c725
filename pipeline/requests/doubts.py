"""What to ask a scientist before a request runs: a region or a size that looks like a slip.

A box whose west and east are swapped (``-109,35,-110,36`` for ``-110,35,-109,36``) is a
valid box across ±180°, nearly the whole world at that latitude, and it made 1,436 tasks
where two were meant. A request's size is the places its tasks work on (a tile on a date, a
reduction), each of a batch's counted, as its tasks would be a place a task: a larger region
packs more tiles in a task, so its tasks alone would understate how much larger it is.
Nothing here refuses a request; the API's estimate lists these doubts
(``confirm``), and the command line and the portal ask before they submit.
"""

from __future__ import annotations

from pipeline.requests.request import JobRequest

WIDE_DEGREES = 180.0  # a box wider than this, in longitude, is asked about
FAR_LARGER = 10  # a request this many times the size of the user's last job is asked about
FEW_PLACES = 200  # below this size (``pipeline.planning.size``), no size is asked about


def doubts(request: JobRequest, places: int, last: tuple[str, int] | None) -> list[str]:
    """Why ``request`` (its tasks working on ``places`` places) may not be what its user
    meant, each a sentence that says what to check: a box wider than 180° of longitude (naming
    the box with west and east swapped when it crosses ±180°), or far larger than ``last``
    (the user's last job and its places). Empty when nothing looks amiss."""
    found = []
    box = request.region.bbox if request.region is not None else None
    if box is not None:
        west, south, east, north = box
        width = east - west if west < east else east - west + 360
        if width > WIDE_DEGREES:
            swapped = (f"; west {west:g} > east {east:g} crosses ±180°: did you mean {east:g},{south:g},{west:g},"
                       f"{north:g}?" if west > east else "")
            found.append(f"the box is {width:.0f}° of longitude wide{swapped}")
    if last is not None and places >= FEW_PLACES and places >= FAR_LARGER * max(last[1], 1):
        times = places // max(last[1], 1)
        found.append(f"{places:,} pieces of work (a tile on a date, a composite), {times:,}× your last job's "
                     f"({last[0]}: {last[1]:,})")
    return found
