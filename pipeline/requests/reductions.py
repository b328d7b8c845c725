"""A request's reductions, checked: what each computes, over which inputs, grouped how, against
which baseline — the model the expansion plans tasks from and the stages run.

A reduction is one of three kinds, each over the request's inputs (``PRODUCT.LAYER``: any
layer the request makes, a derived layer's name too) on the target grid, one task per
(target tile, group of dates):

- a **built-in reducer** (``pipeline.science.builtins``: ``max``, ``mean``, ``percentile``,
  ``anomaly``…) of each input over the group's dates, one output per input;
- an **expression** (``pipeline.science.expressions``) over the inputs, each first reduced
  over the group by ``aggregate``, with the baseline's figures of each input bound as
  ``<input>.vci``, ``<input>.tci``, ``<input>.anomaly``, ``<input>.zscore`` and
  ``<input>.baseline_mean|std|min|max``: one output;
- a **program** (the scientist's own, in the sandbox), given every input's files and dates.

A **baseline** (years of reference) makes, per target tile and input, the climatology of each
group's same days in the baseline's years (``groups.baseline_of``): each year's days reduced
by ``aggregate``, then the mean, standard deviation, minimum and maximum over the years.

The request's old ``reducer`` (a program over each product's whole span) is a program
reduction per product, grouped by ``span``, its task.json as it always was.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import date
from typing import Any, Literal

from pipeline.modis.products import CATALOG
from pipeline.planning import RequestError
from pipeline.reduction.reducers import Program
from pipeline.science import builtins, expressions
from pipeline.science.encoding import Encoding
from pipeline.science.groups import Grouping, GroupingError, Span, parse_grouping

Kind = Literal["builtin", "expression", "program", "zonal"]
BASELINE_NAMES = ("vci", "tci", "anomaly", "zscore", "baseline_mean", "baseline_std", "baseline_min", "baseline_max")
AGGREGATES = ("mean", "median", "min", "max", "sum", "first", "last")  # what a baseline year or an expression sees
_FILE_SAFE = re.compile(r"[^A-Za-z0-9_.+-]")
MEAN = builtins.Reducer("mean")


@dataclass(frozen=True)
class Input:
    """One input of a reduction: a layer of a product (or a derived layer), by the name an
    expression calls it."""

    alias: str
    product: str
    layer: str

    @property
    def ref(self) -> str:
        return f"{self.product}.{self.layer}"

    @property
    def file_name(self) -> str:
        """The input's name as a file name may hold it."""
        return _FILE_SAFE.sub("_", self.alias)


@dataclass(frozen=True)
class Reduction:
    """One reduction a request asks for, checked."""

    by: Grouping
    inputs: tuple[Input, ...]
    kind: Kind
    name: str  # its outputs are named after it
    reducer: builtins.Reducer | None = None  # a built-in's
    aggregate: builtins.Reducer = MEAN  # an expression's inputs; a baseline's years
    expression: str = ""
    unit: str = ""  # an expression's output's unit
    program: Program | None = None
    args: dict[str, Any] = field(default_factory=dict, compare=False)
    baseline: Span | None = None
    on_failure: str = "fail"
    legacy: bool = False  # the request's old ``reducer``: one per product, its task.json as it was
    over: str = ""  # a zonal reduction's: the reduction whose outputs it reads (its inputs name them)

    @property
    def uses_baseline(self) -> bool:
        return self.baseline is not None

    def describe(self) -> dict[str, Any]:
        """What a reduction task's params say of it (JSON; ``over`` only where it is set, so
        that every other reduction's, and its outputs' content addresses, are as they were)."""
        return {"kind": self.kind, "name": self.name, "by": str(self.by),
                "inputs": [[i.alias, i.product, i.layer] for i in self.inputs],
                "reducer": str(self.reducer) if self.reducer else "", "aggregate": str(self.aggregate),
                "expression": self.expression, "unit": self.unit, "legacy": self.legacy,
                "baseline": [self.baseline.start.isoformat(), self.baseline.end.isoformat()] if self.baseline else None,
                **({"over": self.over} if self.over else {})}

    def outputs(self) -> tuple[Input, ...]:
        """A built-in's or an expression's outputs, by the names its tasks give them (a
        built-in's one per input, ``NAME.ALIAS``; an expression's one, ``NAME``), each with
        the product and layer it is made of (an expression's: its first input's)."""
        if self.kind == "builtin":
            return tuple(Input(f"{self.name}.{i.alias}", i.product, i.layer) for i in self.inputs)
        first = self.inputs[0]
        return (Input(self.name, first.product, first.layer),)


def derived_encoding(unit: str = "") -> Encoding:
    """A derived layer's encoding: float32, NaN where it has no value."""
    return expressions.parse("0").encoding(unit)


def parse_grouping_or(text: str, where: str) -> Grouping:
    """The grouping ``text`` names; a RequestError naming ``where`` if none."""
    try:
        return parse_grouping(text)
    except GroupingError as exc:
        raise RequestError(400, where, str(exc)) from None


def names_in(text: str) -> tuple[str, ...]:
    """The names an expression reads (none if it is not one: its check says why)."""
    try:
        return expressions.parse(text).names
    except expressions.ExpressionError:
        return ()


def builtin(name: str, p: float | None, where: str) -> builtins.Reducer:
    """The built-in reducer ``name`` (``p``: a percentile's); a RequestError naming ``where``."""
    try:
        return builtins.Reducer(name, p)
    except builtins.ReducerError as exc:
        raise RequestError(400, where, str(exc)) from None


def parse_inputs(given: list[str] | dict[str, str] | None, known: dict[str, tuple[str, str]],
                 default: list[str], where: str) -> tuple[Input, ...]:
    """The inputs a request names (a list of ``PRODUCT.LAYER``, or aliases to them), each
    one the request makes (``known``: ref → (product, layer)); ``default`` if none."""
    pairs = ([(ref, ref) for ref in given] if isinstance(given, list) else list(given.items())) if given else [
        (ref, ref) for ref in default]
    if not pairs:
        raise RequestError(400, where, "the reduction has no input")
    found = []
    for alias, ref in pairs:
        if ref not in known:
            raise RequestError(400, where, f"{ref!r} is not a layer this request makes (PRODUCT.LAYER: "
                               f"{', '.join(sorted(known)) if len(known) < 20 else 'see the products named'})")
        if isinstance(given, dict) and not re.fullmatch(r"[a-z][a-z0-9_]{0,31}", alias):
            raise RequestError(400, where, f"input name {alias!r}: a lower-case letter, then letters, digits, _")
        found.append(Input(alias, *known[ref]))
    if len({i.alias for i in found}) != len(found):
        raise RequestError(400, where, "an input is named twice")
    return tuple(found)


def span_of(start: date, end: date, where: str) -> Span:
    """The days from ``start`` to ``end``; a RequestError naming ``where`` if none."""
    try:
        return Span(start, end)
    except GroupingError as exc:
        raise RequestError(400, where, str(exc)) from None


def check_expression(text: str, inputs: tuple[Input, ...], baseline: bool, where: str) -> expressions.Expression:
    """The expression parsed over the inputs (and, with a baseline, their baseline names)."""
    names = [i.alias for i in inputs] + ([f"{i.alias}.{n}" for i in inputs for n in BASELINE_NAMES] if baseline else [])
    try:
        parsed = expressions.parse(text, names)
    except expressions.ExpressionError as exc:
        extra = "" if baseline or not any(n in text for n in BASELINE_NAMES) else (
            " (the baseline's names need reduce.baseline)")
        raise RequestError(400, where, f"{exc}{extra}") from None
    return parsed


def encoding_for(product: str, layer: str, derived: Collection[tuple[str, str]]) -> Encoding:
    """The encoding of an input: a catalog layer's, or a derived layer's (float32): those
    ``derived`` names, as (product, name)."""
    if (product, layer) in derived:
        return derived_encoding()
    return CATALOG[product].layer(layer).encoding
