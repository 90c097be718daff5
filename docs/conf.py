"""Sphinx configuration: ``make docs`` builds ``docs/_build/html`` with warnings as errors."""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the package from this checkout
sys.path.insert(0, str(HERE / "_ext"))
# Importing the operators imports Airflow, which reads (and creates) its home: keep it in the build.
os.environ.setdefault("AIRFLOW_HOME", str(HERE / "_build" / "airflow-home"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

from airflow_batchinfer import __version__  # noqa: E402

project = "airflow-batchinfer"
author = "the airflow-batchinfer authors"
copyright = "the airflow-batchinfer authors; Apache-2.0"
release = version = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
    "batchinfer_docs",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "README.md"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
smartquotes = False  # flags (--name), quotes and JSON stay as written

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"show-inheritance": True}

html_theme = "alabaster"
html_title = f"airflow-batchinfer {release}"
html_static_path = ["_static"]
html_theme_options = {
    "description": "LLM batch inference at 100M-sample scale, as an Apache Airflow provider",
    "fixed_sidebar": True,
    "page_width": "1180px",
    "sidebar_width": "240px",
}
html_sidebars = {"**": ["about.html", "navigation.html", "searchbox.html"]}
html_show_sourcelink = False
