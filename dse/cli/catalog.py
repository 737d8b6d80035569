"""``hetersim catalog``: list what the catalog knows."""

from enum import StrEnum
from pathlib import Path

import typer

from dse import format as fmt
from hetersim.catalog import SECTIONS, load_catalog

from .app import app, user_errors

CatalogSection = StrEnum("CatalogSection", {name: name for name in SECTIONS})


@app.command("catalog")
@user_errors
def catalog_cmd(
    section: CatalogSection = typer.Argument(..., help="Which part of the catalog to list."),
    as_json: bool = typer.Option(False, "--json", help="Print the entries (with their sources) as JSON."),
    catalog_files: list[Path] = typer.Option([], "--catalog", help="Extra catalog TOML file, repeatable."),
) -> None:
    """List what the catalog knows: GPUs, links, models or memory devices."""
    entries = load_catalog(catalog_files).section(section.value)
    if as_json:
        typer.echo(fmt.dumps(entries))
    else:
        fmt.console().print(fmt.catalog_table(section.value, entries))
