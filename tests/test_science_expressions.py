"""The expression language: the indices scientists write (NDVI, NDSI, EVI2, VHI, a quality
mask, a linear rescale) against numpy written out; precedence, kinds, masks (a missing
operand, division by zero, a logarithm of a negative, an overflow: no value, no warning);
bounds; and hostile text refused with its column, running nothing."""

from __future__ import annotations

import ast
import builtins
import inspect
import threading

import numpy as np
import pytest

from pipeline.science import expressions
from pipeline.science.expressions import MAX_DEPTH, MAX_EXPONENT, MAX_NODES, MAX_TEXT, ExpressionError, parse

pytestmark = pytest.mark.filterwarnings("error")  # a warning on the console is a failure

RED, NIR = "MCD43A4.Nadir_Reflectance_Band1", "MCD43A4.Nadir_Reflectance_Band2"
GREEN, SWIR = "MCD43A4.Nadir_Reflectance_Band4", "MCD43A4.Nadir_Reflectance_Band6"
NDVI_LAYER = "MOD13A1.500m_16_days_NDVI"
NAMES = {RED, NIR, GREEN, SWIR, NDVI_LAYER, "ndvi", "vci", "tci", "qa", "x", "y", "nir", "red", "lst"}
rng = np.random.default_rng(7)


def field(low: float, high: float, shape: tuple[int, ...] = (5, 6)) -> np.ndarray:
    values = rng.uniform(low, high, shape).astype(np.float32)
    values[rng.random(shape) < 0.15] = np.nan
    return values


def same(got: np.ndarray, expected: np.ndarray, rtol: float = 1e-6) -> None:
    assert got.dtype == np.float32 and got.shape == expected.shape
    assert np.array_equal(np.isnan(got), np.isnan(expected)), (got, expected)
    assert np.allclose(got, expected, rtol=rtol, atol=1e-7, equal_nan=True)


def written_out(function: object, *arrays: np.ndarray) -> np.ndarray:
    """numpy's answer, non-finite made NaN (the language's masks), float32."""
    with np.errstate(all="ignore"):
        out = np.asarray(function(*(a.astype(np.float64) for a in arrays)), np.float64)
    out[~np.isfinite(out)] = np.nan
    return out.astype(np.float32)


def test_ndvi_from_nbar_bands() -> None:
    red, nir = field(0, 0.5), field(0, 0.6)
    red[0, 0], nir[0, 0] = 0.0, 0.0  # 0 / 0: no value
    expression = parse(f"({NIR} - {RED}) / ({NIR} + {RED})", NAMES)
    assert expression.names == (NIR, RED) and expression.products == ("MCD43A4",)
    got = expression.evaluate({RED: red, NIR: nir})
    same(got, written_out(lambda r, n: (n - r) / (n + r), red, nir))
    assert np.isnan(got[0, 0])


def test_ndsi_evi2_vhi_mask_and_rescale() -> None:
    green, swir, nir, red = field(0, 0.8), field(0, 0.4), field(0, 0.6), field(0, 0.5)
    same(parse(f"({GREEN} - {SWIR}) / ({GREEN} + {SWIR})", NAMES).evaluate({GREEN: green, SWIR: swir}),
         written_out(lambda g, s: (g - s) / (g + s), green, swir))
    same(parse("2.5 * (nir - red) / (nir + 2.4 * red + 1)", NAMES).evaluate({"nir": nir, "red": red}),
         written_out(lambda n, r: 2.5 * (n - r) / (n + 2.4 * r + 1), nir, red))
    vci, tci = field(0, 100), field(0, 100)
    same(parse("0.5 * vci + 0.5 * tci", NAMES).evaluate({"vci": vci, "tci": tci}),
         written_out(lambda v, t: 0.5 * v + 0.5 * t, vci, tci))
    qa, x = np.array([0, 1, 2, 3, np.nan, 0], np.float32), np.array([1, 2, 3, 4, 5, np.nan], np.float32)
    same(parse("where(qa > 1, nodata, x)", NAMES).evaluate({"qa": qa, "x": x}),
         np.array([1, 2, np.nan, np.nan, np.nan, np.nan], np.float32))  # a missing qa: a missing answer
    lst = np.array([250, 270, 290, 310, 330, np.nan], np.float32)
    same(parse("clip((lst - 270) / (310 - 270), 0, 1)", NAMES).evaluate({"lst": lst}),
         np.array([0, 0, 0.5, 1, 1, np.nan], np.float32))


def value(text: str, **inputs: float) -> float:
    names = {k: np.array([v], np.float32) for k, v in inputs.items()}
    return float(parse(text, set(names) | {"x", "y"}).evaluate(names)[0]) if names else float(
        parse(text).evaluate({}))


@pytest.mark.parametrize(("text", "expected"), [
    ("1 + 2 * 3", 7), ("(1 + 2) * 3", 9), ("1 - 2 - 3", -4), ("8 / 4 / 2", 1), ("2 ** 3 ** 2", 512),
    ("-2 ** 2", -4), ("(-2) ** 2", 4), ("2 ** -1", 0.5), ("--3", 3), ("- -3", 3), ("1.5e2 + .5", 150.5),
    ("3 > 2", 1), ("3 < 2", 0), ("2 >= 2", 1), ("2 <= 1", 0), ("2 == 2", 1), ("2 != 2", 0),
    ("not 1 > 2", 1), ("not (1 > 2) and 2 > 1", 1), ("not 2 > 1 and 1 > 2", 0), ("not 2 > 1 or 2 > 1", 1),
    ("1 > 2 or 2 > 1 and 3 > 4", 0), ("1 < 2 or 1 / 0 > 3", 1), ("1 > 2 or 1 / 0 > 3", np.nan),
    ("where(1 < 2, 10, 20)", 10), ("where(not 1 < 2, 10, 20)", 20), ("clip(5, 0, 1)", 1), ("clip(-5, 0, 1)", 0),
    ("sqrt(16)", 4), ("log(1)", 0), ("exp(0)", 1), ("abs(-3)", 3), ("min(3, 1, 2)", 1), ("max(3, 1, 2)", 3),
    ("1 / 0", np.nan), ("0 / 0", np.nan), ("log(0)", np.nan), ("log(-1)", np.nan), ("sqrt(-1)", np.nan),
    ("exp(1000)", np.nan), ("nodata", np.nan), ("nodata + 1", np.nan), ("max(1, nodata)", np.nan),
    ("(-8) ** 0.5", np.nan), ("0 ** -1", np.nan), ("2 ** 16", 65536), ("10 ** 16 * 10 ** 16 * 10 ** 16", np.nan),
    ("1 ** nodata", np.nan), ("nodata ** 0", np.nan), ("2 ** 0", 1),
    ("isnodata(nodata)", 1), ("isnodata(1)", 0), ("isnodata(1 / 0)", 1), ("not isnodata(nodata + 1)", 0),
])
def test_constant_values(text: str, expected: float) -> None:
    got = value(text)
    assert (np.isnan(got) and np.isnan(expected)) or got == pytest.approx(expected), (text, got)


@pytest.mark.parametrize(("text", "x", "y", "expected"), [
    ("x / y", 1.0, 0.0, np.nan), ("x / y", 0.0, 0.0, np.nan), ("log(x)", -2.0, 0, np.nan), ("sqrt(x)", -1.0, 0, np.nan),
    ("x ** y", 2.0, 1e10, np.nan), ("x ** y", 3.0, 2.0, 9.0), ("exp(x)", 100.0, 0, np.nan),  # float32 overflows
    ("x ** y", 1.0, np.nan, np.nan), ("x ** y", np.nan, 0.0, np.nan), ("x ** 0", np.nan, 0, np.nan),
    ("x * y", 3e38, 10.0, np.nan), ("x > y", np.nan, 1.0, np.nan), ("x <= y", 1.0, np.nan, np.nan),
    ("not x > y", np.nan, 1.0, np.nan),
    ("where(x > 0, y, 5)", np.nan, 1.0, np.nan), ("where(x > 0, y, 5)", -1.0, np.nan, 5.0),
    ("where(x > 0, y, 5)", 1.0, np.nan, np.nan), ("min(x, y)", 1.0, np.nan, np.nan),
    ("clip(x, 0, y)", 0.5, np.nan, np.nan),
    ("1 / (1 / x)", 0.0, 0, np.nan), ("(x > 0) and (y > 0)", 1.0, np.nan, np.nan),
    ("(x > 0) and (y > 0)", -1.0, np.nan, 0.0), ("(y > 0) and (x > 0)", -1.0, np.nan, 0.0),  # false settles and
    ("(x > 0) or (y > 0)", 1.0, np.nan, 1.0), ("(x > 0) or (y > 0)", -1.0, np.nan, np.nan),  # true settles or
    ("not ((x > 0) or (y > 0))", 1.0, np.nan, 0.0), ("(x > 0) or (y > 0)", np.nan, np.nan, np.nan),
    ("isnodata(y)", 1.0, np.nan, 1.0), ("isnodata(x + y)", 1.0, 2.0, 0.0),  # never missing itself
    ("where(isnodata(x), y, x)", np.nan, 2.0, 2.0), ("where(not isnodata(y) and y != 0, 0, x)", 3.0, np.nan, 3.0),
])
def test_masks(text: str, x: float, y: float, expected: float) -> None:
    got = value(text, x=x, y=y)
    assert (np.isnan(got) and np.isnan(expected)) or got == pytest.approx(expected), (text, got)


def test_float64_masked_arrays_and_reuse() -> None:
    expression = parse("x * 1e-30 * 1e-30", NAMES)
    tiny = np.array([1.0, 2.0], np.float32)
    assert (expression.evaluate({"x": tiny}) == 0).all()  # float32 underflows to 0 (a value, not a mask)
    wide = expression.evaluate({"x": tiny}, dtype=np.float64)
    assert wide.dtype == np.float64 and wide[1] == pytest.approx(2e-60)
    masked = np.ma.MaskedArray([1.0, 2.0, 3.0], mask=[False, True, False])
    assert np.array_equal(parse("x + 1", NAMES).evaluate({"x": masked}), [2.0, np.nan, 4.0], equal_nan=True)
    given = np.array([1.0, np.inf, -np.inf], np.float32)
    assert np.array_equal(parse("x", NAMES).evaluate({"x": given}), [1.0, np.nan, np.nan], equal_nan=True)
    assert np.isinf(given[1:]).all()  # (the caller's array is left as it was)
    first, again = expression.evaluate({"x": tiny}), expression.evaluate({"x": tiny})
    assert np.array_equal(first, again)
    constant = parse("2 * 3").evaluate({"x": tiny})
    assert constant.shape == () and constant == 6


def test_a_condition_as_the_whole_expression_is_1_or_0() -> None:
    x = np.array([0.1, 0.9, np.nan], np.float32)
    expression = parse("x > 0.5", NAMES)
    assert expression.kind == "condition"
    assert np.array_equal(expression.evaluate({"x": x}), [0.0, 1.0, np.nan], equal_nan=True)
    assert expression.encoding("").dtype == "float32"


def test_names_products_and_encoding() -> None:
    expression = parse(f"where(qa > 1, nodata, {NDVI_LAYER}) * ndvi + {NIR} - {NDVI_LAYER}", NAMES)
    assert expression.names == ("qa", NDVI_LAYER, "ndvi", NIR)
    assert expression.products == ("MCD43A4", "MOD13A1")
    encoding = expression.encoding("NDVI")
    assert encoding.dtype == "float32" and np.isnan(encoding.nodata) and encoding.unit == "NDVI"
    assert str(expression) == expression.text
    anything = parse("a.b + c")  # without names: any name, listed for the caller to check
    assert anything.names == ("a.b", "c") and anything.products == ("a",)
    with pytest.raises(ValueError, match="no values given for c"):
        anything.evaluate({"a.b": np.zeros(2)})
    with pytest.raises(ValueError, match="shapes"):
        anything.evaluate({"a.b": np.zeros(2), "c": np.zeros(3)})


HOSTILE = [
    ("__import__('os')", "unknown function '__import__'", 1),
    ("__import__('os').system('true')", "unknown function '__import__'", 1),
    ("().__class__", "expected a value, found ')'", 2),
    ("x.__class__", "unknown name 'x.__class__'", 1),
    ("x.y.z", "unknown name 'x.y.z'", 1),
    ("open", "unknown name 'open'", 1),
    ("open('/etc/passwd')", "unknown function 'open'", 1),
    ("eval", "unknown name 'eval'", 1),
    ("eval('1')", "unknown function 'eval'", 1),
    ("exec('import os')", "unknown function 'exec'", 1),
    ("getattr(x, 'y')", "unknown function 'getattr'", 1),
    ("lambda: 1", "unknown name 'lambda'", 1),
    ("[x for x in y]", "there are no subscripts", 1),
    ("x[0]", "there are no subscripts", 2),
    ("x if y else x", "expected an operator or the end, found 'if'", 3),
    ("'x'", "there are no strings", 1),
    ('"x"', "there are no strings", 1),
    ("x; y", "unexpected character ';'", 2),
    ("x = 1", "'=' is not an operator", 3),
    ("x ^ 2", "'^' is not an operator", 3),
    ("x & y", "'&' is not an operator", 3),
    ("x @ y", "unexpected character '@'", 3),
    ("x // y", "expected a value, found '/'", 4),
    ("10**10**10", "the exponent 1e+10 is too large", 5),
    ("x**1e308", "the exponent 1e+308 is too large", 4),
    ("x**(8 * 8)", "the exponent 64 is too large", 4),
    ("x**-17", "the exponent -17 is too large", 4),
    ("1e999", "the number 1e999 is out of range", 1),
    ("2x", "a number runs into 'x'", 2),
    ("500m_16_days_NDVI", "a number runs into 'm'", 4),
    ("ndwi", "unknown name 'ndwi' (did you mean 'ndvi'?)", 1),
    ("MOD13A1.500m_16_days_NDVl", f"(did you mean '{NDVI_LAYER}'?)", 1),
    ("foo(x)", "unknown function 'foo'", 1),
    ("sqrt", "'sqrt' is a function", 1),
    ("sqrt(x, y)", "sqrt takes 1 argument, given 2", 1),
    ("where(x > 1, x)", "where takes 3 arguments, given 2", 1),
    ("clip(x)", "clip takes 3 arguments, given 1", 1),
    ("min(x)", "min takes at least 2 arguments, given 1", 1),
    ("max()", "max takes at least 2 arguments, given 0", 1),
    ("nodata(1)", "'nodata' is not a function", 1),
    ("where(x, 1, 2)", "where's argument 1 takes a condition, not a number", 7),
    ("x + (y > 1)", "'+' takes a number, not a condition", 5),
    ("x and y", "'and' takes a condition, not a number", 1),
    ("not x", "not takes a condition, not a number", 5),
    ("-(x > 1)", "'-' takes a number, not a condition", 2),
    ("x < y < 3", "comparisons cannot be chained", 7),
    ("", "the expression is empty", 1),
    ("   ", "the expression is empty", 1),
    ("(x", "expected ')', found the end", 3),
    ("x)", "expected an operator or the end, found ')'", 2),
    ("x y", "expected an operator or the end, found 'y'", 3),
    ("and", "expected a value, found 'and'", 1),
    ("min(x, y", "expected ',' or ')', found the end", 9),
]


@pytest.mark.parametrize(("text", "message", "column"), HOSTILE)
def test_hostile_and_broken_text_is_refused_saying_what_and_where(text: str, message: str, column: int) -> None:
    with pytest.raises(ExpressionError) as refused:
        parse(text, NAMES)
    assert message in refused.value.reason and refused.value.column == column, refused.value
    assert str(refused.value).endswith(f"at column {column}") and len(str(refused.value)) < 300


@pytest.mark.parametrize(("text", "message", "column"), [
    ("(" * 10_000 + "x" + ")" * 10_000, "20,001 characters long; at most 4,096", MAX_TEXT + 1),
    ("x" * (1 << 20), "1,048,576 characters long", MAX_TEXT + 1),
    ("(" * (MAX_DEPTH + 1) + "x" + ")" * (MAX_DEPTH + 1), f"nested deeper than {MAX_DEPTH}", MAX_DEPTH + 1),
    ("-" * 1000 + "x", f"nested deeper than {MAX_DEPTH}", MAX_DEPTH + 1),
    ("not " * 500 + "x > 1", f"nested deeper than {MAX_DEPTH}", 4 * MAX_DEPTH + 1),
    ("x**" * 200 + "x", f"nested deeper than {MAX_DEPTH}", 3 * MAX_DEPTH + 1),
    ("+".join(["x"] * 100), f"nested deeper than {MAX_DEPTH}", 2 * MAX_DEPTH),
    ("min(" + ", ".join(["x"] * (MAX_NODES + 1)) + ")", f"more than {MAX_NODES}", 5 + 3 * MAX_NODES),
])
def test_bounds(text: str, message: str, column: int) -> None:
    with pytest.raises(ExpressionError) as refused:
        parse(text, NAMES)
    assert message in refused.value.reason and refused.value.column == column, refused.value


def test_just_within_the_bounds() -> None:
    x = np.array([2.0], np.float32)
    assert parse("(" * (MAX_DEPTH - 1) + "x" + ")" * (MAX_DEPTH - 1), NAMES).evaluate({"x": x})[0] == 2
    assert parse(f"x ** {MAX_EXPONENT}", NAMES).evaluate({"x": x})[0] == 2.0**MAX_EXPONENT
    assert parse(f"x ** -{MAX_EXPONENT}", NAMES).evaluate({"x": x})[0] == pytest.approx(2.0**-MAX_EXPONENT)
    assert parse("+".join(["x"] * (MAX_DEPTH - 1)), NAMES).evaluate({"x": x})[0] == 2 * (MAX_DEPTH - 1)
    assert parse(" " * (MAX_TEXT - 1) + "x", NAMES).names == ("x",)
    assert parse("+".join(["1"] * 200)).evaluate({}) == 200  # numbers alone are computed as they are read
    assert parse("min(" + ", ".join(["x"] * (MAX_NODES - 1)) + ")", NAMES).evaluate({"x": x})[0] == 2


def test_nothing_is_run_while_parsing_and_evaluating() -> None:
    """Python's ways to run code or reach the system, replaced while the hostile text is
    parsed and an expression evaluated by ones that record a call."""
    called: list[str] = []
    x = np.array([1.0, -1.0], np.float32)
    refused = 0
    names = ("eval", "exec", "compile", "open", "__import__", "getattr", "setattr", "breakpoint", "input")
    table = vars(builtins)  # written directly: a replaced setattr would replace the rest

    kept = {name: table[name] for name in names}
    this_thread = threading.get_ident()

    def tripwire(name: str) -> object:
        def tripped(*args: object, **kwargs: object) -> object:
            if threading.get_ident() != this_thread:  # another thread of the process (the test runner's)
                return kept[name](*args, **kwargs)
            called.append(name)
            raise RuntimeError(f"{name} was called")
        return tripped

    try:
        table.update({name: tripwire(name) for name in names})
        for text, _, _ in HOSTILE:
            try:
                parse(text, NAMES)
            except ExpressionError:
                refused += 1
        result = parse(f"where(x > 0, sqrt(x) + log(x) ** 2, exp(-x)) / min(x, 2, {NIR})", NAMES).evaluate(
            {"x": x, NIR: x})
    finally:
        table.update(kept)
    assert called == [] and refused == len(HOSTILE)
    assert np.isfinite(result).all()


def test_the_module_calls_nothing_that_runs_code() -> None:
    tree = ast.parse(inspect.getsource(expressions))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)
                for alias in node.names} | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not imported & {"ast", "builtins", "importlib", "os", "subprocess", "code", "codeop", "operator"}
    called = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert not called & {"eval", "exec", "compile", "getattr", "setattr", "__import__", "open", "vars", "globals"}
