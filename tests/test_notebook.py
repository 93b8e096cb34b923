"""examples/quickstart.ipynb runs top to bottom in a Jupyter kernel (nbclient + ipykernel, this Python, this
fasttrain), and its outputs are what docs/notebooks.md says: the HTML tables of the model and of the compiled
program's summary, one progress line per epoch and no carriage-return redraws, the final accuracy printed, the
history's table and its plot."""
import json
import os
import re
import sys

import pytest

import fasttrain as ft

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "examples", "quickstart.ipynb")
KERNEL = "fasttrain-test"
FIT_LAST_LINE = 'print(f"final test accuracy: {100 * history[\'val_accuracy\'][-1]:.2f}%")'


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """The notebook after a run, in a kernel of this interpreter that imports the fasttrain under test."""
    missing = [m for m in ("nbclient", "nbformat", "ipykernel", "jupyter_client") if not _importable(m)]
    if missing:
        pytest.skip(f"running the notebook needs {', '.join(missing)} (make test installs them into .venv)")
    import nbclient
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    tmp = tmp_path_factory.mktemp("kernel")
    spec = tmp / "kernels" / KERNEL
    spec.mkdir(parents=True)
    package_root = os.path.dirname(os.path.dirname(ft.__file__))
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])),
           "MPLBACKEND": "module://matplotlib_inline.backend_inline",  # not a non-interactive one from outside
           "IPYTHONDIR": str(tmp / "ipython")}
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "fasttrain test", "language": "python", "env": env}))
    old_runtime = os.environ.get("JUPYTER_RUNTIME_DIR")
    os.environ["JUPYTER_RUNTIME_DIR"] = str(tmp / "runtime")  # the connection file, outside the home folder
    try:
        nb = nbformat.read(NOTEBOOK, as_version=4)
        km = KernelManager(kernel_name=KERNEL, kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(spec.parent)]))
        nbclient.NotebookClient(nb, km=km, kernel_name=KERNEL, timeout=300,
                                resources={"metadata": {"path": os.path.dirname(NOTEBOOK)}}).execute()
    finally:
        if old_runtime is None:
            os.environ.pop("JUPYTER_RUNTIME_DIR", None)
        else:
            os.environ["JUPYTER_RUNTIME_DIR"] = old_runtime
    return nb


def _importable(name):
    try:
        __import__(name)
    except ImportError:
        return False
    return True


def outputs(nb):
    return [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]


def texts(nb):
    """Every piece of text the notebook shows: streams, and the plain text of displays and results."""
    found = []
    for o in outputs(nb):
        if o.output_type == "stream":
            found.append(o.text)
        elif o.output_type in ("display_data", "execute_result"):
            found.append(o.data.get("text/plain", "") + "\n")
    return found


def test_the_notebook_runs_without_errors(executed):
    errors = [o for o in outputs(executed) if o.output_type == "error"]
    assert not errors, "\n".join(f"{e.ename}: {e.evalue}" for e in errors)


def cell(nb, last_line):
    """The outputs of the code cell whose last line is last_line."""
    return next(c for c in nb.cells if c.cell_type == "code" and c.source.strip().splitlines()[-1] == last_line).outputs


def test_the_model_and_the_summary_show_as_html_tables(executed):
    (model,) = cell(executed, "model")
    assert "<table" in model.data["text/html"] and "Conv2d(1, 16, kernel_size=(3, 3)" in model.data["text/html"]
    (summary,) = cell(executed, "program.summary()")
    html = summary.data["text/html"]
    assert "<table" in html and "<tfoot>" in html and "+relu fused" in html and "precision: 32-true" in html
    # outside HTML, the same table as text (not a quoted string)
    assert summary.data["text/plain"].splitlines()[0].split() == ["#", "node", "output", "params", "MFLOP", "dtype",
                                                                  "notes"]


def test_one_progress_line_per_epoch_and_no_redraws(executed):
    shown = "".join(texts(executed))
    assert "\r" not in shown
    lines = [line for line in shown.splitlines() if re.match(r"epoch \d+ \(\d/2\)", line)]
    assert len(lines) == 2, lines
    assert lines[0].startswith("epoch 1 (1/2) 100%") and lines[1].startswith("epoch 2 (2/2) 100%")
    assert all("val_acc" in line for line in lines)


def test_the_final_accuracy_is_printed(executed):
    found = re.findall(r"final test accuracy: ([\d.]+)%", "".join(texts(executed)))
    assert len(found) == 1 and float(found[0]) > 70.0, found


def test_the_history_shows_as_a_table_and_plots(executed):
    (history,) = cell(executed, "history")
    assert "<table" in history.data["text/html"] and "val_accuracy" in history.data["text/html"]
    plotted = cell(executed, "axes = history.plot()")
    assert [o.output_type for o in plotted] == ["display_data"] and "image/png" in plotted[0].data  # shown once


def test_with_ipywidgets_each_bar_became_its_final_line(executed):
    if not _importable("ipywidgets"):
        pytest.skip("ipywidgets is not installed: the bar wrote its lines to the stream (checked above)")
    shown = [o for o in cell(executed, FIT_LAST_LINE) if o.output_type == "display_data"]
    assert [o.data["text/plain"][:18] for o in shown] == ["epoch 1 (1/2) 100%", "epoch 2 (2/2) 100%"]
    assert all(set(o.data) == {"text/plain"} for o in shown)  # no widget left in the saved notebook
