"""Shared fixtures: the packaged catalog and calibration, and small builders."""

from __future__ import annotations

import pytest

from hetersim import build
from hetersim.catalog import load_catalog
from hetersim.fit.calibration import as_spec, load_calibration


@pytest.fixture(scope="session")
def catalog():
    return load_catalog()


@pytest.fixture(scope="session")
def cal():
    return as_spec(load_calibration())


def make(catalog, model="llama2-70b", gpu="h100-sxm-80gb", **plan):
    """(model, system, plan) specs from catalog keys and plan options."""
    opts = dict(n_gpus=64, tp=8, pp=2, global_batch=256, seq_len=4096, micro_batch=1, sp=True, zero=1)
    opts.update(plan)
    return (
        build.model_spec(catalog.model(model)),
        build.system_spec(catalog.gpu(gpu), catalog.links),
        build.plan_spec(**opts),
    )
