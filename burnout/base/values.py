"""A user's values checked: numbers finite and in range, seeds within what NumPy accepts, a value's kind named.

Every number a user gives (a flag, a config key, a playground field) goes through checked_number, so that a NaN,
an infinity or a value out of range is one line naming it, never a crash later.
"""

from __future__ import annotations

import math
import sys

from burnout.errors import BurnoutError

# The seeds a user gives (train.seed, data.seed, --seed, chat's /seed): what NumPy's legacy seeding, which
# seed_everything uses, accepts.
SEED_MAX = 2**32 - 1


def kind_of(value) -> str:
    """What a value from a user's file is, for an error line: "empty", or its type's name."""
    return "empty" if value in ("", [], {}, None) else type(value).__name__


def is_finite_number(value) -> bool:
    """A real, finite int or float (a logged loss can be NaN, null or missing)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def checked_number(where: str, value, *, integer: bool = False, low: float | None = None,
                   high: float | None = None, low_open: bool = False) -> int | float:
    """`value` (a number, or a string as a flag gives it) as a finite number within [low, high] ((low, high] with
    `low_open`), a whole one with `integer`; else a one-line BurnoutError that begins with `where` (if given).

    Written so that NaN fails it: every comparison with NaN is false, so `value < low` alone lets it through.
    """
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    kind = "a whole number" if integer else "a number"

    def refuse(problem: str) -> BurnoutError:
        return BurnoutError(f"{where}: {problem}" if where else problem)

    number = value
    if isinstance(value, str):
        try:
            number = int(value) if integer else float(value)
        except ValueError:
            number = None
    if not isinstance(number, (int, float)) or isinstance(number, bool):
        raise refuse(f"{shown} is not {kind}")
    if integer and isinstance(number, float) and number.is_integer():
        number = int(number)
    elif integer and not isinstance(number, int):
        raise refuse(f"{shown} is not {kind}")
    if not integer:
        number = float(number) if abs(number) <= sys.float_info.max else math.inf  # float() of a huge int raises
    if isinstance(number, float) and not math.isfinite(number):
        raise refuse(f"{shown} is not a finite number")
    below = low is not None and (number <= low if low_open else number < low)
    if below or (high is not None and number > high):
        if high is None:
            bound = f"more than {_shown_bound(low)}" if low_open else f"at least {_shown_bound(low)}"
        elif low is None:
            bound = f"at most {_shown_bound(high)}"
        else:
            bound = f"in {'(' if low_open else '['}{_shown_bound(low)}, {_shown_bound(high)}]"
        raise refuse(f"{shown} must be {bound}")
    return number


def _shown_bound(bound: float) -> str:
    """A range's end as a person reads it: a whole number in full (a seed's 4294967295, not 4.29497e+09)."""
    return str(int(bound)) if float(bound).is_integer() and abs(bound) < 1e15 else f"{bound:g}"
