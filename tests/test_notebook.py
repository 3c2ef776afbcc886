"""The LP notebook runs top to bottom without an error."""

from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient
from time_limits import limit

from core.paths import REPO

NOTEBOOK = REPO / "experiments" / "notebooks" / "verification_lp.ipynb"


@pytest.mark.slow
def test_verification_lp_notebook_executes(tmp_path):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code_cells and all(not cell.outputs for cell in code_cells)  # stored with outputs cleared
    NotebookClient(notebook, kernel_name="python3", timeout=round(limit(300)),
                   resources={"metadata": {"path": str(tmp_path)}}).execute()  # raises on any cell error
    printed = "".join(out.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                      for out in cell.outputs)
    assert "LP bound" in printed and "notebook ran in" in printed
