"""How the command line shows a UserError: plain lines on stderr, exit status the error class's
(`exit_code`: 2 for the user's mistakes, 1 for a run the machinery under it failed).

User text (a YAML key, a file name, a prompt) goes out as is: never read as rich markup, never
wrapped at the terminal width, control characters escaped so that one problem stays one line
whether stderr is a terminal, a pipe or a log file. Any other exception is a bug in rhymerl and
stays a traceback.
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from rhymerl.api.load import SpecError
from rhymerl.errors import UserError

INVALID = 2
F = TypeVar("F", bound=Callable[..., Any])
UNSAFE = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}  # controls, format, surrogates, private, unassigned, breaks


def plain(text: str) -> str:
    """`text` with control and format characters escaped (`\\n`, `\\x1b`, `\\u202e`), so it is one line
    that cannot move the cursor or recolour the terminal."""
    if text.isprintable():
        return text
    return "".join(ch.encode("unicode_escape").decode("ascii") if unicodedata.category(ch) in UNSAFE else ch
                   for ch in text)


def error_lines(exc: UserError, context: str = "") -> list[str]:
    """One line per problem: every problem of a SpecError, else the message."""
    head = f"{context}: " if context else ""
    if isinstance(exc, SpecError) and exc.problems:
        source = f"{exc.source}: " if exc.source and exc.source != context else ""
        return [plain(f"error: {head}{source}{p}") for p in exc.problems]
    return [plain(f"error: {head}{exc}")]


def print_user_error(exc: UserError, context: str = "") -> None:
    for line in error_lines(exc, context):
        typer.echo(line, err=True)


def exits_on_user_error(fn: F) -> F:
    """Wrap a command: a UserError is printed by print_user_error and the command exits with its
    class's code."""

    @functools.wraps(fn)
    def command(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            print_user_error(exc)
            raise typer.Exit(exc.exit_code) from None

    return command  # type: ignore[return-value]


class App(typer.Typer):
    """A Typer app whose every command prints a UserError as plain lines and exits with its code."""

    def command(self, *args: Any, **kwargs: Any) -> Callable[[F], F]:
        register = super().command(*args, **kwargs)

        def decorator(fn: F) -> F:
            register(exits_on_user_error(fn))
            return fn

        return decorator
