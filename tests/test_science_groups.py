"""Groups in time: every grouping partitions a span's days, checked day by day against keys
made independently here, over spans starting on every third day of two years around a leap
year; composites (8-day across a month's end, Aqua's 16-day across a year's end, periods
starting before the span) placed by their first day; baselines in other years."""

from __future__ import annotations

from datetime import date, timedelta

import pytest

from pipeline.modis.products import CATALOG, periods
from pipeline.science.groups import (
    Group,
    Grouping,
    GroupingError,
    Period,
    Span,
    assign,
    baseline_of,
    group_of,
    groups,
    members,
    parse_grouping,
)


def day_count(group: Group) -> int:
    return sum((last - first).days + 1 for first, last in group.windows)


NAMES = ("span", "month", "season", "year", "days:1", "days:16", "days:45", "month-of-year", "day-of-year")
D = date


def expected_key(name: str, day: date, span: Span) -> str:
    """The key a day's group has, written from the definitions, not from the module."""
    if name == "span":
        return f"{span.start.isoformat()}_{span.end.isoformat()}"
    if name == "month":
        return day.strftime("%Y-%m")
    if name == "season":
        season = {12: "DJF", 1: "DJF", 2: "DJF", 3: "MAM", 4: "MAM", 5: "MAM", 6: "JJA", 7: "JJA", 8: "JJA",
                  9: "SON", 10: "SON", 11: "SON"}[day.month]
        return f"{day.year + 1 if day.month == 12 else day.year}-{season}"
    if name == "year":
        return str(day.year)
    if name.startswith("days:"):
        n = int(name[5:])
        first = span.start + timedelta(days=(day - span.start).days // n * n)
        return f"{first.isoformat()}_{min(first + timedelta(days=n - 1), span.end).isoformat()}"
    if name == "month-of-year":
        return f"month-{day.month:02d}"
    return f"doy-{int(day.strftime('%j')):03d}"


def check_partition(name: str, span: Span) -> None:
    made = groups(parse_grouping(name), span)
    seen: dict[date, str] = {}
    for group in made:
        assert group.windows, group
        for (first, last), following in zip(group.windows, (*group.windows[1:], (None, None)), strict=True):
            assert span.start <= first <= last <= span.end
            if following[0] is not None:
                assert following[0] > last + timedelta(days=1), "windows of a group are maximal runs"
            day = first
            while day <= last:
                assert day not in seen, f"{day} in {seen.get(day)} and {group.key}"
                seen[day] = group.key
                day += timedelta(days=1)
    day = span.start
    while day <= span.end:
        assert seen.pop(day) == expected_key(name, day, span), (name, span, day)
        day += timedelta(days=1)
    assert not seen
    keys = [g.key for g in made]
    assert len(set(keys)) == len(keys)
    if name in ("month-of-year", "day-of-year"):
        assert keys == sorted(keys, key=lambda k: int(k.split("-")[1]))
    else:
        assert [g.start for g in made] == sorted(g.start for g in made)
        assert all(len(g.windows) == 1 for g in made)


@pytest.mark.parametrize("name", NAMES)
def test_every_day_of_every_span_is_in_the_one_group_its_key_names(name: str) -> None:
    """Spans of 1 and 40 days starting on every other day from December 2019 to January 2021
    (2020 a leap year), and of 800 days starting every 29 days."""
    start = D(2019, 12, 1)
    while start <= D(2021, 1, 31):
        for length in (1, 40) if (start - D(2019, 12, 1)).days % 29 else (1, 40, 800):
            check_partition(name, Span(start, start + timedelta(days=length - 1)))
        start += timedelta(days=2)


def test_keys_and_true_dates() -> None:
    span = Span(D(2021, 11, 15), D(2022, 8, 10))

    def by_key(name: str) -> dict[str, Group]:
        return {g.key: g for g in groups(parse_grouping(name), span)}

    assert by_key("span")["2021-11-15_2022-08-10"].windows == ((D(2021, 11, 15), D(2022, 8, 10)),)
    months = by_key("month")
    assert min(months) == "2021-11" and max(months) == "2022-08"
    assert months["2021-11"].windows == ((D(2021, 11, 15), D(2021, 11, 30)),)  # cut by the span
    assert months["2022-07"].windows == ((D(2022, 7, 1), D(2022, 7, 31)),)
    assert day_count(months["2022-02"]) == 28
    seasons = by_key("season")
    assert list(seasons) == ["2021-SON", "2022-DJF", "2022-MAM", "2022-JJA"]
    assert seasons["2022-DJF"].windows == ((D(2021, 12, 1), D(2022, 2, 28)),)  # December: the next year's winter
    assert seasons["2022-JJA"].end == D(2022, 8, 10)
    assert list(by_key("year")) == ["2021", "2022"]
    windows = list(by_key("days:16"))
    assert windows[0] == "2021-11-15_2021-11-30" and windows[-1] == "2022-07-29_2022-08-10"
    assert list(by_key("month-of-year")) == [f"month-{m:02d}" for m in (1, 2, 3, 4, 5, 6, 7, 8, 11, 12)]
    assert by_key("month-of-year")["month-11"].windows == ((D(2021, 11, 15), D(2021, 11, 30)),)
    doy = by_key("day-of-year")
    assert doy["doy-193"].windows == ((D(2022, 7, 12), D(2022, 7, 12)),)
    assert len(doy) == (span.end - span.start).days + 1 and "doy-366" not in doy


def test_grouping_of_new_year_days_2022_01_01_to_16() -> None:
    span = Span(D(2022, 1, 1), D(2022, 3, 31))
    first = groups(Grouping("days", 16), span)[0]
    assert first.key == "2022-01-01_2022-01-16" and day_count(first) == 16


def test_leap_years() -> None:
    span = Span(D(2019, 1, 1), D(2021, 12, 31))
    doy = {g.key: g for g in groups(parse_grouping("day-of-year"), span)}
    assert len(doy) == 366
    assert doy["doy-366"].windows == ((D(2020, 12, 31), D(2020, 12, 31)),)  # a leap year's only
    assert [w[0] for w in doy["doy-060"].windows] == [D(2019, 3, 1), D(2020, 2, 29), D(2021, 3, 1)]
    assert [w[0] for w in doy["doy-365"].windows] == [D(2019, 12, 31), D(2020, 12, 30), D(2021, 12, 31)]
    months = {g.key: g for g in groups(parse_grouping("month-of-year"), span)}
    assert day_count(months["month-02"]) == 28 + 29 + 28
    seasons = {g.key: g for g in groups(parse_grouping("season"), span)}
    assert day_count(seasons["2020-DJF"]) == 31 + 31 + 29 and day_count(seasons["2021-DJF"]) == 90
    assert seasons["2019-DJF"].windows == ((D(2019, 1, 1), D(2019, 2, 28)),)  # its December is before the span
    assert seasons["2022-DJF"].windows == ((D(2021, 12, 1), D(2021, 12, 31)),)  # its January is after


def test_a_one_day_span_makes_one_group_of_each_grouping() -> None:
    span = Span(D(2020, 2, 29), D(2020, 2, 29))
    expected = {"span": "2020-02-29_2020-02-29", "month": "2020-02", "season": "2020-DJF", "year": "2020",
                "days:16": "2020-02-29_2020-02-29", "month-of-year": "month-02", "day-of-year": "doy-060"}
    for name, key in expected.items():
        made = groups(parse_grouping(name), span)
        assert [g.key for g in made] == [key] and made[0].windows == ((span.start, span.end),)


def test_a_composite_belongs_to_the_group_of_its_first_day() -> None:
    span = Span(D(2021, 6, 1), D(2022, 6, 30))
    month, season, year, doy = (parse_grouping(n) for n in ("month", "season", "year", "day-of-year"))
    across_month = Period(D(2022, 1, 25), 8)  # 25 January to 1 February
    assert group_of(month, span, across_month).key == "2022-01"
    across_year = Period(D(2021, 12, 27), 16)  # Aqua's last 16-day composite of 2021, to 11 January 2022
    assert across_year.last == D(2022, 1, 11)
    assert group_of(month, span, across_year).key == "2021-12"
    assert group_of(season, span, across_year).key == "2022-DJF"
    assert group_of(year, span, across_year).key == "2021"
    assert group_of(doy, span, across_year).key == "doy-361"
    days = Grouping("days", 8)
    assert group_of(days, span, Period(D(2021, 6, 9), 8)).key == "2021-06-09_2021-06-16"


def test_a_period_starting_before_the_span_keeps_its_first_days_group_if_the_span_has_it() -> None:
    span = Span(D(2022, 1, 5), D(2022, 3, 31))
    before = Period(D(2022, 1, 1), 8)  # 1 to 8 January: it reaches into the span
    assert group_of(parse_grouping("month"), span, before).key == "2022-01"
    assert group_of(parse_grouping("span"), span, before).key == "2022-01-05_2022-03-31"
    assert group_of(Grouping("days", 16), span, before) is None  # the span's windows start on its first day
    assert group_of(parse_grouping("month-of-year"), span, before).key == "month-01"
    assert group_of(parse_grouping("day-of-year"), span, before) is None  # its slot, doy-001, is not the span's
    february = Span(D(2022, 2, 1), D(2022, 2, 28))
    last_of_january = Period(D(2022, 1, 25), 8)  # its first day's month is not the span's: as in a baseline year
    assert group_of(parse_grouping("month"), february, last_of_january) is None
    assert group_of(parse_grouping("span"), february, last_of_january).key == "2022-02-01_2022-02-28"
    assert group_of(parse_grouping("season"), Span(D(2022, 3, 1), D(2022, 5, 31)), Period(D(2022, 2, 26), 8)) is None
    assert group_of(parse_grouping("month"), span, Period(D(2021, 12, 27), 8)) is None  # ends 3 January
    assert group_of(parse_grouping("month"), span, Period(D(2022, 4, 1), 8)) is None  # after the span


def test_assign_places_periods_in_group_order_and_leaves_out_those_outside() -> None:
    span = Span(D(2022, 1, 1), D(2022, 4, 10))
    given = [Period(D(2021, 12, 1), 8), *(Period(D(2022, 1, 1) + timedelta(days=16 * k), 16) for k in range(7))]
    placed = assign(parse_grouping("month"), span, reversed(given))
    assert [(g.key, [p.first.isoformat() for p in ps]) for g, ps in placed] == [
        ("2022-01", ["2022-01-17", "2022-01-01"]),
        ("2022-02", ["2022-02-18", "2022-02-02"]),
        ("2022-03", ["2022-03-22", "2022-03-06"]),
        ("2022-04", ["2022-04-07"]),
    ]
    for group, found in placed:
        assert all(group_of(parse_grouping("month"), span, p) == group for p in found)


@pytest.mark.parametrize("product", ["MOD10A2", "MOD13A1", "MYD13A1", "MOD11A1"])
def test_the_catalogs_composites_over_three_years_fall_in_one_slot_a_year(product: str) -> None:
    """Each day-of-year group of a composite product holds the same composite slot each year
    (Terra's 16-day on days 1, 17, …; Aqua's, 8 days later, on 9, 25, …), leap year or not;
    every period of the span is placed once, and in the month of its first day."""
    spec = CATALOG[product]
    span = Span(D(2019, 1, 1), D(2021, 12, 31))
    found = [Period(first, spec.period_days) for first in periods(spec, span.start, span.end)]
    placed = assign(parse_grouping("day-of-year"), span, found)
    assert sum(len(ps) for _, ps in placed) == len(found)
    step, phase = spec.period_days, spec.phase_days
    assert [g.key for g, _ in placed] == [f"doy-{d:03d}" for d in range(1 + phase, 367, step)]
    for group, slot in placed:
        years = {p.first.year for p in slot}
        if group.key == "doy-366":  # a daily product's 31 December of a leap year
            assert years == {2020} and len(slot) == 1
        elif found[0].first < span.start and group.key == f"doy-{found[0].first.timetuple().tm_yday:03d}":
            assert years == {2018, 2019, 2020, 2021} and len(slot) == 4  # Aqua's from 27 December 2018, in its slot
        else:
            assert years == {2019, 2020, 2021} and len(slot) == 3, group.key
    for group, slot in assign(parse_grouping("month"), span, found):
        assert all(max(p.first, span.start).strftime("%Y-%m") == group.key for p in slot)


def test_baselines_are_the_same_days_in_the_baseline_years() -> None:
    baseline = Span(D(2001, 1, 1), D(2003, 12, 31))
    span = Span(D(2022, 7, 15), D(2023, 3, 31))
    month = parse_grouping("month")
    july = groups(month, span)[0]
    assert july.windows == ((D(2022, 7, 15), D(2022, 7, 31)),)
    assert baseline_of(month, july, baseline) == Group("2022-07", tuple(
        (D(y, 7, 1), D(y, 7, 31)) for y in (2001, 2002, 2003)))  # whole Julys, though the span cuts this one
    season = parse_grouping("season")
    winter = next(g for g in groups(season, span) if g.key == "2023-DJF")
    assert baseline_of(season, winter, baseline).windows == (
        (D(2001, 1, 1), D(2001, 2, 28)), (D(2001, 12, 1), D(2002, 2, 28)), (D(2002, 12, 1), D(2003, 2, 28)),
        (D(2003, 12, 1), D(2003, 12, 31)))
    to_first_of_december = Span(D(2001, 1, 1), D(2001, 12, 1))
    assert baseline_of(season, winter, to_first_of_december).windows == (
        (D(2001, 1, 1), D(2001, 2, 28)), (D(2001, 12, 1), D(2001, 12, 1)))  # a window of one day
    year = parse_grouping("year")
    assert baseline_of(year, groups(year, span)[0], baseline).windows == ((baseline.start, baseline.end),)
    leap = Span(D(2020, 2, 20), D(2020, 3, 20))
    window = next(g for g in groups(Grouping("days", 10), leap) if g.holds(D(2020, 2, 29)))
    assert window.windows == ((D(2020, 2, 20), D(2020, 2, 29)),)
    assert baseline_of(Grouping("days", 10), window, Span(D(2019, 1, 1), D(2021, 12, 31))).windows == (
        (D(2019, 2, 20), D(2019, 2, 28)), (D(2020, 2, 20), D(2020, 2, 29)), (D(2021, 2, 20), D(2021, 2, 28)))
    starting_on_29 = Group("x", ((D(2020, 2, 29), D(2020, 3, 9)),))
    assert baseline_of(Grouping("days", 10), starting_on_29, Span(D(2021, 1, 1), D(2021, 12, 31))).windows == (
        (D(2021, 3, 1), D(2021, 3, 9)),)
    whole = groups(parse_grouping("span"), Span(D(2020, 6, 1), D(2022, 5, 31)))[0]
    assert baseline_of(parse_grouping("span"), whole, baseline).windows == ((baseline.start, baseline.end),)
    climatology = parse_grouping("month-of-year")
    assert baseline_of(climatology, groups(climatology, span)[0], baseline) == Group(
        "month-01", tuple((D(y, 1, 1), D(y, 1, 31)) for y in (2001, 2002, 2003)))
    spring = Span(D(2001, 3, 1), D(2001, 5, 31))
    assert baseline_of(season, next(g for g in groups(season, span) if g.key == "2022-JJA"), spring) is None
    assert baseline_of(parse_grouping("day-of-year"), Group("doy-366", ((D(2020, 12, 31),) * 2,)),
                       Span(D(2021, 1, 1), D(2023, 12, 31))) is None


def test_members_of_a_baseline() -> None:
    baseline = Span(D(2001, 1, 1), D(2002, 12, 31))
    july = groups(parse_grouping("month"), Span(D(2022, 7, 1), D(2022, 7, 31)))[0]
    found = [Period(first, 16) for first in periods(CATALOG["MOD13A1"], baseline.start, baseline.end)]
    julys = members(parse_grouping("month"), baseline_of(parse_grouping("month"), july, baseline),
                    baseline, found)
    assert [p.first for p in julys] == [D(2001, 7, 12), D(2001, 7, 28), D(2002, 7, 12), D(2002, 7, 28)]
    climatology = parse_grouping("day-of-year")
    aqua = [Period(first, 16) for first in periods(CATALOG["MYD13A1"], baseline.start, baseline.end)]
    assert aqua[0].first == D(2000, 12, 26)  # (2000 a leap year: day 361 is 26 December)
    slot = baseline_of(climatology, Group("doy-361", ((D(2022, 12, 27),) * 2,)), baseline)
    assert [p.first for p in members(climatology, slot, baseline, aqua)] == [
        D(2000, 12, 26), D(2001, 12, 27), D(2002, 12, 27)]
    assert members(climatology, slot, baseline, aqua) == dict(assign(climatology, baseline, aqua))[slot]


@pytest.mark.parametrize("text", ["weekly", "Month", " month", "month ", "days:", "days:0", "days:-3", "days:x",
                                  "days:08", "days:1.5", "days:36601", "days:100000", "", "season:DJF",
                                  "day_of_year", "x" * 1000])
def test_an_unknown_grouping_is_refused_naming_it(text: str) -> None:
    with pytest.raises(GroupingError) as refused:
        parse_grouping(text)
    assert repr(text) in str(refused.value) or repr(text[:40])[:-1] + "…'" in str(refused.value) or \
        "at most" in str(refused.value)
    assert len(str(refused.value)) < 200


def test_groupings_parse_and_print_as_named() -> None:
    for name in ("span", "month", "season", "year", "days:1", "days:16", "days:36600", "month-of-year",
                 "day-of-year"):
        assert str(parse_grouping(name)) == name
    assert parse_grouping("days:16") == Grouping("days", 16)
    assert parse_grouping("day-of-year").climatology and not parse_grouping("year").climatology


def test_a_grouping_made_directly_is_checked_too() -> None:
    for kind, days in (("weekly", 0), ("days", 0), ("days", 36_601), ("month", 3)):
        with pytest.raises(GroupingError):
            Grouping(kind, days)


def test_an_empty_span_and_an_empty_period_are_refused() -> None:
    with pytest.raises(GroupingError, match="ends"):
        Span(D(2022, 2, 1), D(2022, 1, 31))
    with pytest.raises(ValueError, match="0 days"):
        Period(D(2022, 1, 1), 0)
