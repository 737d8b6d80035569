"""``hetersim report``: a self-contained HTML page and its figures from one results dataset.

:func:`write_report` reads a sweep dataset (``dse.sweep`` layout: one ``config`` dimension,
metric variables with ``units``/``long_name``, categorical codes with ``flag_meanings``, the
study in the attributes) and writes into ``out_dir``:

* ``index.html``, which opens offline (figures embedded as base64 PNG, no scripts);
* every figure as ``<name>.png`` and ``<name>.svg``: the Pareto fronts of time to train vs cost
  and vs energy, the step-time breakdown, the memory per GPU and the memory per tier (HBM, host
  DRAM, CXL; used against capacity) of the Pareto configurations,
  heat maps of the best objective over two study axes, and the elasticities when the dataset
  has them.

Results of ``hetersim optimize`` (one record per ``trial``, the same variable names) are read the
same way, and so is the file of a streamed sweep (attribute ``streamed = 1``: only the rows it
kept, the top-k per objective and the Pareto set; the page and its notes say so). The Pareto set
is the feasible configurations that no other feasible configuration of the same model beats in
every study objective (the study's ``objectives`` attribute). A section
whose data the dataset lacks says so instead of failing; a file that is not a results dataset,
or one that lacks a variable the report cannot do without, is a one-line ``ValueError``.

Modules: :mod:`dse.report.results` (reading the dataset), :mod:`dse.report.sections` (the
sections with figures), :mod:`dse.report.figures` (drawing them), :mod:`dse.report.page` (tables,
text and the page), :mod:`dse.report.validation` (the validation numbers, cached),
:mod:`dse.report.build` (writing it all: :func:`build_report`).
"""

from dse.metrics import display
from dse.report.build import Report, build_report, default_out_dir, write_report
from dse.report.page import pareto_records, pareto_table, section_validation
from dse.report.results import (
    COLUMNS,
    REQUIRED,
    Results,
    decode,
    flag_labels,
    label_of,
    load,
    open_results,
    pareto_set,
    shown,
    streamed,
)
from dse.report.sections import (
    Figures,
    section_breakdown,
    section_fronts,
    section_heatmaps,
    section_memory,
    section_memory_tiers,
    section_sensitivity,
    sensitivity_items,
)
from dse.report.validation import validation_summary

__all__ = [
    "COLUMNS",
    "REQUIRED",
    "Figures",
    "Report",
    "Results",
    "build_report",
    "decode",
    "default_out_dir",
    "display",
    "flag_labels",
    "label_of",
    "load",
    "open_results",
    "pareto_records",
    "pareto_set",
    "pareto_table",
    "section_breakdown",
    "section_fronts",
    "section_heatmaps",
    "section_memory",
    "section_memory_tiers",
    "section_sensitivity",
    "section_validation",
    "sensitivity_items",
    "shown",
    "streamed",
    "validation_summary",
    "write_report",
]
