"""Groups in time: how a request's dates are gathered into the groups a reduction runs over.

A grouping is named by a string (:func:`parse_grouping`):

``span``
    the whole request: one group, keyed ``<start>_<end>`` (``2022-01-01_2022-02-10``).
``month``
    calendar months, keyed ``2022-07``.
``season``
    the meteorological seasons DJF, MAM, JJA, SON, keyed ``2022-JJA``. December belongs to
    the next year's winter: ``2022-DJF`` is December 2021 to February 2022.
``year``
    calendar years, keyed ``2022``.
``days:N``
    consecutive windows of N days from the request's first day (the last one cut at the
    request's end), keyed by their first and last days: ``2022-01-01_2022-01-16``.
``month-of-year``
    a climatology: a group per calendar month across the span's years, keyed ``month-01`` to
    ``month-12``.
``day-of-year``
    a climatology: a group per day of the year across the span's years, keyed ``doy-001`` to
    ``doy-366``. The day of the year is the ordinal day, 1 January being 1, as MODIS numbers
    its composites and as ``xarray``'s ``time.dayofyear`` does: a composite starts on the
    same day of the year every year (an 8-day one on 1, 9, …, 193, …, 361; a 16-day one on 1,
    17, …), so each composite slot is one group over the years. The cost: after February a
    leap year's day is one calendar day earlier than the same number in another year (doy
    193 is 12 July, in a leap year 11 July), and ``doy-366`` (31 December) has leap years
    only.

Every group knows the days of the span it covers, as windows of consecutive days: one for a
calendar grouping, one per year for a climatology. A group's key is stable: it names the
group's outputs.

A compositing period (its first day and its length: 1, 8 or 16 days, a month, a year)
belongs to the group holding its first day, if the span has that group. A period that starts
before the span but reaches into it (the planner asks for every period that overlaps the
span) is the span's own in the grouping ``span``; in any other it keeps the group of its
first day, if the span has it, else none: a July's monthly composite is made of the
composites that start in July, in the request's year as in each baseline year (the one of
26 June that reaches into a span from 1 July is June's), and Aqua's 16-day composite of 27
December 2018 in a span from 1 January 2019 is in ``doy-361``, with the composites of the
following Decembers, not in ``doy-001``. A period that does not overlap the span belongs to
no group.

A baseline (for anomalies and the percent-of-range indices) is the same group in other
years: :func:`baseline_of` shifts a group's days by whole years into a baseline span.

Pure: dates in, dataclasses out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import date, timedelta

KINDS = ("span", "month", "season", "year", "days:N", "month-of-year", "day-of-year")
CLIMATOLOGIES = ("month-of-year", "day-of-year")
MAX_WINDOW_DAYS = 36_600  # days:N: at most a century a window (a request's span is shorter)
SEASONS = ("DJF", "DJF", "MAM", "MAM", "MAM", "JJA", "JJA", "JJA", "SON", "SON", "SON", "DJF")  # by month
_DAYS = re.compile(r"days:([1-9][0-9]{0,4})")
ONE_DAY = timedelta(days=1)

Window = tuple[date, date]  # first and last day, both included


class GroupingError(ValueError):
    """A grouping that is not one of the known ones, or a span that is empty."""


@dataclass(frozen=True)
class Grouping:
    """How dates are grouped: ``kind`` is one of :data:`KINDS` (``days`` for ``days:N``, with
    ``days`` = N)."""

    kind: str
    days: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("span", "month", "season", "year", "days", *CLIMATOLOGIES):
            raise GroupingError(f"no grouping is of kind {self.kind[:40]!r}")
        if (self.kind == "days") != (1 <= self.days <= MAX_WINDOW_DAYS):
            raise GroupingError(f"days:N takes N from 1 to {MAX_WINDOW_DAYS}; no other grouping takes one")

    def __str__(self) -> str:
        return f"days:{self.days}" if self.kind == "days" else self.kind

    @property
    def climatology(self) -> bool:
        """Whether a group gathers the same month or day of several years."""
        return self.kind in CLIMATOLOGIES

    def key(self, day: date, span: Span) -> str:
        """The key of the group of the span that holds ``day``."""
        match self.kind:
            case "span":
                return f"{span.start}_{span.end}"
            case "month":
                return f"{day:%Y-%m}"
            case "season":
                return f"{day.year + (day.month == 12)}-{SEASONS[day.month - 1]}"
            case "year":
                return f"{day.year}"
            case "days":
                first = span.start + timedelta(days=(day - span.start).days // self.days * self.days)
                return f"{first}_{min(first + timedelta(days=self.days - 1), span.end)}"
            case "month-of-year":
                return f"month-{day.month:02d}"
            case _:  # day-of-year
                return f"doy-{day.timetuple().tm_yday:03d}"


def parse_grouping(text: str) -> Grouping:
    """The grouping a string names; :class:`GroupingError` naming it if it is none."""
    if text in CLIMATOLOGIES or text in ("span", "month", "season", "year"):
        return Grouping(text)
    days = _DAYS.fullmatch(text)
    if days:
        if int(days[1]) > MAX_WINDOW_DAYS:
            raise GroupingError(f"grouping {text!r}: at most {MAX_WINDOW_DAYS} days a window")
        return Grouping("days", int(days[1]))
    shown = text if len(text) <= 40 else text[:40] + "…"
    raise GroupingError(f"unknown grouping {shown!r}: expected one of {', '.join(KINDS)} (N a whole number ≥ 1)")


@dataclass(frozen=True)
class Span:
    """A request's time span: its first and last days, both included."""

    start: date
    end: date

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise GroupingError(f"the span is empty: it ends ({self.end}) before it starts ({self.start})")

    def days(self) -> Iterator[date]:
        day = self.start
        while day <= self.end:
            yield day
            day += ONE_DAY


@dataclass(frozen=True)
class Period:
    """A compositing period: its first day and its length in days (1 for a daily product;
    MODIS's 8- and 16-day composites, except the last of a year, which ends with the year
    unless the product is phased across it, as Aqua's 16-day ones are)."""

    first: date
    days: int

    def __post_init__(self) -> None:
        if self.days < 1:
            raise ValueError(f"a period of {self.days} days")

    @property
    def last(self) -> date:
        return self.first + timedelta(days=self.days - 1)


@dataclass(frozen=True)
class Group:
    """One group: its key and the days it covers, as windows of consecutive days in order
    (first and last day of each, both included)."""

    key: str
    windows: tuple[Window, ...]

    @property
    def start(self) -> date:
        """The group's first day."""
        return self.windows[0][0]

    @property
    def end(self) -> date:
        """The group's last day."""
        return self.windows[-1][1]

    def holds(self, day: date) -> bool:
        return any(first <= day <= last for first, last in self.windows)


def groups(grouping: Grouping, span: Span) -> list[Group]:
    """The groups the span makes, in order: by time for a calendar grouping, by month or day
    of the year for a climatology (their keys sort the same way)."""
    windows: dict[str, list[Window]] = {}
    for day in span.days():
        runs = windows.setdefault(grouping.key(day, span), [])
        if runs and runs[-1][1] + ONE_DAY == day:
            runs[-1] = (runs[-1][0], day)
        else:
            runs.append((day, day))
    made = [Group(key, tuple(runs)) for key, runs in windows.items()]
    return sorted(made, key=lambda g: g.key) if grouping.climatology else made  # (zero-padded numbers)


def _placing_day(grouping: Grouping, span: Span, period: Period) -> date | None:
    """The day whose group the period belongs to (see the module's text); None if the
    period does not overlap the span."""
    if period.first > span.end or period.last < span.start:
        return None
    return max(period.first, span.start) if grouping.kind == "span" else period.first


def group_of(grouping: Grouping, span: Span, period: Period) -> Group | None:
    """The group of the span the period belongs to; None if it belongs to none."""
    day = _placing_day(grouping, span, period)
    if day is None:
        return None
    key = grouping.key(day, span)
    return next((g for g in groups(grouping, span) if g.key == key), None)


def assign(grouping: Grouping, span: Span, periods: Iterable[Period]) -> list[tuple[Group, list[Period]]]:
    """The groups that hold at least one of the periods, in the groups' order, each with its
    periods in the order given; periods that belong to no group are left out."""
    made = groups(grouping, span)
    found: dict[str, list[Period]] = {g.key: [] for g in made}
    for period in periods:
        day = _placing_day(grouping, span, period)
        if day is not None and grouping.key(day, span) in found:
            found[grouping.key(day, span)].append(period)
    return [(g, found[g.key]) for g in made if found[g.key]]


def members(grouping: Grouping, group: Group, span: Span, periods: Iterable[Period]) -> list[Period]:
    """The periods that belong to ``group``, a group of ``span`` or the baseline of one over
    ``span`` (:func:`baseline_of`), by the rule of :func:`assign`: a climatology's by key,
    a calendar group's by its days."""
    found = []
    for period in periods:
        day = _placing_day(grouping, span, period)
        if day is None:
            continue
        if grouping.key(day, span) == group.key if grouping.climatology else group.holds(day):
            found.append(period)
    return found


def _shifted(day: date, years: int, forward: bool) -> date:
    """The same month and day ``years`` later; 29 February, in a year without one, 1 March
    when ``forward`` (a window's first day) or 28 February (its last day)."""
    try:
        return day.replace(year=day.year + years)
    except ValueError:
        return date(day.year + years, 3, 1) if forward else date(day.year + years, 2, 28)


def _merged(windows: Sequence[Window]) -> tuple[Window, ...]:
    merged: list[Window] = []
    for first, last in sorted(windows):
        if merged and first <= merged[-1][1] + ONE_DAY:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return tuple(merged)


def _month(index: int) -> date:
    """The first day of a month counted from year 0 (``year * 12 + month - 1``)."""
    return date(index // 12, index % 12 + 1, 1)


def _unit(grouping: Grouping, group: Group) -> Window:
    """A calendar group's whole month, season or year (the span may cut it); a ``days:N``
    window or the span as they are."""
    start = group.start
    month = start.year * 12 + start.month - 1
    match grouping.kind:
        case "month":
            return _month(month), _month(month + 1) - ONE_DAY
        case "season":  # from its December, March, June or September
            first = month - start.month % 3
            return _month(first), _month(first + 3) - ONE_DAY
        case "year":
            return date(start.year, 1, 1), date(start.year, 12, 31)
        case _:
            return start, group.end


def baseline_of(grouping: Grouping, group: Group, baseline: Span) -> Group | None:
    """The baseline of a group: the same days of the year in the baseline span's years, keyed
    as the group. A climatology's group is the group of the same key over the baseline span
    (``month-07``: every July of it). A month, season or year is the whole calendar unit in
    each baseline year, even where the request's span cuts the group (``2022-07``: July of
    each baseline year; ``2022-DJF``: each December to February); a ``days:N`` window or the
    span, the same dates each year (a span longer than a year: the whole baseline). Cut to
    the baseline span. None if the baseline holds none of its days (a baseline of March to
    May has no ``2022-JJA``)."""
    if grouping.climatology:
        found = [g for g in groups(grouping, baseline) if g.key == group.key]
        return found[0] if found else None
    start, end = _unit(grouping, group)
    windows = []
    for years in range(baseline.start.year - end.year, baseline.end.year - start.year + 1):
        first = max(_shifted(start, years, forward=True), baseline.start)
        last = min(_shifted(end, years, forward=False), baseline.end)
        if first <= last:
            windows.append((first, last))
    return Group(group.key, _merged(windows)) if windows else None
