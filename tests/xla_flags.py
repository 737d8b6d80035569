"""The XLA flags the suite runs under (set by ``tests/conftest.py`` before JAX starts)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

FLAG = "--xla_cpu_use_fusion_emitters=false"


def xla_flags_for_tests(flags: str) -> str:
    """``flags`` with XLA's CPU fusion emitters turned off, where this jaxlib has them.

    The suite compiles the model a few hundred times, each for one or a few configurations, and
    XLA's compile is most of its time. The fusion emitters (on by default in the jaxlib releases
    that have the flag, 0.6 and later) make a vmapped sweep faster but take about 40% longer to
    compile the one-configuration program (7.4 s -> 4.4 s dense, 20 s -> 13 s mixture-of-experts,
    2 cores, jaxlib 0.10.2); without them every validation prediction, dense and MoE, is the same
    to the last bit. The suite, and the command-line runs it starts (they inherit the variable),
    turn them off; the product keeps XLA's default. jaxlib 0.5 and older do not know the flag and
    XLA refuses a flag it does not know, so there ``flags`` is returned as it is, as it is where
    the caller set the flag already."""
    try:
        major, minor = (int(x) for x in version("jaxlib").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return flags
    if (major, minor) < (0, 6) or "xla_cpu_use_fusion_emitters" in flags:
        return flags
    return f"{flags} {FLAG}".strip()
