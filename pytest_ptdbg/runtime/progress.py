"""A progress bar for long work (compare, compare_distributed), shown only where a person waits.

:class:`Progress` draws ``label [#####.....] 4/16 detail`` on one line of standard error, redrawn in
place, when that stream is a terminal (or ``enabled=True``); otherwise it prints nothing at all, so
logs, CI output and captured test output stay as they were. At most ~10 redraws a second. No torch.
"""
from __future__ import annotations

import sys
import time
from typing import Optional, TextIO

__all__ = ["Progress", "is_terminal"]


def is_terminal(stream: Optional[TextIO] = None) -> bool:
    """Whether ``stream`` (default: standard error) is an interactive terminal."""
    s = stream if stream is not None else sys.stderr
    try:
        return bool(s.isatty())
    except (AttributeError, ValueError):   # closed, or not a real stream
        return False


class Progress:
    """``with Progress(total, "comparing") as p: p.update(k, "rank3")``; silent off a terminal."""

    def __init__(self, total: int, label: str, enabled: Optional[bool] = None,
                 stream: Optional[TextIO] = None, width: int = 30) -> None:
        self.total = max(0, int(total))
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = is_terminal(self.stream) if enabled is None else bool(enabled)
        self.width = width
        self.done = 0
        self._last = 0.0
        self._drawn = False

    def update(self, done: int, detail: str = "", force: bool = False) -> None:
        """Set the count of finished items (and a short text after the bar); redraw if due."""
        self.done = min(int(done), self.total) if self.total else int(done)
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and self.done < self.total and now - self._last < 0.1:
            return
        self._last = now
        frac = self.done / self.total if self.total else 1.0
        fill = int(round(frac * self.width))
        text = f"\r{self.label} [{'#' * fill}{'.' * (self.width - fill)}] {self.done}/{self.total}"
        if detail:
            text += f" {detail}"
        try:
            self.stream.write(text[:200] + "\x1b[K")
            self.stream.flush()
            self._drawn = True
        except (OSError, ValueError):
            self.enabled = False

    def close(self) -> None:
        """End the bar's line (nothing when it was never drawn)."""
        if self.enabled and self._drawn:
            try:
                self.stream.write("\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass
        self._drawn = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
