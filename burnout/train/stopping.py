"""When a training session stops: the end of the current phase (or of the run), the time budget
(train.max_minutes: its last step, budget.TimeBudget), or SIGTERM / SIGINT. Every rank must stop at the same
step, so the conditions are agreed across ranks (on the train step's own all-reduce)."""

from __future__ import annotations

import signal
import threading

from burnout.train.budget import TimeBudget


class StopConditions:
    """A context manager: inside it, SIGTERM (spot pre-emption, `kill`) and SIGINT (Ctrl-C) ask the loop to
    checkpoint and stop after the current step; a second Ctrl-C interrupts at once. Only the main thread
    can install handlers."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, stop_at: int, end_of_run: int, budget: TimeBudget | None = None):
        self.stop_at, self.end_of_run, self.budget = stop_at, end_of_run, budget
        self.received: int | None = None
        self.reason = "done"
        self._previous: dict = {}

    def __enter__(self) -> StopConditions:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.received == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signum

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def local_flags(self) -> list[float]:
        """[the time budget's prediction (TimeBudget.local; 0 without a budget), a signal arrived] on this rank;
        the train step agrees them across ranks (a mean: a signal on any rank makes it positive)."""
        return [self.budget.local if self.budget is not None else 0.0, float(self.received is not None)]

    def final(self, step: int, agreed: list[float]) -> bool:
        """Whether `step` (just finished) is this session's last, given the agreed local_flags; if so `reason`
        says why: done (the run's last step), phase (a phase ended), time (the time budget's last step) or signal."""
        prediction, interrupted = agreed
        time_up = self.budget is not None and self.budget.agree(prediction)
        if step >= self.stop_at or time_up or interrupted > 0:
            self.reason = ("signal" if interrupted > 0 else "time" if time_up
                           else "phase" if step < self.end_of_run else "done")
            return True
        return False
