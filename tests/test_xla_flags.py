"""The XLA flag the suite runs under (tests/xla_flags.py): set once, the one this jaxlib knows, and
(jaxlib 0.6 and later, the main run) changing no number the model gives."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.xla_flags import FLAG, FUSION_EMITTERS_SINCE, OLD_FLAG, jaxlib_version, xla_flags_for_tests

NEW_JAXLIB = (jaxlib_version() or (0, 0)) >= FUSION_EMITTERS_SINCE


def test_the_flag_is_added_once_and_a_users_own_setting_is_kept():
    flag = FLAG if NEW_JAXLIB else OLD_FLAG  # jaxlib 0.5 and older refuse FLAG
    assert xla_flags_for_tests("") == flag
    assert xla_flags_for_tests("--xla_dump_to=/tmp/x") == f"--xla_dump_to=/tmp/x {flag}"
    assert xla_flags_for_tests(xla_flags_for_tests("")) == flag
    assert flag in os.environ["XLA_FLAGS"]  # tests/conftest.py set it for this process
    mine = flag.split("=")[0] + "=" + ("true" if NEW_JAXLIB else "2")
    assert xla_flags_for_tests(mine) == mine


def _evaluate(flags: str) -> dict:
    argv = ["--model", "llama2-70b", "--gpu", "h100-sxm-80gb", "--gpus", "64", "--tp", "8", "--pp", "2"]
    argv += ["--global-batch", "256", "--zero", "1", "--json"]
    env = {**os.environ, "XLA_FLAGS": flags}
    out = subprocess.run(
        [sys.executable, "-m", "dse", "evaluate", *argv], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


@pytest.mark.slow
@pytest.mark.skipif(not NEW_JAXLIB, reason="jaxlib < 0.6 has no CPU fusion emitters to turn off")
def test_the_suites_flag_changes_no_number():
    """The same evaluation with XLA's CPU fusion emitters on (the product's default) and off (the
    suite's): every output identical, not merely close."""
    on = _evaluate("--xla_cpu_use_fusion_emitters=true")
    off = _evaluate(FLAG)
    assert on == off
    assert on["step_time_s"] > 0.0
