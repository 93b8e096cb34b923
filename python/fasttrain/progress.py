"""A progress bar for training loops. Each bar ends with exactly one final line, written to its stream
(sys.stdout unless another is given). Before that line:

- in a terminal the bar is redrawn in place (carriage returns), cut to the terminal's width;
- in a Jupyter notebook with ipywidgets, on the notebook's own output, it is a widget that becomes the final line;
- anywhere else (a file, a pipe, a notebook without ipywidgets) it writes nothing but a plain line now and then
  (every `line_interval` seconds) during a long run: no carriage returns, no redraws."""
import shutil
import sys
import time


def _fmt_time(seconds):
    seconds = int(max(seconds, 0))
    m, s = divmod(seconds, 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def _fmt_stat(v):
    if not isinstance(v, float):
        return str(v)
    return f"{v:.0f}" if abs(v) >= 1e4 else f"{v:.4g}"  # 30125 images/s, not 3.012e+04


def _in_kernel():
    """Whether this Python is a Jupyter kernel (IPython's shell with a kernel), without importing IPython."""
    ipython = sys.modules.get("IPython")
    try:
        shell = ipython.get_ipython() if ipython is not None else None
    except Exception:
        return False
    return getattr(shell, "kernel", None) is not None


def _widgets():
    """ipywidgets and IPython.display, or None when ipywidgets is not installed."""
    try:
        import ipywidgets
        from IPython import display
    except ImportError:
        return None
    return ipywidgets, display


def _mode(stream):
    if _in_kernel() and stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__) and _widgets():
        return "widget"
    isatty = getattr(stream, "isatty", None)
    try:
        return "terminal" if isatty and isatty() else "lines"
    except ValueError:  # a closed stream
        return "lines"


class ProgressBar:
    """ProgressBar(total, desc): update(n, **stats) as work completes; close(**stats) at the end writes the final
    line. mode says how it draws: "terminal", "widget" or "lines" (see the module's docstring). total None (batches
    of a generator): the count and the time so far, without a bar."""

    def __init__(self, total, desc="", stream=None, width=28, min_interval=0.2, line_interval=30.0):
        self.total, self.desc, self.width = total, desc, width
        self.stream = sys.stdout if stream is None else stream
        self.mode = _mode(self.stream)
        self.min_interval, self.line_interval = min_interval, line_interval
        self.count = 0
        self.start = self._last = time.perf_counter()
        self.stats = {}
        self.closed = False
        self._drawn = 0  # the length of the line a terminal shows
        if self.mode == "widget":
            self._widget, self._display = self._make_widget()

    def _frac(self):
        return self.count / self.total if self.total else 1.0

    def _done(self):
        return self.total is not None and self.count >= self.total

    def _bar(self):
        filled = int(self._frac() * self.width)
        return "█" * filled + ("▏" if filled < self.width else "") + " " * max(self.width - filled - 1, 0)

    def _tail(self):
        """The text after the bar: count, elapsed and remaining time, stats."""
        elapsed = time.perf_counter() - self.start
        frac = self._frac()
        eta = elapsed / frac - elapsed if frac > 0 else 0.0
        return f"{self.count}/{self.total} [{_fmt_time(elapsed)}<{_fmt_time(eta)}] {self._stats()}"

    def _stats(self):
        return "  ".join(f"{k} {_fmt_stat(v)}" for k, v in self.stats.items())

    def _line(self):
        if self.total is None:
            elapsed = _fmt_time(time.perf_counter() - self.start)
            return f"{self.desc} {self.count} [{elapsed}] {self._stats()}".rstrip()
        return f"{self.desc} {self._frac() * 100:3.0f}%|{self._bar()}| {self._tail()}".rstrip()

    def _write(self, text):
        self.stream.write(text)
        self.stream.flush()

    def _make_widget(self):
        widgets, display = _widgets()
        bar = self

        class Box(widgets.HBox):
            def __repr__(self):  # what a front end without the widget extension shows
                return bar._line()

        label = widgets.Label(f"{self.desc} ")
        progress = widgets.IntProgress(value=0, min=0, max=max(self.total or 0, 1))
        box = Box([label, progress, widgets.Label(self._tail())])
        return box, display.display(box, display_id=True)

    def _draw_widget(self):
        label, progress, tail = self._widget.children
        progress.value = min(self.count, progress.max)
        tail.value = f" {self._frac() * 100:3.0f}% {self._tail()}" if self.total is not None else \
            self._line()[len(self.desc):]

    def update(self, n=1, **stats):
        self.count += n
        self.stats.update(stats)
        now = time.perf_counter()
        if self.mode == "lines":
            # Files and pipes get a line now and then during a long run, not a flood of redraws; the last one
            # is close()'s.
            if now - self._last >= self.line_interval and not self._done():
                self._last = now
                self._write(self._line() + "\n")
        elif now - self._last >= self.min_interval or self._done():
            self._last = now
            if self.mode == "widget":
                self._draw_widget()
            else:
                line = self._line()[:max(shutil.get_terminal_size().columns - 1, 20)]  # a wrapped line can't be redrawn
                self._write("\r" + line.ljust(self._drawn))
                self._drawn = len(line)

    def close(self, **stats):
        """Writes the final line (once: a second close does nothing)."""
        if self.closed:
            return
        self.closed = True
        self.stats.update(stats)
        line = self._line()
        if self.mode == "widget":
            self._widget.close()
            self._display.update({"text/plain": line}, raw=True)
        elif self.mode == "terminal":
            self._write("\r" + line.ljust(self._drawn) + "\n")
        else:
            self._write(line + "\n")
