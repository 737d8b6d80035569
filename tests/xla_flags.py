"""The XLA flags the suite runs under (set by ``tests/conftest.py`` before JAX starts)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

FLAG = "--xla_cpu_use_fusion_emitters=false"  # jaxlib 0.6 and later
# The first jaxlib whose XLA knows FLAG: its name is in the 0.6.0 wheel's libjax_common.so and in
# none of the 0.5.0 wheel's libraries (PyPI's manylinux2014 x86_64 cp311 wheels, searched).
FUSION_EMITTERS_SINCE = (0, 6)
OLD_FLAG = "--xla_backend_optimization_level=0"  # jaxlib 0.5 and older (the floors' run)


def jaxlib_version() -> tuple[int, int] | None:
    try:
        major, minor = (int(x) for x in version("jaxlib").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return None
    return major, minor


def xla_flags_for_tests(flags: str) -> str:
    """``flags`` with the flag that makes XLA compile the model faster on the CPU added, unless
    the caller set that flag already.

    The suite compiles the model a few hundred times, each for one or a few configurations, and
    XLA's compile is most of its time.

    * jaxlib 0.6 and later: XLA's CPU fusion emitters (on by default) make a vmapped sweep faster
      but take about 40% longer to compile the one-configuration program (7.4 s -> 4.4 s dense,
      20 s -> 13 s mixture-of-experts, 2 cores, jaxlib 0.10.2). Without them every validation
      prediction, dense and MoE, is the same to the last bit (``test_xla_flags`` checks one
      evaluation). The suite on two workers: 19.6 -> 15.0 min.
    * jaxlib 0.5 and older do not know that flag, and XLA refuses a flag it does not know. There
      LLVM's optimisation level 0 cuts the compile by a third (7.2 s -> 4.7 s dense, 32 s -> 20 s
      MoE, jaxlib 0.4.27, the floor); it fuses fewer multiply-adds, which moves the 78 dense
      validation predictions by at most 1.4e-7 of their value (float32 rounding; the MoE ones
      not at all). The floors' run (``.ci/lowest.sh -m "not slow"``) checks that the package works
      at its lower bounds, which rounding does not touch: 1218 passed, 3 skipped in 12.4 min.

    The suite and the command-line runs it starts (they inherit the variable) run with the flag;
    the product keeps XLA's defaults (the fusion emitters make ``hetersim bench`` 13% faster)."""
    have = jaxlib_version()
    if have is None:
        return flags
    flag = FLAG if have >= FUSION_EMITTERS_SINCE else OLD_FLAG
    if flag.split("=")[0] in flags:
        return flags
    return f"{flags} {flag}".strip()
