"""A progress bar for training loops: redrawn in place in a terminal or a
notebook, plain lines when the output is a file or a pipe."""
import sys
import time


def _interactive(stream):
    if "ipykernel" in sys.modules:
        return True
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _fmt_time(seconds):
    seconds = int(max(seconds, 0))
    m, s = divmod(seconds, 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class ProgressBar:
    """ProgressBar(total, desc): update(n, **stats) as work completes; close() at the end."""

    def __init__(self, total, desc="", stream=None, width=28, min_interval=0.2):
        self.total, self.desc, self.width = total, desc, width
        self.stream = stream or sys.stderr
        self.interactive = _interactive(self.stream)
        self.min_interval = min_interval
        self.count = 0
        self.start = self._last = time.perf_counter()
        self._last_fraction = 0.0
        self.stats = {}

    def _line(self):
        elapsed = time.perf_counter() - self.start
        frac = self.count / self.total if self.total else 1.0
        filled = int(frac * self.width)
        bar = "█" * filled + ("▏" if filled < self.width else "") + " " * max(self.width - filled - 1, 0)
        eta = elapsed / frac - elapsed if frac > 0 else 0.0
        stats = "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in self.stats.items())
        return (f"{self.desc} {frac * 100:3.0f}%|{bar}| {self.count}/{self.total} "
                f"[{_fmt_time(elapsed)}<{_fmt_time(eta)}] {stats}")

    def update(self, n=1, **stats):
        self.count += n
        self.stats.update(stats)
        now = time.perf_counter()
        if self.interactive:
            if now - self._last >= self.min_interval or self.count >= self.total:
                self.stream.write("\r" + self._line())
                self.stream.flush()
                self._last = now
        elif self.total and self.count / self.total - self._last_fraction >= 0.25 and self.count < self.total:
            # Files and pipes get a line per quarter, not a flood of redraws.
            self._last_fraction = self.count / self.total
            self.stream.write(self._line() + "\n")
            self.stream.flush()

    def close(self, **stats):
        self.stats.update(stats)
        self.stream.write(("\r" if self.interactive else "") + self._line() + "\n")
        self.stream.flush()
