"""Shared fixtures: the packaged catalog and calibration, and small builders."""

from __future__ import annotations

import os

import pytest

from tests.xla_flags import xla_flags_for_tests

# The command line keeps compiled programs in the user's cache folder (hetersim.compile_cache);
# the suite writes nothing there (tests/test_compile_cache.py turns it on in temporary folders).
os.environ["HETERSIM_CACHE_DIR"] = "off"
# XLA compiles the model faster on the CPU under the flag tests/xla_flags.py picks for this jaxlib.
os.environ["XLA_FLAGS"] = xla_flags_for_tests(os.environ.get("XLA_FLAGS", ""))

from hetersim import build
from hetersim.catalog import load_catalog
from hetersim.fit.calibration import as_spec, load_calibration


@pytest.fixture(scope="session")
def catalog():
    return load_catalog()


@pytest.fixture(scope="session")
def held_out(catalog):
    """The leave-one-source-out predictions of the published runs (300 fit steps, as ``hetersim
    validate --cross-validate`` and ``calibrate --intervals``), computed once for the tests of
    the cross-validated error and of the intervals' coverage."""
    from hetersim.fit.calibration import held_out as leave_one_source_out

    return leave_one_source_out(catalog=catalog, steps=300)


@pytest.fixture(scope="session")
def cal():
    return as_spec(load_calibration())


def enable_x64():
    """A float64 context: ``jax.enable_x64`` (newer JAX), else ``jax.experimental.enable_x64``
    (JAX 0.4.27, the floor)."""
    import jax

    context = getattr(jax, "enable_x64", None)
    if context is None:
        from jax.experimental import enable_x64 as context
    return context()


def make(catalog, model="llama2-70b", gpu="h100-sxm-80gb", **plan):
    """(model, system, plan) specs from catalog keys and plan options."""
    opts = dict(n_gpus=64, tp=8, pp=2, global_batch=256, seq_len=4096, micro_batch=1, sp=True, zero=1)
    opts.update(plan)
    return (
        build.model_spec(catalog.model(model)),
        build.system_spec(catalog.gpu(gpu), catalog.links),
        build.plan_spec(**opts),
    )
