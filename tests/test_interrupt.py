"""Ctrl-C: exit code 130 and one line, wherever it lands (:mod:`dse.cli.interrupt`).

A KeyboardInterrupt raised inside JAX (XLA's compiler, the MLIR lowering, a jaxlib import) used to
end in a segmentation fault at exit (139); the CLI's SIGINT handler leaves at once there instead.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import pytest

from dse.cli import interrupt

ROOT = Path(__file__).resolve().parents[1]


def test_a_frame_inside_jax_is_seen():
    frames = jax.tree.map(lambda _: sys._getframe(), [0])  # called back from jax's tree code
    assert interrupt.inside_jax(frames[0])
    assert not interrupt.inside_jax(sys._getframe())


def test_outside_jax_ctrl_c_is_a_keyboard_interrupt():
    """Outside JAX the usual exception, so a sweep keeps its chunks and says so."""
    with pytest.raises(KeyboardInterrupt):
        interrupt.sigint_handler(signal.SIGINT, sys._getframe())
    assert interrupt.interrupted()


def test_inside_jax_ctrl_c_leaves_at_once_with_one_line(capsys):
    frame = jax.tree.map(lambda _: sys._getframe(), [0])[0]
    interrupt.note("the chunks finished so far are kept")
    try:
        with pytest.raises(SystemExit) as exit_info:  # os._exit outside a test runner
            interrupt.sigint_handler(signal.SIGINT, frame)
    finally:
        interrupt.note("")
    assert exit_info.value.code == interrupt.INTERRUPTED_EXIT
    assert capsys.readouterr().err.strip().splitlines() == ["interrupted: the chunks finished so far are kept"]


def _sweep(out: Path) -> subprocess.Popen:
    argv = [sys.executable, "-m", "dse", "sweep", str(ROOT / "studies" / "default.toml"), "--out", str(out)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _progress_row(line: str) -> bool:
    """A row of the progress display (``compiling…``/``compiled in``, ``sweep NAME``), which rich
    prints once more when it stops on a stream that is not a terminal: where the Ctrl-C lands
    before XLA starts compiling, the sweep stops its display before it says what it kept."""
    return line.startswith(("sweep ", "compiling", "compiled in "))


@pytest.mark.slow
@pytest.mark.parametrize("delay_s", [0.0, 0.5, 1.5])
def test_ctrl_c_during_the_first_compile_exits_130_with_one_line(tmp_path, delay_s):
    """SIGINT ``delay_s`` after the checkpoint manifest is written, which comes just before the
    first chunk is traced, lowered and compiled (seconds on any machine)."""
    proc = _sweep(tmp_path)
    manifest = tmp_path / "default.nc.chunks" / "manifest.json"
    deadline = time.monotonic() + 240
    while not manifest.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(delay_s)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=240)
    lines = [line for line in err.splitlines() if line.strip() and not _progress_row(line)]
    assert proc.returncode == interrupt.INTERRUPTED_EXIT, err
    assert len(lines) == 1 and lines[0].startswith("interrupted"), err
    assert "Traceback" not in err and "Fatal Python error" not in err
    if delay_s < 1.5:
        return  # the rerun below resumes from what the interrupt left; once is enough (a compile each)
    rerun = _sweep(tmp_path)
    rerun.communicate(timeout=600)
    assert rerun.returncode == 0 and (tmp_path / "default.nc").is_file()
    assert not os.path.exists(tmp_path / "default.nc.chunks")


@pytest.mark.parametrize("delay_s", [0.2, 0.5])
def test_ctrl_c_while_the_command_line_starts_is_one_line(delay_s):
    """The console script (dse.entry) handles SIGINT before it imports typer, rich or JAX."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "dse", "validate"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    time.sleep(delay_s)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("interrupted"), err


def _run_exit(body: str) -> subprocess.CompletedProcess:
    code = "import atexit, sys, threading, time\nfrom dse.entry import _exit\n" + body
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_the_console_script_ends_with_the_commands_status_and_flushed_output():
    """dse.entry skips the interpreter's teardown (os._exit) after the command: its status, its
    buffered output and the exit handlers must survive that."""
    done = _run_exit("atexit.register(lambda: print('handler ran'))\nsys.stdout.write('buffered')\n_exit(3)")
    assert done.returncode == 3
    assert done.stdout == "bufferedhandler ran\n"
    # A thread that is not a daemon: Python's exit waits for it, and so does this one.
    waits = _run_exit(
        "threading.Thread(target=lambda: (time.sleep(0.5), print('thread done'))).start()\n"
        "try:\n    _exit(4)\nexcept SystemExit as e:\n    print('waited', e.code); raise"
    )
    assert waits.returncode == 4 and waits.stdout.split() == ["waited", "4", "thread", "done"]


def test_a_piped_evaluate_prints_all_of_its_json_and_a_bad_one_exits_2():
    base = [sys.executable, "-m", "dse", "evaluate", "--model", "llama3-8b", "--gpu", "h100-sxm-80gb", "--gpus", "8"]
    ok = subprocess.run([*base, "--global-batch", "8", "--json"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["step_time_s"] > 0
    bad = subprocess.run([*base, "--global-batch", "8", "--tp", "3"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and len(bad.stderr.splitlines()) == 1


def test_a_ctrl_c_that_python_wrapped_is_still_one_line():
    """A KeyboardInterrupt raised in a class body's ``__set_name__`` (rich.progress's dataclasses,
    imported as a sweep starts) reaches the app as a RuntimeError caused by it: a traceback in CI
    (test above, delay 0). It is an interrupt, one line and exit 130; another RuntimeError is not."""
    import typer
    from typer.testing import CliRunner

    from dse.cli.app import OneLineErrors

    def wrapped() -> None:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as error:
            raise RuntimeError("Error calling __set_name__ on 'Field' instance 'fields' in 'Task'") from error

    demo = typer.Typer(cls=OneLineErrors)
    demo.command("wrapped")(wrapped)
    demo.command("plain")(lambda: (_ for _ in ()).throw(RuntimeError("a bug")))
    result = CliRunner().invoke(demo, ["wrapped"])
    assert result.exit_code == interrupt.INTERRUPTED_EXIT and result.stderr.strip() == "interrupted"
    result = CliRunner().invoke(demo, ["plain"])
    assert isinstance(result.exception, RuntimeError) and str(result.exception) == "a bug"
