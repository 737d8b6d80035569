"""Loading the catalog: the packaged TOML files, then user files that add or override entries."""

from __future__ import annotations

import copy
import functools
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import tomltext
from .check import (
    _check_complete,
    _check_entry,
    _check_host_refs,
    _check_refs,
    _fail,
    _merge,
    _parse_fragment,
    _restamp_sources,
    read_document,
)
from .schema import _SINGULAR, PACKAGED_FILES, SECTIONS, Entry, Section

CATALOG_DIR = Path(__file__).resolve().parent


def _read_toml(path: Path) -> dict[str, Any]:
    return read_document(path, f"catalog file {path}", "TOML", tomltext.loads, tomllib.TOMLDecodeError, "a TOML file")


@functools.cache
def _packaged_document(path: Path) -> dict[str, Any]:
    """A packaged catalog file, parsed once per process (``load_catalog`` copies it before use):
    a repeated ``hetersim evaluate`` loads the catalog twice, and parsing its files is 30 ms."""
    return _read_toml(path)


def _user_sections(path: Path, data: dict[str, Any]) -> dict[Section, dict[str, Any]]:
    origin = f"catalog file {path}"
    out: dict[Section, dict[str, Any]] = {}
    for name, table in data.items():
        if name not in SECTIONS:
            allowed = ", ".join(SECTIONS)
            raise _fail(origin, f"unknown section {name!r}; allowed: {allowed} (write [gpus.<key>] etc.)")
        if not isinstance(table, dict):
            raise _fail(origin, f"section {name!r} must be a table of entries, got {table!r}")
        out[name] = table  # type: ignore[index]
    return out


@dataclass(frozen=True)
class Catalog:
    """Validated catalog: per section, entry key -> dict of fields (with `sources`/`source`)."""

    gpus: dict[str, Entry]
    links: dict[str, Entry]
    models: dict[str, Entry]
    memory: dict[str, Entry]
    fleets: dict[str, Entry]

    def section(self, name: Section) -> dict[str, Entry]:
        if name not in SECTIONS:
            raise ValueError(f"unknown catalog section {name!r}; known: {', '.join(SECTIONS)}")
        return getattr(self, name)

    def gpu(self, key: str) -> Entry:
        return self._lookup("gpus", key)

    def link(self, key: str) -> Entry:
        return self._lookup("links", key)

    def model(self, key: str) -> Entry:
        return self._lookup("models", key)

    def memory_device(self, key: str) -> Entry:
        return self._lookup("memory", key)

    def fleet(self, key: str) -> Entry:
        return self._lookup("fleets", key)

    def key(self, section: Section, name: str) -> str:
        """The key of the entry of ``section`` that ``name`` names (its key, any spelling or alias)."""
        entries = self.section(section)
        return name if name in entries else self._resolve(entries, name, section)

    def same_entry(self, section: Section, names: Iterable[str]) -> tuple[str, str] | None:
        """The first two of ``names`` that name one entry by different spellings or aliases (a name
        that is no entry's -- a model file, a Hugging Face id -- names itself); None if none do."""
        seen: dict[str, str] = {}
        for name in names:
            try:
                first = seen.setdefault(self.key(section, name), name)
            except ValueError:
                first = seen.setdefault(name, name)
            if first != name:
                return first, name
        return None

    def _lookup(self, section: Section, key: str) -> Entry:
        return copy.deepcopy(self.section(section)[self.key(section, key)])

    @staticmethod
    def _resolve(entries: Mapping[str, Entry], key: str, section: Section) -> str:
        """The entry key that ``key`` names case-insensitively or as one of an entry's ``aliases``;
        failing that, the one entry that ``key`` names with its separators (spaces, ``_``, ``-``,
        ``/``) and a leading vendor word left out: ``A100 40GB``, ``a100_40gb`` and the device name
        PyTorch prints, ``NVIDIA A100-SXM4-40GB``, all name ``a100-sxm-40gb``. A key that names
        more than one entry either way is an error naming them (an entry's own key names it first)."""
        want = key.strip().lower()
        spelled = {
            k: [k, *(a.strip() for a in str(e.get("aliases", "")).split(",") if a.strip())] for k, e in entries.items()
        }
        named = sorted(k for k, names in spelled.items() if want in (n.lower() for n in names))
        if len(named) > 1:  # an alias two entries share (a user entry copied with its aliases)
            raise ValueError(f"{_SINGULAR[section]} {key!r} is ambiguous: it names {', '.join(named)}")
        if named:
            return named[0]
        loose = _loose(want)
        hits = sorted(k for k, names in spelled.items() if loose and loose in {_loose(n) for n in names})
        if len(hits) == 1:
            return hits[0]
        if hits:
            raise ValueError(f"{_SINGULAR[section]} {key!r} is ambiguous: it names {', '.join(hits)}")
        raise ValueError(f"unknown {_SINGULAR[section]} {key!r}; known: {', '.join(sorted(entries))}")


# Words a device's own name starts with that catalog keys leave out (torch.cuda.get_device_name
# prints "NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-32GB", "AMD Instinct MI300X").
_VENDOR_WORDS = ("nvidia", "tesla", "amd", "intel", "habana")


def _loose(name: str) -> str:
    """``name`` lower-cased without separators and without a leading vendor word."""
    s = re.sub(r"[\s_/-]+", "", name.strip().lower())
    for word in _VENDOR_WORDS:
        if s.startswith(word) and len(s) > len(word):
            s = s[len(word) :]
    return s


def load_catalog(extra: Sequence[str | Path] = ()) -> Catalog:
    """Load the packaged catalog, then each extra file in order (adding or overriding entries)."""
    entries: dict[Section, dict[str, Entry]] = {s: {} for s in SECTIONS}
    last_origin: dict[tuple[Section, str], str] = {}

    def add(origin: str, section: Section, table: Mapping[str, Any]) -> None:
        for key, raw in table.items():
            fragment = _parse_fragment(origin, section, key, raw)
            if key in entries[section]:
                merged = _merge(entries[section][key], fragment, section)
                _restamp_sources(merged, fragment, section, origin)
                entries[section][key] = merged
            else:
                _check_complete(origin, section, key, fragment, what="new entry")
                entries[section][key] = fragment
            last_origin[section, key] = origin

    for section, filename in PACKAGED_FILES.items():
        path = CATALOG_DIR / filename
        add(f"catalog file {path}", section, copy.deepcopy(_packaged_document(path)))
    for item in extra:
        path = Path(item)
        for section, table in _user_sections(path, _read_toml(path)).items():
            add(f"catalog file {path}", section, table)

    for (section, key), origin in last_origin.items():
        _check_entry(origin, section, key, entries[section][key])
        _check_refs(origin, section, key, entries[section][key], entries["links"])
    for (section, key), origin in last_origin.items():  # once every entry it names is checked itself
        if section == "gpus" and not origin.startswith(f"catalog file {CATALOG_DIR}"):  # a user's entry
            _check_host_refs(origin, key, entries[section][key], entries)
    return Catalog(**entries)
