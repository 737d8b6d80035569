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
