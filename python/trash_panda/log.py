"""The ``trash_panda`` logger: plans, their warnings and load summaries, for applications that
configure Python's logging. A library adds no handler but a NullHandler, so nothing is printed
unless the application asks for it (the ``trash-panda`` command logs to stderr)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._core import LoadReport
    from .plan import Plan

__all__ = ["log_plan", "log_report", "logger"]

logger = logging.getLogger("trash_panda")
logger.addHandler(logging.NullHandler())


def log_plan(plan: Plan, what: str) -> None:
    """The plan's table at INFO, each of its warnings at WARNING (once: not in the table too)."""
    if logger.isEnabledFor(logging.INFO):
        logger.info("plan for %s:\n%s", what, plan.table().rstrip())
    for w in plan.warnings:
        logger.warning("%s: %s", what, w)


def log_report(report: LoadReport) -> None:
    """A load's summary at INFO."""
    if logger.isEnabledFor(logging.INFO):
        logger.info("%s", report)
