"""The one exception type a user can cause, shared by every package.

The command line prints a :class:`TunerError` on one line to stderr and exits 2,
without a traceback (``--debug`` shows it)."""

from __future__ import annotations

from enum import Enum
from typing import TypeVar

E = TypeVar("E", bound=Enum)


class TunerError(ValueError):
    """A user input was rejected: the message names the input and what would be accepted."""


class InfeasibleLayout(TunerError):
    """A layout breaks a rule (Megatron validity or memory): ``rule_id`` (e.g. ``"heads_div_tp"`` or ``"memory"``) and
    ``reason``, one sentence naming the values involved."""

    def __init__(self, rule_id: str, reason: str) -> None:
        super().__init__(f"[{rule_id}] {reason}")
        self.rule_id = rule_id
        self.reason = reason


def enum_member(enum: type[E], value: object, flag: str) -> E:
    """``value`` (a member of ``enum`` or its value, e.g. ``"bf16"``) as the member.

    Raises TunerError: ``value`` is none of ``enum``'s values; the message names ``flag`` and lists them."""
    try:
        return enum(value)
    except ValueError:
        raise TunerError(f"{flag} {value!r}: accepted {', '.join(str(e.value) for e in enum)}") from None
