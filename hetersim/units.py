"""Unit conversions, in one place (jax-md's ``units.py`` habit).

Names carry their unit: ``*_GBps`` is 1e9 bytes per second, ``*_GiB`` is 2**30 bytes, ``*_us`` is
microseconds, ``*_tflops`` is 1e12 FLOP/s, ``*_Gparams_per_s`` is 1e9 parameters per second.
Inside the model everything is seconds, bytes and FLOPs.
"""

GB = 1e9
GIGA = 1e9  # of a count (parameters)
GiB = float(2**30)
TFLOP = 1e12
US = 1e-6
NS = 1e-9
HOUR = 3600.0
DAY = 86400.0
KWH = 3.6e6  # joules


def GBps(x):
    return x * GB


def GiB_to_bytes(x):
    return x * GiB


def bytes_to_GiB(x):
    return x / GiB
