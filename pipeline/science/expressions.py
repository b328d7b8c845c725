"""A small, safe expression language over a request's inputs, evaluated per pixel.

An expression combines inputs — ``PRODUCT.LAYER`` names such as ``MOD13A1.500m_16_days_NDVI``
or ``MCD43A4.Nadir_Reflectance_Band2``, or short aliases the caller binds (``ndvi``, ``vci``)
— with numbers and::

    ( )                      grouping
    -x                       negation
    + - * / **               arithmetic (** binds tightest and to the right: -x**2 is -(x**2))
    < <= > >= == !=          comparisons (not chained: write (a < b) and (b < c))
    and  or  not             logic on conditions, elementwise
    nodata                   no value
    where(cond, a, b)        a where cond holds, else b
    isnodata(x)              a condition: x has no value (itself never missing)
    clip(x, lo, hi)          x kept within [lo, hi]
    sqrt(x) log(x) exp(x) abs(x)
    min(a, b, ...) max(a, b, ...)   per pixel, of two or more

Nothing else: no attribute access (a dotted name is one name, an input's or none), no
subscripts, strings, lambdas or comprehensions, no calls but to the functions above. The text
is read by a hand-written tokenizer and a Pratt parser into a tree of these operations; no
Python code is compiled or evaluated, and the parser refuses names it was not given. A
condition (a comparison, a logical expression) and a number are different kinds: ``where``
takes a condition first, arithmetic takes numbers, ``and`` takes conditions.

Bounds: the text (:data:`MAX_TEXT` characters), its operations (:data:`MAX_NODES`), their
nesting (:data:`MAX_DEPTH`: parentheses, and the depth of the tree a long chain of ``+`` makes)
and a constant exponent of ``**`` (at most :data:`MAX_EXPONENT` in size; a computed exponent
is evaluated in floating point, which cannot take long). Parts made only of numbers are
computed once, when parsed.

Evaluation is on float arrays (float32 unless asked for float64) whose NaN is a missing value
(``encoding``'s convention; a numpy masked array is taken too). A missing operand makes a
missing result, in arithmetic, comparisons, ``not``, ``min``, ``max`` and ``clip`` alike (only
the branch ``where`` chooses matters), except where the other operand of ``and`` or ``or``
settles it: false and missing is false, true or missing is true (three-valued logic, as SQL's
and openEO's); division by zero, the logarithm or square root of a
negative number, an overflow — any result that is not finite — is missing too: never an
exception, never a warning. A condition's value, if it is the whole expression, is 1 or 0.

Errors are one exception, :class:`ExpressionError`, which says what is wrong and at which
column (from 1), for a 400 that names the request's field.
"""

from __future__ import annotations

import difflib
import functools
import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import numpy as np

from pipeline.science.encoding import Encoding, float32

VERSION = "expressions-2"  # change when an expression's output of the same inputs would change
MAX_TEXT = 4096  # characters
MAX_NODES = 500  # operations, numbers and names
MAX_DEPTH = 64  # nesting of parentheses, and of the operations' tree
MAX_EXPONENT = 16  # a constant exponent's size

NUMBER, CONDITION = "number", "condition"
FUNCTIONS = {  # name: (least arguments, most, kinds of the arguments)
    "where": (3, 3, (CONDITION, NUMBER, NUMBER)),
    "isnodata": (1, 1, (NUMBER,)),
    "clip": (3, 3, (NUMBER, NUMBER, NUMBER)),
    "sqrt": (1, 1, (NUMBER,)),
    "log": (1, 1, (NUMBER,)),
    "exp": (1, 1, (NUMBER,)),
    "abs": (1, 1, (NUMBER,)),
    "min": (2, MAX_NODES, (NUMBER,)),
    "max": (2, MAX_NODES, (NUMBER,)),
}
TESTS = ("isnodata",)  # the functions whose value is a condition
KEYWORDS = ("and", "or", "not", "nodata")
COMPARISONS = ("<", "<=", ">", ">=", "==", "!=")
ARITHMETIC = ("+", "-", "*", "/", "**")
# binding powers: how tightly an infix operator holds its left operand
INFIX = {"or": 10, "and": 20, **dict.fromkeys(COMPARISONS, 40), "+": 50, "-": 50, "*": 60, "/": 60, "**": 70}
NOT_OPERAND, NEGATION_OPERAND = 20, 65  # not a < b is not (a < b); -x**2 is -(x**2)

_NUMBER = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*")
_OPERATORS = ("**", "<=", ">=", "==", "!=", "<", ">", "+", "-", "*", "/", "(", ")", ",")
_HINTS = {
    "=": "'=' is not an operator (a comparison is '==')",
    "^": "'^' is not an operator (a power is '**')",
    "&": "'&' is not an operator (use and)",
    "|": "'|' is not an operator (use or)",
    "!": "'!' is not an operator (use not, or '!=')",
    "~": "'~' is not an operator (use not)",
    "%": "'%' is not an operator",
    "'": "there are no strings",
    '"': "there are no strings",
    "[": "there are no subscripts",
    ".": "there is no attribute access ('.' belongs in an input's name: PRODUCT.LAYER)",
}


class ExpressionError(ValueError):
    """What is wrong with an expression, and where: ``reason`` and ``column`` (from 1)."""

    def __init__(self, reason: str, column: int) -> None:
        super().__init__(f"{reason} at column {column}")
        self.reason, self.column = reason, column


@dataclass(frozen=True)
class _Token:
    kind: str  # "number", "name", an operator's text, "end", or "error" (its text the reason)
    text: str
    column: int


def _tokens(text: str) -> list[_Token]:
    """The text's tokens, ending with "end" — or with "error" at the first character that
    begins none, which the parser reports when it reaches it (so an error earlier in the
    text, such as a call to an unknown function, is the one reported)."""
    found, at = [], 0
    while at < len(text):
        char = text[at]
        if char in " \t\r\n":
            at += 1
            continue
        number = _NUMBER.match(text, at)
        name = _NAME.match(text, at)
        if number:
            end = number.end()
            if end < len(text) and (text[end].isalnum() or text[end] in "_."):
                reason = f"a number runs into {text[end]!r} (a name begins with a letter)"
                found.append(_Token("error", reason, end + 1))
                return found
            found.append(_Token("number", number.group(), at + 1))
            at = end
        elif name:
            found.append(_Token("name", name.group(), at + 1))
            at = name.end()
        else:
            operator = next((op for op in _OPERATORS if text.startswith(op, at)), None)
            if operator is None:
                found.append(_Token("error", _HINTS.get(char, f"unexpected character {char!r}"), at + 1))
                return found
            found.append(_Token(operator, operator, at + 1))
            at += len(operator)
    found.append(_Token("end", "", len(text) + 1))
    return found


@dataclass(frozen=True)
class _Node:
    """One operation of the tree: ``op`` is "const" (``value``; NaN: no value), "name"
    (``name``), "neg", "not", an infix operator or a function's name, over ``args``;
    ``column``: where it begins in the text (an error about it points there)."""

    op: str
    column: int
    kind: str
    args: tuple[_Node, ...] = ()
    value: float = 0.0
    name: str = ""
    depth: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "depth", 1 + max((a.depth for a in self.args), default=0))


Value = np.ndarray | tuple[np.ndarray, np.ndarray]  # a number (NaN: none), or a condition: (truth, missing)


def _finite(values: np.ndarray) -> np.ndarray:
    """Every value that is not finite made missing: an infinity becomes NaN (written only
    where there is one: a masked write of every pixel costs ten times the operation)."""
    infinite = np.isinf(values)
    if infinite.any():
        values[infinite] = np.nan
    return values


_UFUNCS = {
    "<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal, "==": np.equal, "!=": np.not_equal,
    "and": np.logical_and, "or": np.logical_or, "not": np.logical_not,
    "neg": np.negative, "+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide, "**": np.power,
    "sqrt": np.sqrt, "log": np.log, "exp": np.exp, "abs": np.abs, "min": np.minimum, "max": np.maximum,
}


def _apply(op: str, args: list[Value], dtype: type[np.floating]) -> Value:
    """One operation on its operands' values (numbers: arrays of ``dtype``; conditions:
    pairs of boolean arrays), with numpy's floating-point errors silenced by the caller."""
    if op in ("and", "or", "not"):
        conditions = [arg for arg in args if isinstance(arg, tuple)]  # (all of them: the parser checked)
        missing = functools.reduce(np.logical_or, [m for _, m in conditions])
        if op != "not":  # an operand known false (and) or true (or) settles it, the other missing or not
            settles = [~m & (t if op == "or" else ~t) for t, m in conditions]
            missing = missing & ~functools.reduce(np.logical_or, settles)
        return _UFUNCS[op](*(t & ~m for t, m in conditions)), missing
    if op == "isnodata":  # the one test of a missing value: known true or false wherever it is asked
        absent = np.isnan(np.asarray(args[0]))
        return absent, np.zeros_like(absent)
    if op == "where":
        (truth, missing), chosen, other = args
        return np.where(missing, dtype(np.nan), np.where(truth, chosen, other)).astype(dtype)
    numbers = [np.asarray(arg) for arg in args]
    if op in COMPARISONS:
        return _UFUNCS[op](*numbers), np.isnan(numbers[0]) | np.isnan(numbers[1])
    if op == "clip":
        out = np.minimum(np.maximum(numbers[0], numbers[1]), numbers[2])  # (both carry NaN)
    elif op == "**":  # IEEE's pow makes 1 of 1 ** NaN and NaN ** 0: a missing operand, a missing result
        out = np.where(np.isnan(numbers[0]) | np.isnan(numbers[1]), np.nan, np.power(numbers[0], numbers[1]))
    else:  # (min and max of two or more)
        out = functools.reduce(_UFUNCS[op], numbers) if len(numbers) > 1 else _UFUNCS[op](numbers[0])
    return _finite(np.asarray(out, dtype))


class _Parser:
    """A Pratt parser over the tokens, building checked, constant-folded nodes."""

    def __init__(self, tokens: list[_Token], names: Collection[str] | None) -> None:
        self.tokens, self.at, self.names = tokens, 0, names
        self.nodes = self.nesting = 0

    def peek(self) -> _Token:
        token = self.tokens[self.at]
        if token.kind == "error":
            raise ExpressionError(token.text, token.column)
        return token

    def take(self) -> _Token:
        token = self.peek()
        self.at += 1
        return token

    def expect(self, kind: str, what: str) -> _Token:
        token = self.peek()
        if token.kind != kind:
            raise ExpressionError(f"expected {what}, found {_shown(token)}", token.column)
        return self.take()

    def node(self, op: str, token: _Token, args: tuple[_Node, ...] = (), kind: str = NUMBER, value: float = 0.0,
             name: str = "") -> _Node:
        """A checked node, folded into a constant if its operands are constants."""
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise ExpressionError(f"more than {MAX_NODES} operations, numbers and names", token.column)
        made = _Node(op, args[0].column if op in INFIX else token.column, kind, args, value, name)
        if made.depth > MAX_DEPTH:
            raise ExpressionError(f"operations nested deeper than {MAX_DEPTH}", token.column)
        if op == "**" and args[1].op == "const" and abs(args[1].value) > MAX_EXPONENT:
            raise ExpressionError(f"the exponent {args[1].value:g} is too large: a constant exponent is at most "
                                  f"{MAX_EXPONENT} in size", args[1].column)
        if args and all(a.op == "const" for a in args):
            return _constant(made)
        return made

    def infix(self) -> str:
        """The infix operator the next token is, or ""."""
        token = self.peek()
        op = token.text if token.kind == "name" else token.kind
        return op if op in INFIX else ""

    def expression(self, power: int) -> _Node:
        self.nesting += 1
        if self.nesting > MAX_DEPTH:
            raise ExpressionError(f"operations nested deeper than {MAX_DEPTH}", self.peek().column)
        left = self.prefix()
        while (op := self.infix()) and INFIX[op] > power:
            operator = self.take()
            right = self.expression(INFIX[op] - 1 if op == "**" else INFIX[op])  # ** to the right
            for operand in (left, right):
                _want(operand, CONDITION if op in ("and", "or") else NUMBER, repr(op))
            left = self.node(op, operator, (left, right), NUMBER if op in ARITHMETIC else CONDITION)
            if op in COMPARISONS and self.infix() in COMPARISONS:
                raise ExpressionError("comparisons cannot be chained: write (a < b) and (b < c)", self.peek().column)
        self.nesting -= 1
        return left

    def prefix(self) -> _Node:
        token = self.take()
        if token.kind == "number":
            value = float(token.text)
            if not math.isfinite(value):
                raise ExpressionError(f"the number {token.text} is out of range", token.column)
            return self.node("const", token, value=value)
        if token.kind == "-":
            operand = self.expression(NEGATION_OPERAND)
            _want(operand, NUMBER, "'-'")
            return self.node("neg", token, (operand,))
        if token.kind == "(":
            inner = self.expression(0)
            self.expect(")", "')'")
            return _Node(inner.op, token.column, inner.kind, inner.args, inner.value, inner.name)
        if token.kind == "name":
            return self.named(token)
        raise ExpressionError(f"expected a value, found {_shown(token)}", token.column)

    def named(self, token: _Token) -> _Node:
        word, called = token.text, self.tokens[self.at].kind == "("  # (an error after the name: reported later)
        if word == "not":
            operand = self.expression(NOT_OPERAND)
            _want(operand, CONDITION, "not")
            return self.node("not", token, (operand,), CONDITION)
        if word == "nodata" and not called:
            return self.node("const", token, value=math.nan)
        if word in KEYWORDS:
            raise ExpressionError(f"{word!r} is not a function" if called else f"expected a value, found {word!r}",
                                  token.column)
        if called:
            return self.call(token)
        if word in FUNCTIONS:
            raise ExpressionError(f"{word!r} is a function: {word}(...)", token.column)
        if self.names is not None and word not in self.names:
            raise ExpressionError(f"unknown name {_cut(word)!r}{_suggest(word, self.names)}", token.column)
        return self.node("name", token, name=word)

    def call(self, token: _Token) -> _Node:
        if token.text not in FUNCTIONS:
            raise ExpressionError(f"unknown function {_cut(token.text)!r} (the functions: {', '.join(FUNCTIONS)})",
                                  token.column)
        least, most, kinds = FUNCTIONS[token.text]
        self.expect("(", "'('")
        args: list[_Node] = []
        if self.peek().kind != ")":
            args.append(self.expression(0))
            while self.peek().kind == ",":
                self.take()
                args.append(self.expression(0))
        self.expect(")", "',' or ')'")
        if not least <= len(args) <= most:
            wanted = f"{least}" if least == most else f"at least {least}"
            raise ExpressionError(f"{token.text} takes {wanted} argument{'s' * (least > 1)}, given {len(args)}",
                                  token.column)
        for index, arg in enumerate(args):
            _want(arg, kinds[min(index, len(kinds) - 1)], f"{token.text}'s argument {index + 1}")
        return self.node(token.text, token, tuple(args), CONDITION if token.text in TESTS else NUMBER)


def _shown(token: _Token) -> str:
    return "the end" if token.kind == "end" else repr(_cut(token.text))


def _cut(text: str) -> str:
    return text if len(text) <= 60 else text[:60] + "…"


def _want(node: _Node, kind: str, where: str) -> None:
    if node.kind != kind:
        found = "a condition" if node.kind == CONDITION else "a number"
        raise ExpressionError(f"{where} takes {'a condition' if kind == CONDITION else 'a number'}, not {found}",
                              node.column)


def _suggest(word: str, names: Collection[str]) -> str:
    close = difflib.get_close_matches(word, list(names), n=1)
    if close:
        return f" (did you mean {close[0]!r}?)"
    listed = sorted(names)
    return f" (the inputs: {', '.join(listed[:10])}{', …' if len(listed) > 10 else ''})" if listed else ""


def _constant(node: _Node) -> _Node:
    """A node whose operands are constants, computed (in float64) into one."""
    with np.errstate(all="ignore"):
        value = _apply(node.op, [_const_value(a) for a in node.args], np.float64)
    if isinstance(value, tuple):
        truth, missing = value
        number = math.nan if bool(missing) else float(bool(truth))
    else:
        number = float(value)
    return _Node("const", node.column, node.kind, value=number)


def _const_value(node: _Node) -> Value:
    if node.kind == CONDITION:
        return np.asarray(node.value == 1.0), np.asarray(math.isnan(node.value))
    return np.asarray(node.value, np.float64)


@dataclass(frozen=True)
class Expression:
    """A parsed, checked expression: evaluate it as often as needed. ``names``: the inputs
    it reads, in order of first use; ``kind``: "number" or "condition"."""

    text: str
    names: tuple[str, ...]
    kind: str
    _root: _Node = field(repr=False)

    def __str__(self) -> str:
        return self.text

    @property
    def products(self) -> tuple[str, ...]:
        """The products its ``PRODUCT.LAYER`` inputs name (aliases name none), sorted."""
        return tuple(sorted({name.split(".", 1)[0] for name in self.names if "." in name}))

    def encoding(self, unit: str = "") -> Encoding:
        """Its output's encoding: float32, NaN where there is no value, in the caller's unit."""
        return float32(unit)

    def evaluate(self, inputs: Mapping[str, np.ndarray], dtype: type[np.floating] = np.float32) -> np.ndarray:
        """Its values per pixel, given each name's values (NaN or a numpy mask: none), all of
        one shape: an array of ``dtype``, NaN where there is no value (a condition: 1 or 0)."""
        absent = [name for name in self.names if name not in inputs]
        if absent:
            raise ValueError(f"no values given for {', '.join(absent)}")
        values = {name: _as_float(inputs[name], dtype) for name in self.names}
        shapes = {v.shape for v in values.values()}
        if len(shapes) > 1:
            raise ValueError(f"inputs of different shapes: {sorted(shapes)}")
        with np.errstate(all="ignore"):
            result = _evaluate(self._root, values, dtype)
        if isinstance(result, tuple):
            truth, missing = result
            result = np.where(missing, np.nan, truth.astype(dtype))
        shape = shapes.pop() if shapes else ()
        return np.broadcast_to(result, shape).astype(dtype)


def _as_float(values: np.ndarray, dtype: type[np.floating]) -> np.ndarray:
    """An input's values as ``dtype``, NaN where masked or not finite (copied only then)."""
    if isinstance(values, np.ma.MaskedArray):
        values = np.ma.filled(values.astype(dtype), np.nan)
    values = np.asarray(values, dtype)
    infinite = np.isinf(values)
    return np.where(infinite, dtype(np.nan), values) if infinite.any() else values


def _evaluate(node: _Node, inputs: dict[str, np.ndarray], dtype: type[np.floating]) -> Value:
    if node.op == "const":
        if node.kind == CONDITION:
            return _const_value(node)
        return _finite(np.asarray(node.value, dtype))  # (a float64 constant may overflow float32)
    if node.op == "name":
        return inputs[node.name]
    return _apply(node.op, [_evaluate(arg, inputs, dtype) for arg in node.args], dtype)


def parse(text: str, names: Collection[str] | None = None) -> Expression:
    """The expression the text says, checked: ExpressionError, saying what and at which
    column, if it is not one of the language's, exceeds a bound, or (given ``names``, the
    inputs and aliases a request has) reads a name not among them."""
    if len(text) > MAX_TEXT:
        raise ExpressionError(f"the expression is {len(text):,} characters long; at most {MAX_TEXT:,}", MAX_TEXT + 1)
    parser = _Parser(_tokens(text), names)
    if parser.peek().kind == "end":
        raise ExpressionError("the expression is empty", 1)
    root = parser.expression(0)
    parser.expect("end", "an operator or the end")
    used: dict[str, None] = {}
    stack = [root]
    while stack:
        node = stack.pop()
        if node.op == "name":
            used.setdefault(node.name)
        stack.extend(reversed(node.args))
    return Expression(text, tuple(used), root.kind, root)
