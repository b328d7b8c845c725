"""openEO's per-pixel processes as bagpipe expressions (``pipeline.science.expressions``).

A child process graph of ``apply`` or of ``reduce_dimension`` over bands computes one value per
pixel from its parameters (``x``: a pixel's value; ``data``: its values along the bands). bagpipe
computes such work in the tile task, as a derived layer's expression, on float arrays whose
NaN is the mask: so each child graph is written as the expression text it means, its
parameters bound to expressions already made (a band's ``PRODUCT.LAYER``, or what earlier
processes made of it). A process the expression language cannot say is refused naming it.

Semantics follow the expression language: a missing value in makes a missing value out (but
false and missing is false, true or missing true, as openEO's logic has it), and so does any
result that is not finite (a division by zero, the logarithm of a negative number): a raster
has no infinities, and its NaN is no value. openEO's processes that compare with no-data or ignore it
(``is_nodata``, ``ignore_nodata`` of ``min``/``max`` over bands) are not among these.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.science import expressions


class Unsupported(Exception):
    """A process (or an argument) bagpipe cannot compute per pixel: ``process`` names it."""

    def __init__(self, process: str, message: str) -> None:
        super().__init__(message)
        self.process, self.message = process, message


class Invalid(Exception):
    """A child graph that is not one (a missing argument, a reference to no node)."""

    def __init__(self, process: str, message: str) -> None:
        super().__init__(message)
        self.process, self.message = process, message


@dataclass(frozen=True)
class Expr:
    """An expression's text, and whether it is a condition (a comparison or logic, or a literal
    true or false: ``boolean``, which no arithmetic takes) or a number; a band list stands for
    ``data`` in a reducer over bands."""

    text: str
    condition: bool = False
    boolean: bool = False


@dataclass(frozen=True)
class Bands:
    """The ``data`` of a reducer over bands: each band's expression, by label."""

    labels: tuple[str, ...]
    values: tuple[Expr, ...]


Value = Expr | Bands | None

_BINARY = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/", "power": "**"}
_UNARY = {"sqrt": "sqrt", "ln": "log", "exp": "exp", "absolute": "abs"}
_COMPARE = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<=", "eq": "==", "neq": "!="}
_LOGIC = {"and": "and", "or": "or"}
# every process a child graph may call, as its id (the /processes list names these too)
PROCESSES = (*_BINARY, *_UNARY, *_COMPARE, *_LOGIC, "not", "if", "clip", "linear_scale_range",
             "normalized_difference", "array_element")


def number(value: Any, process: str, name: str) -> Expr:
    """A literal argument as an expression: a number, or null (no value)."""
    if value is None:
        return Expr("nodata")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Unsupported(process, f"{process}: argument {name} must be a number or a pixel's value, "
                          f"not {type(value).__name__}")
    if not math.isfinite(value):
        return Expr("nodata")  # a raster has no infinities (nor NaN but as no value)
    return Expr(f"({value!r})" if value < 0 else repr(float(value)) if isinstance(value, float) else str(value))


def _num(value: Value, process: str, name: str) -> Expr:
    if isinstance(value, Bands):
        raise Unsupported(process, f"{process}: argument {name} is the bands' array; pick a band with "
                          "array_element")
    if value is None:
        return Expr("nodata")
    if value.boolean:
        raise Unsupported(process, f"{process}: argument {name} must be a number or a pixel's value, not a boolean")
    if value.condition:
        return Expr(f"where({value.text}, 1, 0)")
    return value


def _cond(value: Value, process: str, name: str) -> Expr:
    if isinstance(value, Expr) and value.boolean:
        return value
    found = _num(value, process, name)
    return found if found.condition else Expr(f"({found.text} != 0)", True)


class Compiler:
    """Writes a child graph (``{"process_graph": {...}}``, flat, as openEO sends it) as an
    expression, given what its parameters stand for."""

    def __init__(self, graph: Mapping[str, Any], parameters: Mapping[str, Value], where: str) -> None:
        self.nodes = graph.get("process_graph", {})
        self.parameters, self.where = parameters, where
        self.made: dict[str, Value] = {}
        self.visiting: set[str] = set()

    def result(self) -> Value:
        """The value of the graph's result node."""
        results = [key for key, node in self.nodes.items() if isinstance(node, dict) and node.get("result")]
        if len(results) != 1:
            raise Invalid(self.where, f"{self.where}: a child process graph has one result node, not {len(results)}")
        return self.node(results[0])

    def node(self, key: str) -> Value:
        if key in self.made:
            return self.made[key]
        if key in self.visiting:
            raise Invalid(self.where, f"{self.where}: the child process graph has a cycle through {key!r}")
        node = self.nodes.get(key)
        if not isinstance(node, dict):
            raise Invalid(self.where, f"{self.where}: no node {key!r} in the child process graph")
        self.visiting.add(key)
        self.made[key] = self.call(str(node.get("process_id")), node.get("arguments") or {})
        self.visiting.discard(key)
        return self.made[key]

    def arg(self, arguments: Mapping[str, Any], name: str, process: str, default: Any = ...) -> Value:
        """An argument's value: a reference to a node or a parameter, or a literal."""
        if name not in arguments:
            if default is ...:
                raise Invalid(process, f"{process}: argument {name!r} is required")
            return number(default, process, name) if default is not None else None
        given = arguments[name]
        if isinstance(given, dict) and "from_node" in given:
            return self.node(str(given["from_node"]))
        if isinstance(given, dict) and "from_parameter" in given:
            parameter = str(given["from_parameter"])
            if parameter not in self.parameters:
                raise Invalid(process, f"{process}: no parameter {parameter!r} here (there are: "
                              f"{', '.join(self.parameters) or 'none'})")
            return self.parameters[parameter]
        if isinstance(given, list) and name == "data":
            values = tuple(_num(self.literal(v, process, name), process, name) for v in given)
            return Bands(tuple(str(i) for i in range(len(values))), values)
        return self.literal(given, process, name)

    def literal(self, given: Any, process: str, name: str) -> Value:
        if isinstance(given, dict) and ("from_node" in given or "from_parameter" in given):
            return self.arg({name: given}, name, process)
        if isinstance(given, bool):  # a condition that holds everywhere, or nowhere
            return Expr("(1 > 0)" if given else "(1 < 0)", True, True)
        return number(given, process, name)

    def call(self, process: str, arguments: Mapping[str, Any]) -> Value:
        """One process of the child graph, written as an expression."""
        handler = _HANDLERS.get(process)
        if handler is None:
            raise Unsupported(process, f"{process} cannot run per pixel here ({self.where} takes "
                              f"{', '.join(sorted(PROCESSES))})")
        return handler(self, process, arguments)


def _binary(c: Compiler, process: str, a: Mapping[str, Any]) -> Value:
    left, right = ("base", "p") if process == "power" else ("x", "y")
    x, y = _num(c.arg(a, left, process), process, left), _num(c.arg(a, right, process), process, right)
    return Expr(f"({x.text} {_BINARY[process]} {y.text})")


def _unary(c: Compiler, process: str, a: Mapping[str, Any]) -> Value:
    name = "p" if process == "exp" else "x"  # (exp's argument is the power)
    return Expr(f"{_UNARY[process]}({_num(c.arg(a, name, process), process, name).text})")


def _compare(c: Compiler, process: str, a: Mapping[str, Any]) -> Value:
    x, y = _num(c.arg(a, "x", process), process, "x"), _num(c.arg(a, "y", process), process, "y")
    if process in ("eq", "neq") and a.get("delta") is not None:  # (case_sensitive is of strings: a pixel has none)
        delta = _num(c.arg(a, "delta", process), process, "delta")
        return Expr(f"(abs({x.text} - {y.text}) {'<=' if process == 'eq' else '>'} {delta.text})", True)
    return Expr(f"({x.text} {_COMPARE[process]} {y.text})", True)


def _logic(c: Compiler, process: str, a: Mapping[str, Any]) -> Value:
    x, y = _cond(c.arg(a, "x", process), process, "x"), _cond(c.arg(a, "y", process), process, "y")
    return Expr(f"({x.text} {_LOGIC[process]} {y.text})", True)


def _not(c: Compiler, process: str, a: Mapping[str, Any]) -> Value:
    return Expr(f"(not {_cond(c.arg(a, 'x', process), process, 'x').text})", True)


def _if(c: Compiler, process: str, a: Mapping[str, Any]) -> Value:
    value = _cond(c.arg(a, "value", process), process, "value")
    accept = _num(c.arg(a, "accept", process), process, "accept")
    reject = _num(c.arg(a, "reject", process, None), process, "reject")
    return Expr(f"where({value.text}, {accept.text}, {reject.text})")


def _clip(c: Compiler, process: str, a: Mapping[str, Any]) -> Value:
    low_given, high_given = a.get("min"), a.get("max")
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low_given, high_given)) \
            and low_given > high_given:  # type: ignore[operator]
        raise Invalid(process, f"{process}: min {low_given} is above max {high_given} (MinMaxSwapped)")
    x = _num(c.arg(a, "x", process), process, "x")
    low, high = _num(c.arg(a, "min", process), process, "min"), _num(c.arg(a, "max", process), process, "max")
    return Expr(f"clip({x.text}, {low.text}, {high.text})")


def _linear_scale_range(c: Compiler, process: str, a: Mapping[str, Any]) -> Value:
    x = _num(c.arg(a, "x", process), process, "x")
    in_min, in_max = (_num(c.arg(a, n, process), process, n) for n in ("inputMin", "inputMax"))
    out_min, out_max = (_num(c.arg(a, n, process, d), process, n) for n, d in (("outputMin", 0), ("outputMax", 1)))
    low, high = f"min({in_min.text}, {in_max.text})", f"max({in_min.text}, {in_max.text})"  # either way round
    return Expr(f"((clip({x.text}, {low}, {high}) - {in_min.text}) / ({in_max.text} - {in_min.text})"
                f" * ({out_max.text} - {out_min.text}) + {out_min.text})")


def _normalized_difference(c: Compiler, process: str, a: Mapping[str, Any]) -> Value:
    x, y = _num(c.arg(a, "x", process), process, "x"), _num(c.arg(a, "y", process), process, "y")
    return Expr(f"(({x.text} - {y.text}) / ({x.text} + {y.text}))")


def _array_element(c: Compiler, process: str, a: Mapping[str, Any]) -> Value:
    data = c.arg(a, "data", process)
    if not isinstance(data, Bands):
        raise Unsupported(process, f"{process}: data must be the bands of the reducer's data")
    index, label = a.get("index"), a.get("label")
    if (index is None) == (label is None):
        raise Invalid(process, f"{process}: give index or label, not both")
    if label is not None:
        if str(label) not in data.labels:
            if a.get("return_nodata"):
                return Expr("nodata")
            raise Invalid(process, f"{process}: no band {label!r} (bands: {', '.join(data.labels)})")
        return data.values[data.labels.index(str(label))]
    if not isinstance(index, int) or isinstance(index, bool):
        raise Invalid(process, f"{process}: index must be an integer")
    if not 0 <= index < len(data.values):
        if a.get("return_nodata"):
            return Expr("nodata")
        raise Invalid(process, f"{process}: index {index} is outside the {len(data.values)} bands")
    return data.values[index]


_HANDLERS: dict[str, Callable[[Compiler, str, Mapping[str, Any]], Value]] = {
    **dict.fromkeys(_BINARY, _binary), **dict.fromkeys(_UNARY, _unary), **dict.fromkeys(_COMPARE, _compare),
    **dict.fromkeys(_LOGIC, _logic), "not": _not, "if": _if, "clip": _clip,
    "linear_scale_range": _linear_scale_range, "normalized_difference": _normalized_difference,
    "array_element": _array_element,
}


def expression(graph: Mapping[str, Any], parameters: Mapping[str, Value], where: str, names: list[str]) -> Expr:
    """The expression a child graph computes (a number per pixel), checked by the expression
    language over ``names`` (the bands it may read); Unsupported or Invalid naming the process."""
    found = Compiler(graph, parameters, where).result()
    if found is None:
        found = Expr("nodata")
    if isinstance(found, Bands):
        raise Unsupported(where, f"{where}: the child process graph returns the bands' array, not one value per pixel")
    found = _num(found, where, "result")
    try:
        expressions.parse(found.text, names)
    except expressions.ExpressionError as exc:
        raise Unsupported(where, f"{where}: the child process graph is beyond what bagpipe computes per pixel "
                          f"({exc})") from None
    return found
