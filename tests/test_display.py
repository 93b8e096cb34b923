"""How fasttrain's objects show: Program, Module, Tensor, program.summary() and fit's history as HTML tables in
Jupyter (_repr_html_, every cell escaped) and as plain text elsewhere; the progress bar's output on files, pipes,
terminals and notebooks; the history as a dict that plots itself."""
import html
import io
import json
import pickle
import re
import sys

import numpy as np
import pytest

import fasttrain as ft
from fasttrain import progress
from fasttrain._display import Column, Table

nn = ft.nn


def small_program(precision="32-true"):
    ft.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 6 * 6, 3))
    return model.compile(ft.optim.SGD(model.parameters(), lr=0.1), batch_size=8, input_shape=(1, 6, 6),
                         precision=precision)


def batches(n=4, size=8):
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((size, 1, 6, 6)).astype(np.float32), np.arange(size) % 3) for _ in range(n)]


def cells(html_text, tag):
    found = re.findall(rf"<{tag}[^>]*>(.*?)</{tag}>", html_text, re.S)
    return [html.unescape(re.sub(r"<[^>]+>", "", c)) for c in found]


def rows(html_text, section):
    body = re.search(rf"<{section}>(.*?)</{section}>", html_text, re.S).group(1)
    return [cells(r, "t[dh]") for r in re.findall(r"<tr>(.*?)</tr>", body, re.S)]


# ---------------------------------------------------------------- summary

def test_summary_is_its_text_and_its_html_has_the_same_columns_rows_and_totals():
    program = small_program()
    text = program.summary()
    assert isinstance(text, str) and text == str(text) and text.splitlines()[0].split()[0] == "#"
    page = text._repr_html_()
    assert page.startswith("<table") and "<tfoot>" in page
    lines = text.splitlines()
    assert rows(page, "thead")[0] == lines[0].split()
    node_lines = [line for line in lines if line[:3].strip().isdigit()]
    body = rows(page, "tbody")
    assert len(body) == len(node_lines) == len(program.entries)
    for row, line in zip(body, node_lines):  # the same cells, in the same order
        assert " ".join(c for c in row if c).split() == line.split()
    totals = rows(page, "tfoot")[0]
    params, mflop = re.search(r"parameters: ([\d,]+)   forward MFLOP per sample: ([\d.]+)", text).groups()
    header = rows(page, "thead")[0]
    assert totals[header.index("params")] == params and totals[header.index("MFLOP")] == mflop
    for note in lines[len(node_lines) + 2:]:  # precision, activation and memory lines
        assert f"<li>{html.escape(note)}</li>" in page


def test_model_summary_before_compiling_has_html_too():
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    text = model.summary((4,), batch_size=2)
    assert "activation memory (upper bound)" in text.splitlines()[-1]
    page = text._repr_html_()
    assert len(rows(page, "tbody")) == 3 and "+relu fused" in page and "activation memory (upper bound)" in page


def test_bf16_summary_html_shows_the_dtype_column():
    program = small_program("bf16-mixed")
    header = rows(program.summary()._repr_html_(), "thead")[0]
    assert "dtype" in header and program.summary().splitlines()[0].split() == header


def test_table_cells_are_escaped():
    t = Table([Column("a"), Column("b", 3, ">")], [["<script>", "1&2"]], {"b": ("total b", "<3>")}, ["x < y"])
    page = t.html(caption="A & <B>")
    assert "<script>" not in page and "&lt;script&gt;" in page and "1&amp;2" in page and "&lt;3&gt;" in page
    assert "<caption>A &amp; &lt;B&gt;</caption>" in page and "<li>x &lt; y</li>" in page
    assert t.text() == "a  b\n<script>1&2\ntotal b: <3>\nx < y"  # the text is not escaped


def test_summary_survives_pickling_and_ipython_shows_text_and_html():
    text = small_program().summary()
    again = pickle.loads(pickle.dumps(text))
    assert again == text and again._repr_html_() == text._repr_html_()
    formatters = pytest.importorskip("IPython.core.formatters")
    data, _ = formatters.DisplayFormatter().format(text)
    assert data["text/plain"] == str(text)  # the table itself, not a quoted string with \n in it
    assert data["text/html"] == text._repr_html_()


# ---------------------------------------------------------------- Program, Module, Tensor

def test_program_repr_is_text_and_its_html_is_the_summary_table():
    program = small_program()
    assert repr(program) == "Program(Sequential, 7 nodes, batch_size=8, precision='32-true')"
    page = program._repr_html_()
    assert "<table" in page and "<caption>Program(Sequential, 7 nodes, batch_size=8, precision=&#x27;32-true&#x27;)" \
        in page
    assert rows(page, "tbody") == rows(program.summary()._repr_html_(), "tbody")


def test_module_html_lists_each_module_with_its_parameters():
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 3)
            self.b = nn.Sequential(nn.Linear(3, 3))
            self.a.bias.requires_grad_(False)

        def extra_repr(self):
            return "<b>&"

    model = Odd()
    page = model._repr_html_()
    assert "<table" in page and "<b>" not in page and "<caption>Odd</caption>" in page
    assert rows(page, "tbody") == [["a", "Linear(in_features=4, out_features=3, bias=True)", "15"],
                                   ["b", "Sequential()", "12"],
                                   ["b.0", "Linear(in_features=3, out_features=3, bias=True)", "12"]]
    assert rows(page, "tfoot") == [["total", "", "27"]] and "<li>trainable parameters: 24</li>" in page
    assert repr(model).startswith("Odd(<b>&\n  (a): Linear")  # the text form is PyTorch's, unchanged
    leaf = nn.Linear(2, 2)._repr_html_()  # a module without children is its own row
    assert rows(leaf, "tbody") == [["", "Linear(in_features=2, out_features=2, bias=True)", "6"]]


def test_module_html_counts_a_tied_weight_once():
    emb, head = nn.Embedding(10, 4), nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    model = nn.Sequential(emb, head)
    assert rows(model._repr_html_(), "tfoot") == [["total", "", "40"]]


def test_tensor_html_has_shape_dtype_device_and_the_escaped_values():
    t = ft.arange(6, dtype=ft.float32).reshape(2, 3)
    page = t._repr_html_()
    assert rows(page, "thead") == [["shape", "dtype", "device", "requires_grad"]]
    assert rows(page, "tbody") == [["(2, 3)", "float32", "cpu", "False"]]
    assert page.endswith(f"<pre>{html.escape(repr(t))}</pre>")
    assert repr(t).startswith("tensor([[0., 1., 2.],")  # plain text elsewhere
    p = nn.Linear(2, 2).weight
    assert rows(p._repr_html_(), "tbody")[0][3] == "True"


# ---------------------------------------------------------------- history

def fitted_history(val=True, stream=None):
    program = small_program()
    return ft.fit(program, batches(), 2, val_loader=batches(2) if val else None, stream=stream or io.StringIO())


def test_history_is_the_dict_it_was():
    history = fitted_history()
    assert isinstance(history, dict) and isinstance(history, ft.History)
    assert list(history.keys()) == ["epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy", "lr",
                                    "seconds", "images_per_second", "skipped_steps", "loss_scale"]
    plain = dict(history)
    assert history == plain and plain == history and history["epoch"] == [1, 2]
    assert json.loads(json.dumps(history)) == plain
    again = pickle.loads(pickle.dumps(history))
    assert again == plain and isinstance(again, ft.History)
    assert ft.History(json.loads(json.dumps(history))) == history


def test_history_html_is_a_row_per_epoch():
    history = fitted_history(val=False)
    page = history._repr_html_()
    assert rows(page, "thead") == [list(history)]
    body = rows(page, "tbody")
    assert [r[0] for r in body] == ["1", "2"]
    assert body[0][list(history).index("val_loss")] == ""  # None: an empty cell
    assert body[1][list(history).index("train_loss")] == f"{history['train_loss'][1]:.4g}"


@pytest.fixture
def agg():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    yield plt
    plt.close("all")


def test_history_plot_draws_losses_and_accuracy(agg):
    history = fitted_history()
    axes = history.plot()
    assert len(axes) == 2 and axes[0].figure is axes[1].figure
    loss, accuracy = axes
    assert [line.get_label() for line in loss.get_lines()] == ["training", "validation"]
    np.testing.assert_allclose(loss.get_lines()[0].get_ydata(), history["train_loss"])
    np.testing.assert_allclose(loss.get_lines()[1].get_ydata(), history["val_loss"])
    assert [line.get_label() for line in accuracy.get_lines()] == ["training", "validation"]
    np.testing.assert_allclose(accuracy.get_lines()[0].get_ydata(), [100 * a for a in history["train_accuracy"]])
    np.testing.assert_allclose(accuracy.get_lines()[1].get_ydata(), [100 * a for a in history["val_accuracy"]])
    np.testing.assert_array_equal(accuracy.get_lines()[1].get_xdata(), [1, 2])
    assert accuracy.get_ylabel() == "accuracy (%)"
    buf = io.BytesIO()
    axes[0].figure.savefig(buf, format="png")
    assert buf.getvalue()[:4] == b"\x89PNG"


def test_history_plot_without_validation_draws_training_curves_only(agg):
    loss, accuracy = fitted_history(val=False).plot()
    assert [line.get_label() for line in loss.get_lines()] == ["training"]
    assert [line.get_label() for line in accuracy.get_lines()] == ["training"]
    (loss,) = ft.History(epoch=[1, 2], train_loss=[1.0, 0.5]).plot()  # a regression: no accuracy panel
    assert [line.get_label() for line in loss.get_lines()] == ["training"]


def test_history_plot_of_a_saved_history(agg):
    saved = json.loads(json.dumps(fitted_history()))
    assert len(ft.History(saved).plot()) == 2


def test_importing_fasttrain_does_not_import_matplotlib_or_ipython():
    import subprocess
    code = "import sys, fasttrain; print('matplotlib' in sys.modules, 'IPython' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


# ---------------------------------------------------------------- progress

FINAL = re.compile(r"^epoch (\d+) \((\d+)/(\d+)\) 100%\|█+\| (\d+)/\4 ")


def test_fit_writes_one_final_line_per_epoch_to_its_stream():
    stream = io.StringIO()
    history = fitted_history(stream=stream)
    out = stream.getvalue()
    assert "\r" not in out and out.endswith("\n")
    lines = out.splitlines()
    assert len(lines) == 2 and [FINAL.match(line).group(1) for line in lines] == ["1", "2"]
    assert f"loss {history['train_loss'][1]:.4g}" in lines[1] and "val_acc" in lines[1]


def test_fit_writes_progress_to_stdout_by_default(capsys):
    program = small_program()
    ft.fit(program, batches(), 3)
    out, err = capsys.readouterr()
    assert err == "" and "\r" not in out
    assert [FINAL.match(line).group(2, 3) for line in out.splitlines()] == [("1", "3"), ("2", "3"), ("3", "3")]


def test_fit_through_the_c_loader_writes_one_line_per_epoch():
    program = small_program()
    images = np.random.default_rng(0).integers(0, 255, (64, 6, 6), dtype=np.uint8)
    loader = ft.data.Loader(ft.data.from_arrays(images, np.arange(64) % 3), 8, num_workers=1)
    stream = io.StringIO()
    ft.fit(program, loader, 2, stream=stream)
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue() and len(lines) == 2 and all(FINAL.match(line) for line in lines)
    assert all(" 8/8 " in line and " lr 0.1" in line for line in lines)  # the lr even when no redraw showed it


def test_fit_over_a_generator_counts_its_batches_without_a_bar():
    """A generator has no length (it failed with TypeError unless progress=False): the line counts the batches and
    the time, without a bar or a percentage."""
    program = small_program()
    stream = io.StringIO()
    history = ft.fit(program, (b for b in batches()), 1, stream=stream)
    line, = stream.getvalue().splitlines()
    assert re.match(rf"^epoch 1 \(1/1\) {len(batches())} \[00:\d\d\] loss ", line), line
    assert "%" not in line and f"loss {history['train_loss'][0]:.4g}" in line


def test_no_progress_writes_nothing(capsys):
    ft.fit(small_program(), batches(), 1, progress=False)
    assert capsys.readouterr() == ("", "")


def test_a_long_run_on_a_file_gets_plain_lines_and_one_final_line():
    stream = io.StringIO()
    bar = progress.ProgressBar(5, "work", stream=stream, line_interval=0.0)
    assert bar.mode == "lines"
    for _ in range(5):
        bar.update(1, loss=0.5)
    bar.close(loss=0.25)
    bar.close()  # a second close writes nothing
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert [re.search(r"(\d+)/5", line).group(1) for line in lines] == ["1", "2", "3", "4", "5"]
    assert [line for line in lines if "100%" in line] == [lines[-1]] and lines[-1].endswith("loss 0.25")


def test_a_short_run_on_a_file_writes_only_the_final_line():
    stream = io.StringIO()
    bar = progress.ProgressBar(1000, "work", stream=stream)
    for _ in range(1000):
        bar.update(1)
    bar.close()
    assert stream.getvalue().count("\n") == 1 and " 100%|" in stream.getvalue()


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_terminal_gets_redraws_in_place_and_one_final_line():
    stream = Terminal()
    for epoch in range(2):
        bar = progress.ProgressBar(4, f"epoch {epoch + 1}", stream=stream, min_interval=0.0)
        assert bar.mode == "terminal"
        for _ in range(4):
            bar.update(1, img_s=123456.0)
        bar.close()
    lines = stream.getvalue().split("\n")
    assert lines[-1] == "" and len(lines) == 3  # one line per bar, each redrawn with \r
    for epoch, line in enumerate(lines[:2]):
        shown = line.split("\r")[-1]  # what the terminal shows: the last redraw
        assert shown.startswith(f"epoch {epoch + 1} 100%|") and "img_s 123456" in shown
        assert line.count("\r") >= 4


def test_a_redraw_clears_what_a_longer_one_left():
    stream = Terminal()
    bar = progress.ProgressBar(2, "x", stream=stream, min_interval=0.0)
    bar.update(1, note="a long note " * 2)
    bar.stats.clear()
    bar.close()
    first, final = stream.getvalue().rstrip("\n").split("\r")[1:]
    assert len(final) >= len(first) and final.rstrip().endswith("]")


class FakeHandle:
    def __init__(self, shown):
        self.shown = shown

    def update(self, obj, raw=False):
        self.shown.append(("update", obj, raw))


class FakeDisplay:
    """IPython.display's display(obj, display_id=True), recording what a notebook would show."""

    def __init__(self):
        self.shown = []

    def display(self, obj, display_id=False):
        self.shown.append(("display", obj))
        return FakeHandle(self.shown)


def test_in_a_notebook_with_ipywidgets_the_bar_is_a_widget_that_becomes_the_final_line(monkeypatch):
    widgets = pytest.importorskip("ipywidgets")
    shown = FakeDisplay()
    monkeypatch.setattr(progress, "_in_kernel", lambda: True)
    monkeypatch.setattr(progress, "_widgets", lambda: (widgets, shown))
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stdout", stream)
    bar = progress.ProgressBar(10, "epoch 1", min_interval=0.0)
    assert bar.mode == "widget"
    box = shown.shown[0][1]
    assert isinstance(box, widgets.HBox) and repr(box).startswith("epoch 1   0%|")
    for _ in range(10):
        bar.update(1, loss=0.5)
    assert box.children[1].value == 10 and box.children[1].max == 10 and "10/10" in box.children[2].value
    bar.close(loss=0.25)
    (kind, data, raw), = shown.shown[1:]
    assert kind == "update" and raw and data["text/plain"] == bar._line() and "100%" in data["text/plain"]
    assert stream.getvalue() == ""  # the line replaced the widget; nothing went to the stream besides


def test_in_a_notebook_a_stream_of_ones_own_gets_lines(monkeypatch):
    pytest.importorskip("ipywidgets")
    monkeypatch.setattr(progress, "_in_kernel", lambda: True)
    stream = io.StringIO()
    bar = progress.ProgressBar(3, "x", stream=stream)
    assert bar.mode == "lines"


def test_in_a_notebook_without_ipywidgets_the_bar_writes_lines(monkeypatch):
    monkeypatch.setattr(progress, "_in_kernel", lambda: True)
    monkeypatch.setattr(progress, "_widgets", lambda: None)
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stdout", stream)
    bar = progress.ProgressBar(3, "x")
    assert bar.mode == "lines"
    for _ in range(3):
        bar.update(1)
    bar.close()
    assert "\r" not in stream.getvalue() and stream.getvalue().count("\n") == 1


def test_lines_come_every_30_seconds_by_default():
    assert progress.ProgressBar(1, stream=io.StringIO()).line_interval == 30.0


def test_stream_sys_stderr_sends_progress_there(capsys):
    ft.fit(small_program(), batches(), 1, stream=sys.stderr)
    out, err = capsys.readouterr()
    assert out == "" and FINAL.match(err) and err.count("\n") == 1


# ---------------------------------------------------------------- docs/notebooks.md

def test_notebooks_md_examples_run_and_print_what_they_say(agg, capsys):
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "docs", "notebooks.md")) as f:
        first, saved = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    scope = {}
    exec(first, scope)

    def shape(line):  # the line with its numbers left out
        return re.sub(r"\d+(\.\d+)?", "N", line)

    documented = [line.split("# ", 1)[1] for line in first.splitlines() if line.startswith("# epoch")]
    shown = capsys.readouterr().out.splitlines()
    assert [shape(line) for line in shown] == [shape(line) for line in documented] and len(shown) == 2
    assert isinstance(scope["program"].summary()._repr_html_(), str) and len(scope["axes"]) == 2
    exec(saved, scope)
    assert len(scope["axes"]) == 2
