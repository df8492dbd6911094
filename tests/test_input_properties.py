"""Every number a user gives, through every door (a command's flags, a config value, the playground's fields):
for any value at all, either it is accepted as a finite number in its range, or the answer is one line, exit 2
(a BurnoutError, or a gr.Error in the playground), never a traceback. Property-based: hypothesis draws the values.
"""

import argparse
import dataclasses
import functools
import math
import sys
import typing

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from burnout import cli
from burnout.base.values import checked_number
from burnout.config import TRAIN_SECTIONS, DataConfig, ModelConfig, TokenizerConfig, TrainConfig, load_run_config
from burnout.errors import BurnoutError

# What a user may type: numbers as text (NaN and the infinities among them), numbers in other spellings, words.
TYPED = st.one_of(st.floats().map(str), st.integers().map(str), st.floats().map(repr),
                  st.sampled_from(["nan", "-nan", "inf", "-inf", "1e400", "1_000", "0x10", " 7 ", "", "½", "1e-400"]),
                  st.text(max_size=12))
# What a JSON body or a YAML file may hold.
ANY_VALUE = st.one_of(st.floats(), st.integers(), st.booleans(), st.none(), st.text(max_size=12),
                      st.lists(st.integers(), max_size=2), st.sampled_from([10 ** 400, -(10 ** 400), 2.0 ** 1023]))
# Derandomized: CI draws the same values on every run (and keeps no example database in the repo).
PROPERTY = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def _assert_in_bounds(value, bounds: dict, integer: bool) -> None:
    assert isinstance(value, int if integer else float) and not isinstance(value, bool)
    assert integer or math.isfinite(value)
    low, high = bounds.get("low"), bounds.get("high")
    if low is not None:
        assert value > low if bounds.get("low_open") else value >= low
    if high is not None:
        assert value <= high


# ------------------------------------------------------------------------------------------------
# checked_number, the one check behind the flags and the playground


@PROPERTY
@given(value=st.one_of(TYPED, ANY_VALUE), integer=st.booleans(), low=st.one_of(st.none(), st.integers(-5, 5)),
       span=st.one_of(st.none(), st.integers(0, 10)), low_open=st.booleans())
def test_checked_number_accepts_a_finite_number_in_range_or_says_why_in_one_line(value, integer, low, span,
                                                                                  low_open):
    bounds = {"low": low, "high": None if span is None or low is None else low + span, "low_open": low_open}
    try:
        number = checked_number("field", value, integer=integer, **bounds)
    except BurnoutError as exc:
        assert str(exc).startswith("field: ") and "\n" not in str(exc) and len(str(exc)) < 120
        return
    _assert_in_bounds(number, bounds, integer)


@pytest.mark.parametrize("value, check, expected", [
    ("7", {}, 7.0), (7, {"integer": True}, 7), (3.0, {"integer": True}, 3), ("2.5", {}, 2.5),
    (1, {"low": 0, "high": 1}, 1.0), (0, {"low": 0}, 0.0), (sys.float_info.max, {}, sys.float_info.max),
    ("123456789012345678901234567890", {"integer": True}, 123456789012345678901234567890),
])
def test_checked_number_takes_each_edge_of_its_range(value, check, expected):
    number = checked_number("n", value, **check)
    assert number == expected and type(number) is type(expected)


@pytest.mark.parametrize("value, check, refusal", [
    ("abc", {}, "n: 'abc' is not a number"),
    ("abc", {"integer": True}, "n: 'abc' is not a whole number"),
    (2.5, {"integer": True}, "n: 2.5 is not a whole number"),
    ("1e3", {"integer": True}, "n: '1e3' is not a whole number"),
    (True, {}, "n: True is not a number"),
    (float("nan"), {}, "n: nan is not a finite number"),
    (-1, {"low": 0}, "n: -1 must be at least 0"),
    (0, {"low": 0, "low_open": True}, "n: 0 must be more than 0"),
    (6, {"high": 5}, "n: 6 must be at most 5"),
    (0, {"low": 0, "high": 1, "low_open": True}, "n: 0 must be in (0, 1]"),
    (0.5, {"low": 1, "high": 500}, "n: 0.5 must be in [1, 500]"),
    ("x" * 38, {}, "n: '" + "x" * 38 + "' is not a number"),  # a repr of 40 characters is shown whole
    ("x" * 39, {}, "n: '" + "x" * 36 + "... is not a number"),  # a longer one is cut to 37 and "..."
])
def test_checked_number_refuses_with_the_field_the_value_and_the_range(value, check, refusal):
    with pytest.raises(BurnoutError) as refused:
        checked_number("n", value, **check)
    assert str(refused.value) == refusal
    with pytest.raises(BurnoutError) as unnamed:
        checked_number("", value, **check)
    assert str(unnamed.value) == refusal.removeprefix("n: ")


# ------------------------------------------------------------------------------------------------
# Every numeric flag of every command


def _actions():
    """(command path, action) for every argument of every command."""
    stack = [((), cli.build_parser())]
    while stack:
        path, parser = stack.pop()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(((*path, name), sub) for name, sub in action.choices.items())
            else:
                yield path, action


NUMERIC_FLAGS = sorted(((path, action.option_strings[-1], action) for path, action in _actions()
                        if action.option_strings and hasattr(action.type, "bounds")), key=lambda f: f[:2])


def test_every_numeric_flag_is_checked():
    """No flag slips back to a bare type=int or type=float (which take 'nan' and '-3')."""
    assert not [(path, action.option_strings) for path, action in _actions() if action.type in (int, float)]
    assert len(NUMERIC_FLAGS) >= 30


@functools.cache  # the whole parser is walked once per command, not once per drawn value
def _required(path: tuple[str, ...]) -> tuple[str, ...]:
    """Placeholders for a command's required arguments, so that only the flag under test decides."""
    argv = []
    for where, action in _actions():
        if where == path and action.option_strings and action.required:
            argv += [action.option_strings[-1], "x"]
        elif where == path and not action.option_strings and action.nargs in (None, "+"):
            argv.append("x")
    return tuple(argv)


@pytest.mark.slow
@PROPERTY
@given(flag=st.sampled_from(NUMERIC_FLAGS), text=TYPED)
def test_a_numeric_flag_takes_a_finite_number_in_range_or_exits_2_with_one_line(flag, text):
    path, option, action = flag
    argv = [*path, *_required(path), f"{option}={text}"]
    try:
        args, _ = cli.build_parser().parse_known_args(argv)
    except BurnoutError as exc:  # main() prints it as one line, exit 2 (tests/test_cli.py)
        named = "/".join(action.option_strings)  # argparse names a flag by all its spellings (--gpus/--devices)
        assert str(exc).startswith(f"argument {named}: ") and "\n" not in str(exc), exc
        return
    _assert_in_bounds(getattr(args, action.dest), action.type.bounds, action.type.integer)


# ------------------------------------------------------------------------------------------------
# Every numeric config value


def _numeric_fields() -> list[tuple[str, str]]:
    """(section, field) of every int or float field (optional or not) of the config's sections; a field of one of
    train's sections by its short name, train.KEY, as the command line and messages name it."""
    found = []
    sections = [("model", ModelConfig), ("data", DataConfig), ("tokenizer", TokenizerConfig), ("train", TrainConfig),
                *(("train", cls) for cls in TRAIN_SECTIONS.values())]
    for section, cls in sections:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            types = set(typing.get_args(hints[f.name])) or {hints[f.name]}
            if types & {int, float}:
                found.append((section, f.name))
    return found


NUMERIC_FIELDS = _numeric_fields()


@PROPERTY
@given(key=st.sampled_from(NUMERIC_FIELDS), value=st.one_of(TYPED, st.sampled_from([".nan", ".inf", "-.inf"])))
def test_a_numeric_config_value_is_finite_once_accepted_or_refused_in_one_line(key, value):
    section, name = key
    try:
        cfg = load_run_config("quickstart", [f"{section}.{name}={value}"])
    except BurnoutError as exc:
        assert "\n" not in str(exc)
        return
    accepted = getattr(getattr(cfg, section), name)
    assert accepted is None or (isinstance(accepted, (int, float)) and not isinstance(accepted, bool)
                                and (isinstance(accepted, int) or math.isfinite(accepted))), accepted


def test_the_config_properties_cover_the_fields_that_matter():
    assert {("train", "lr"), ("train", "grad_clip"), ("model", "dropout"), ("data", "val_fraction")} <= set(
        NUMERIC_FIELDS)


# ------------------------------------------------------------------------------------------------
# The playground's fields, as its API receives them (any JSON value)


@pytest.fixture(scope="module")
def playground_handlers(sampled_runs):
    pytest.importorskip("gradio")
    from burnout.playground import app, catalog

    entries = catalog.discover(sampled_runs)
    blocks = app.build_app(entries, catalog.ModelCache(entries, 2 ** 30))
    handlers = {fn.api_name: fn.fn for fn in blocks.fns.values()}
    return handlers, list(entries)


@PROPERTY
@given(prompt=st.one_of(st.text(max_size=20), ANY_VALUE), max_new=ANY_VALUE, temperature=ANY_VALUE,
       top_k=ANY_VALUE, top_p=ANY_VALUE, penalty=ANY_VALUE, which=st.sampled_from(["generate", "side_by_side"]))
def test_a_playground_request_is_answered_or_refused_in_one_line(playground_handlers, prompt, max_new, temperature,
                                                                 top_k, top_p, penalty, which):
    import gradio as gr

    handlers, labels = playground_handlers
    target = labels[-1] if which == "generate" else labels[-2:]
    try:
        outputs = list(handlers[which](target, prompt, max_new, temperature, top_k, top_p, penalty))
    except gr.Error as exc:
        assert "\n" not in exc.message
        return
    assert outputs and isinstance(prompt, str) and prompt.strip()
    assert all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
               for v in (max_new, temperature, top_k, top_p, penalty))
