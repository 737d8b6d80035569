"""Cases the earlier rounds left, each refused as :mod:`tests.test_bad_input` checks its cases (exit
2, one ``error:`` line naming the flag, no traceback, the folder as it was): ``optimize --trials 0``
without a storage wrote an empty results file and reported "no feasible trial"; with a journal
that does not exist it created one, and with a journal that holds none of the study's trials it
added the study to it and wrote an empty results file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_bad_input import check_refused

ROOT = Path(__file__).resolve().parents[1]
STUDY = str(ROOT / "studies" / "optimize" / "llama2-13b-hardware.toml")


@pytest.fixture
def tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # anything written to the current folder shows in the listing
    return tmp_path


def test_optimize_with_no_trials_and_no_storage_is_refused(tmp):
    check_refused(tmp, ["optimize", STUDY, "--trials", "0", "--out", "{tmp}/o"], ["--trials 0", "--storage"])


def test_optimize_with_no_trials_on_a_missing_journal_creates_none(tmp):
    args = ["optimize", STUDY, "--trials", "0", "--storage", "{tmp}/j.log", "--out", "{tmp}/o"]
    check_refused(tmp, args, ["--storage", "j.log", "no such journal file"])


def test_optimize_with_no_trials_on_a_journal_without_the_study_leaves_it_as_it_was(tmp):
    import optuna
    from optuna.storages.journal import JournalFileBackend

    journal = tmp / "j.log"
    storage = optuna.storages.JournalStorage(JournalFileBackend(str(journal)))
    optuna.create_study(storage=storage, study_name="another")  # a study with no trial
    before = journal.read_bytes()
    for name in ("another", "llama2-13b-hardware"):  # no trial; not in the journal at all
        args = ["optimize", STUDY, "--trials", "0", "--storage", "{tmp}/j.log", "--out", "{tmp}/o"]
        args += ["--study-name", name] if name == "another" else []
        check_refused(tmp, args, ["--storage", "holds no trial of study", repr(name)])
    assert journal.read_bytes() == before


# The tenth fuzz round (a helper session, 295 cases over stacks, optimize storage, export/report,
# calibrate and the small subcommands): its defects, each refused before anything is written.


def test_a_refused_optimize_leaves_the_journal_it_shares_as_it_was(tmp):
    """A journal holding this study's name for another study file: the run is refused, and Optuna's
    create-if-missing no longer appends a record to the journal before the refusal."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    from dse.optimize.storage import FINGERPRINT_ATTR

    journal = tmp / "j.log"
    storage = optuna.storages.JournalStorage(JournalFileBackend(str(journal)))
    study = optuna.create_study(storage=storage, study_name="llama2-13b-hardware", directions=["minimize"] * 2)
    study.set_user_attr(FINGERPRINT_ATTR, "another study file")
    before = journal.read_bytes()
    args = ["optimize", STUDY, "--trials", "2", "--batch", "2", "--storage", "{tmp}/j.log", "--out", "{tmp}/o"]
    check_refused(tmp, args, ["--study-name llama2-13b-hardware", "another study file"])
    assert journal.read_bytes() == before


def test_report_into_a_folder_whose_page_is_a_folder_draws_nothing(tmp):
    from tests.test_bad_input_seventh import _results

    _results(lambda ds: None).to_netcdf(tmp / "r.nc")
    (tmp / "rep" / "index.html").mkdir(parents=True)
    check_refused(tmp, ["report", "{tmp}/r.nc", "--no-validation", "--out", "{tmp}/rep"], ["--out", "is a folder"])


@pytest.mark.parametrize("command", [["export", "{tmp}/d", "--csv", "{tmp}/t.csv"], ["report", "{tmp}/d"]])
def test_a_folder_given_as_results_file_is_named_a_folder(tmp, command):
    (tmp / "d").mkdir()
    check_refused(tmp, command, ["d: a folder, not a results file"])


def _r141(tmp: Path, **columns: str) -> Path:
    """The published ZeRO-Offload run on one V100 (r141) with extra columns."""
    lines = (ROOT / "hetersim" / "data" / "published_runs.csv").read_text().splitlines()
    row = next(line for line in lines if line.startswith("r141-"))
    path = tmp / "r.csv"
    path.write_text(",".join([lines[0], *columns]) + "\n" + ",".join([row, *columns.values()]) + "\n")
    return path


def test_a_runs_row_naming_a_kernel_its_device_cannot_run_is_refused(tmp):
    """A fused attention kernel on a V100 was scored as an infeasible row, a 100% miss."""
    check_refused(tmp, ["validate", "--runs", str(_r141(tmp, attention="flash"))], ["row r141-", "attention flash"])


def test_a_runs_row_may_leave_its_loss_to_the_stack_as_its_attention(tmp_path):
    from hetersim.catalog import load_catalog
    from hetersim.fit.runs import read_runs, row_inputs

    path = _r141(tmp_path, loss="auto", attention="auto")
    inputs = row_inputs(read_runs(path)[0], load_catalog(), path)
    plan = inputs["plan"]
    assert plan["loss"] == "auto" and plan["attention"] == "auto"  # the stack's kernels, as the device runs them


def test_a_plan_files_own_value_is_named_by_the_file_not_a_flag(tmp):
    """``attention = "flash"`` in a V100 plan file was reported as ``--attention flash``, a flag the
    user never gave; with the flag given, the flag is named."""
    plans = ROOT / "tests" / "data" / "plans"
    text = (plans / "amp.toml").read_text().replace('precision = "fp16"', 'precision = "fp16"\nattention = "flash"')
    (tmp / "p.toml").write_text(text)
    model = "--layers 24 --hidden 1024 --heads 16 --vocab 50304 --mlp plain --seq-len 1024 --ffn-hidden 4096".split()
    args = ["evaluate", *model, "--catalog", str(plans / "kinds.toml"), "--plan", "{tmp}/p.toml"]
    check_refused(tmp, args, ["p.toml: attention flash cannot run on"])
    check_refused(tmp, [*args, "--attention", "flash"], ["--attention flash cannot run on"])


def test_a_study_offers_auto_only_where_it_means_something(tmp):
    text = (ROOT / "studies" / "cxl_pool_2hosts.toml").read_text()
    (tmp / "s.toml").write_text(text.replace("[plan]", '[plan]\nstack = "nemo"', 1))
    line = check_refused(tmp, ["sweep", "{tmp}/s.toml", "--out", "{tmp}/o"], ["plan.stack", "deepspeed-2020"])
    assert '"auto"' not in line


def test_a_mix_without_its_step_says_it_is_missing(tmp):
    text = (ROOT / "studies" / "optimize" / "mix-budget.toml").read_text().replace(", step = 64 }", " }")
    (tmp / "m.toml").write_text(text)
    line = check_refused(tmp, ["optimize", "{tmp}/m.toml", "--trials", "2", "--out", "{tmp}/o"], ["search.mix.step"])
    assert "missing" in line and "None" not in line


def test_export_does_not_replace_a_results_file_with_a_table(tmp):
    from tests.test_bad_input_seventh import _results

    _results(lambda ds: None).to_netcdf(tmp / "r.nc")
    _results(lambda ds: None).to_netcdf(tmp / "other.nc")
    before = (tmp / "other.nc").read_bytes()
    check_refused(tmp, ["export", "{tmp}/r.nc", "--csv", "{tmp}/other.nc"], ["--csv", "other.nc", "results file"])
    assert (tmp / "other.nc").read_bytes() == before


def test_calibrate_does_not_overwrite_a_text_file(tmp):
    (tmp / "notes.txt").write_text("my notes\n")
    check_refused(tmp, ["calibrate", "--steps", "2", "--out", "{tmp}/notes.txt"], ["--out", "notes.txt", "no TOML"])
    assert (tmp / "notes.txt").read_text() == "my notes\n"
