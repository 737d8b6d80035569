"""The typer application and its error rule: bad input is one line ``error: ...`` and exit 2."""

from __future__ import annotations

import functools
import tomllib
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import typer

app = typer.Typer(
    name="hetersim",
    help="Analytical cost model of LLM training on heterogeneous clusters.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from hetersim import __version__

        typer.echo(f"hetersim {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Analytical cost model of LLM training on heterogeneous clusters."""


USER_ERRORS = (ValueError, FileNotFoundError, tomllib.TOMLDecodeError)

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: object, code: int = 2) -> NoReturn:
    line = " ".join(part.strip() for part in str(message).splitlines() if part.strip())
    typer.echo(f"error: {line}", err=True)
    raise typer.Exit(code)


def user_errors(fn: F) -> F:
    """Turn a user-input error raised by a command into one line on stderr and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except USER_ERRORS as error:
            fail(error)

    return wrapper  # type: ignore[return-value]


def positive(flag: str, value: int | float | None) -> None:
    if value is not None and not value > 0:
        raise ValueError(f"{flag} must be a positive {'integer' if isinstance(value, int) else 'number'}; got {value}")
