"""The hardware and model catalog: TOML data, a source for every number, validated on load.

The packaged data lives next to this file, one file per section (``accelerators.toml`` ->
``gpus``, ``links.toml``, ``models.toml``, ``memory.toml``), each a table per entry key. User files
passed to :func:`load_catalog` name the section first (``[gpus.my-gpu]``) and add entries or
override fields of existing ones. Every problem is reported as a one-line ``ValueError`` naming the
file, the entry and what is allowed. See ``README.md`` in this folder for the format and units.

Modules: ``schema`` (sections, fields and their rules), ``check`` (checks of entries and the merge
of an override), ``load`` (:func:`load_catalog`, :class:`Catalog`), ``overrides``
(:func:`apply_overrides`), ``models`` (model entries from dimensions or a Hugging Face config),
``calculon`` (a device from a Calculon system file, :func:`with_calculon_system`).
Import the public names from ``hetersim.catalog``. Nothing here imports JAX.
"""

from __future__ import annotations

from .calculon import with_calculon_system
from .load import CATALOG_DIR, Catalog, load_catalog
from .models import (
    hf_config_path,
    llama_ffn_hidden,
    model_entry,
    model_from_dims,
    model_from_hf_config,
    model_from_hf_id,
    model_from_json,
)
from .overrides import apply_overrides
from .schema import PACKAGED_FILES, SECTIONS, Section, fields, numeric_fields

__all__ = [
    "CATALOG_DIR",
    "PACKAGED_FILES",
    "SECTIONS",
    "Catalog",
    "Section",
    "apply_overrides",
    "fields",
    "llama_ffn_hidden",
    "load_catalog",
    "model_from_dims",
    "model_entry",
    "model_from_hf_config",
    "model_from_hf_id",
    "hf_config_path",
    "model_from_json",
    "numeric_fields",
    "with_calculon_system",
]
