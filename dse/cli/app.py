"""The typer application and its error rule: bad input is one line ``error: ...`` and exit 2."""

from __future__ import annotations

import functools
import math
import sys
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import typer
from typer.core import TyperGroup

from .interrupt import INTERRUPTED_EXIT, Interrupted, exit_now, interrupted, sigint_guard

try:  # typer >= 0.2x vendors click; its exceptions are its own classes
    from typer._click import exceptions as click
except ImportError:  # pragma: no cover - a typer that uses the click package
    from click import exceptions as click


class OneLineErrors(TyperGroup):
    """The app's group: click's usage errors (a missing option, a value that is not an integer, an
    unknown command) are one line ``error: ...`` and exit 2, like the commands' own errors,
    instead of click's usage box."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):  # type: ignore[override]
        _no_flag_metavars(self)
        try:
            clash = _given_twice(self, list(sys.argv[1:] if args is None else args))
            if clash:
                raise click.UsageError(clash)
            with sigint_guard():
                rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.NoArgsIsHelpError as error:
            if not standalone_mode:
                raise
            error.show()
            sys.exit(error.exit_code)
        except click.ClickException as error:
            if not standalone_mode:
                raise
            hint = ""
            if isinstance(error, click.BadParameter) and error.param_hint is None and error.param is not None:
                if error.param.param_type_name == "argument":  # its name, not a typer-dependent metavar
                    error.param_hint = f"'{error.param.name}'"
            if isinstance(error, click.UsageError) and error.ctx is not None:
                hint = f" (see {error.ctx.command_path} --help)"
            fail(error.format_message() + hint, error.exit_code if error.exit_code else 2, exit=sys.exit)
        except typer.Abort:
            if not standalone_mode:
                raise
            typer.echo("error: aborted", err=True)
            sys.exit(1)
        except (KeyboardInterrupt, Interrupted) as error:  # Interrupted: a command kept its work and said so
            if not standalone_mode:
                raise
            message = "interrupted" if isinstance(error, KeyboardInterrupt) else str(error)
            if message:
                typer.echo(message, err=True)
            exit_now(INTERRUPTED_EXIT)
        except RuntimeError as error:  # Ctrl-C inside a class body's __set_name__ (an import): wrapped
            if not (standalone_mode and _from_interrupt(error)):
                raise
            typer.echo("interrupted", err=True)
            exit_now(INTERRUPTED_EXIT)
        if rv == INTERRUPTED_EXIT and interrupted() and standalone_mode:  # typer's exit for a KeyboardInterrupt
            typer.echo("interrupted", err=True)
            exit_now(INTERRUPTED_EXIT)
        if standalone_mode:
            sys.exit(rv if isinstance(rv, int) else 0)
        return rv


def _from_interrupt(error: BaseException) -> bool:
    """Whether a KeyboardInterrupt caused ``error``: Python wraps one raised in a class body's
    ``__set_name__`` (``rich.progress``'s dataclasses, imported mid-command) in a RuntimeError."""
    seen = error.__cause__ or error.__context__
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _given_twice(group: Any, argv: list[str]) -> str:
    """A user's own contradiction, which click would settle silently by taking the last: a
    single-valued option given twice with different values (``--tp 2 --tp 4``), or a switch given
    both ways (``--sp --no-sp``). Options that take several (``--offload``, ``--set``) may repeat."""
    command, rest = group, list(argv)
    while rest and getattr(command, "commands", None):  # the app's own options are value-less flags
        name, rest = rest[0], rest[1:]
        command = command.commands.get(name, command) if not name.startswith("-") else command
    if "--" in rest:
        rest = rest[: rest.index("--")]
    for param in getattr(command, "params", ()):
        if getattr(param, "multiple", False) or getattr(param, "count", False) or not getattr(param, "opts", None):
            continue
        ways = {name: on for on, names in ((True, param.opts), (False, param.secondary_opts)) for name in names}
        flag = getattr(param, "is_flag", False)
        seen = [
            (token, ways[name]) if flag else (f"{name} {value}", value) for token, name, value in _given(rest, ways)
        ]
        if len({v for _, v in seen}) > 1:
            return f"{seen[0][0]} and {seen[-1][0]} contradict each other; give one"
    return _switch_clash(command, rest) or _empty_value(command, rest) or _digit_groups(command, rest)


def _empty_value(command: Any, rest: list[str]) -> str:
    """An option given an empty value (``--out ''``, ``--gpu ''``): a ``Path`` reads it as the
    current folder, a name as a key no entry has; where to write or what to read is never guessed."""
    for param in getattr(command, "params", ()):
        if param.param_type_name != "option" or getattr(param, "is_flag", False):
            continue
        for _, name, value in _given(rest, param.opts):
            if not value.strip():
                return f"{name} is empty; give {'a path' if _is_path(param) else 'a value'}"
    if any(not token.strip() for token in rest):  # no option's value (those were checked): an argument
        arguments = [p for p in getattr(command, "params", ()) if p.param_type_name == "argument"]
        one = arguments[0] if len(arguments) == 1 else None
        what = "the path it names" if one is not None and _is_path(one) else "a value"
        return f"{one.name.upper() if one is not None else 'an argument'} is empty; give {what}"
    return ""


def _digit_groups(command: Any, rest: list[str]) -> str:
    """A number with underscores (``--tp 1_0``): Python's ``int`` and ``float``, which click's
    number types call, read it as 10, a typo taken for a layout nobody asked for."""
    for param in getattr(command, "params", ()):
        if param.param_type_name == "option" and _is_number(param):
            for _, name, value in _given(rest, param.opts):
                if "_" in value:
                    return f"{name} {value} is not a number: write it with digits only (no '_')"
    return ""


def _type_name(param: Any) -> str:
    described = getattr(param, "type_descriptor", None)  # typer >= 0.28; older: click's own type
    return str(described.annotation) if described else type(getattr(param, "type", None)).__name__


def _is_path(param: Any) -> bool:
    return "Path" in _type_name(param) or getattr(param, "metavar", None) == "PATH"


def _is_number(param: Any) -> bool:
    name = _type_name(param)  # "<class 'int'>", "int | None"; click's IntParamType, FloatRange, ...
    return any(word in name for word in ("int", "float", "Int", "Float"))


def _switch_clash(command: Any, rest: list[str]) -> str:
    """A Megatron switch beside its field's own flag at another value (``--async-save
    --checkpoint-mode sync``), which the switch would override silently."""
    from .options import SWITCHES

    params = {p.name: p for p in getattr(command, "params", ())}
    for param, flag, f, value in SWITCHES:
        own = params.get("gpus" if f.name == "n_gpus" else f.name)
        if param not in params or flag not in rest or own is None:
            continue
        for _, name, given in _given(rest, own.opts):
            if given != str(value):
                return f"{flag} sets {name} {value}; it contradicts {name} {given}"
    return ""


def _given(rest: list[str], names) -> list[tuple[str, str, str]]:
    """``(token, name, value)`` of each of ``names`` in ``rest``, the value written ``--x=v`` or
    ``--x v`` (a flag's is read the same way and ignored)."""
    out = []
    for i, token in enumerate(rest):
        name, eq, value = token.partition("=")
        if name in names:
            out.append((token, name, value if eq else (rest[i + 1] if i + 1 < len(rest) else "")))
    return out


def _no_flag_metavars(command: Any) -> None:
    """Flags take no value: show none in help (typer labels every option with its type, so a flag
    read as ``--json <bool>``, as if it took one)."""
    for param in getattr(command, "params", ()):
        if getattr(param, "is_flag", False):
            param.metavar = ""
    for sub in getattr(command, "commands", {}).values():
        _no_flag_metavars(sub)


app = typer.Typer(
    # Help text is plain text: rich markup would eat every "[...]" ("[default: ...]", "[search]").
    rich_markup_mode=None,
    name="hetersim",
    help="Analytical cost model of LLM training on heterogeneous clusters.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    cls=OneLineErrors,
)


def _version(value: bool) -> None:
    if value:
        from hetersim import __version__

        typer.echo(f"hetersim {__version__}")
        raise typer.Exit()


# -1 quiet (no progress), 0 progress lines and bars on stderr, 1 also each stage's elapsed time.
VERBOSITY = {"level": 0, "start": time.perf_counter()}


@app.callback()
def main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress output on stderr."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Progress output with each stage's elapsed time."),
) -> None:
    """Analytical cost model of LLM training on heterogeneous clusters."""
    if quiet and verbose:
        raise typer.BadParameter("give one of -q/--quiet and -v/--verbose", param_hint="-q/-v")
    VERBOSITY.update(level=-1 if quiet else 1 if verbose else 0, start=time.perf_counter())
    from hetersim import compile_cache

    compile_cache.enable()  # compiled programs kept between runs ($HETERSIM_CACHE_DIR=off: not)


def show_progress() -> bool:
    """Progress bars and lines are on (stderr) unless -q."""
    return VERBOSITY["level"] >= 0


def status(message: str) -> None:
    """One progress line on stderr (``hetersim: message``), after the inputs were checked; none
    under -q, the elapsed time under -v."""
    if VERBOSITY["level"] < 0:
        return
    elapsed = f" [{time.perf_counter() - VERBOSITY['start']:.1f} s]" if VERBOSITY["level"] > 0 else ""
    typer.echo(f"hetersim: {message}{elapsed}", err=True)


USER_ERRORS = (ValueError, FileNotFoundError, tomllib.TOMLDecodeError)
# Errors of the operating system about a path the user named (a folder given for a file, a file
# that cannot be read): the message names the path; shown on one line as a user error too.
PATH_ERRORS = (IsADirectoryError, NotADirectoryError, PermissionError, FileExistsError)

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: object, code: int = 2, exit: Callable[[int], Any] | None = None) -> NoReturn:
    """Print ``error: <message>`` on one line of stderr and exit with ``code`` (``typer.Exit``
    inside a command; ``exit`` instead where typer no longer catches it)."""
    line = " ".join(part.strip() for part in str(message).splitlines() if part.strip())
    typer.echo(f"error: {line}", err=True)
    if exit is not None:
        exit(code)
    raise typer.Exit(code)


def path_error(error: OSError) -> str:
    """``<path>: <reason>`` for an operating-system error about a path."""
    where = f"{error.filename}: " if error.filename else ""
    return f"{where}{(error.strerror or str(error)).lower()}"


def user_errors(fn: F) -> F:
    """Turn a user-input error raised by a command into one line on stderr and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            _plain_paths(kwargs)
            return fn(*args, **kwargs)
        except USER_ERRORS as error:
            fail(error)
        except PATH_ERRORS as error:
            fail(path_error(error))

    return wrapper  # type: ignore[return-value]


def _plain_paths(kwargs: dict[str, Any]) -> None:
    """A path the user gave that names a device, a pipe or a socket: read, it could block for ever
    (a FIFO); written, it would be replaced by a file (``/dev/null``). Refused before any work,
    naming the flag (or the argument) that gave it."""
    from dse.atomic import check_plain

    ctx = context()
    params = {p.name: p for p in (ctx.command.params if ctx is not None else ())}
    for key, value in kwargs.items():
        param = params.get(key)
        name = param.opts[0] if param is not None and param.param_type_name == "option" else key.upper()
        for path in value if isinstance(value, list | tuple) else (value,):
            if isinstance(path, Path):
                check_plain(path, name, "a regular file or folder")


def context():
    """The running command's click context (None outside a command)."""
    try:  # typer >= 0.2x vendors click (:data:`click`)
        from typer._click.globals import get_current_context
    except ImportError:  # pragma: no cover - a typer that uses the click package
        from click import get_current_context
    return get_current_context(silent=True)


def check_seed(seed: int | None) -> None:
    """A one-line ``ValueError`` unless ``seed`` (None: not given) is one NumPy's and Optuna's
    samplers take: 0 to 2**32 - 1."""
    if seed is not None and not 0 <= seed < 2**32:
        raise ValueError(f"--seed must be between 0 and 2**32 - 1; got {seed}")


def positive(flag: str, value: int | float | None, hi: float = math.inf) -> None:
    """A one-line ``ValueError`` unless ``value`` (None: not given) is in ``(0, hi]``."""
    if value is None:
        return
    kind = "integer" if isinstance(value, int) else "number"
    if not value > 0:
        raise ValueError(f"{flag} must be a positive {kind}; got {value}")
    if value > hi:
        raise ValueError(f"{flag} must be a positive {kind} <= {hi:,.0f}; got {value:,}")
