"""The pipeline runner: several models run in turn, each read ahead while the one before it
computes, the memory moving between them.

- :mod:`.spec`: :class:`Stage`, one model as the caller gives it, and :class:`Group`, stages
  that run together;
- :mod:`.runner`: :class:`Pipeline`, what the caller holds: runs, the report, close;
- :mod:`.run`: :class:`PipelineRun`, one run, stage by stage;
- :mod:`.loaded`: one stage as the runner holds it, loaded, kept or read ahead;
- :mod:`.staging`: the one staging pool every stage's engine stages into;
- :mod:`.group`: a group's turn in a run, the hooks that count its members' calls;
- :mod:`.ahead`: the thread that sets up the stage read ahead.
"""

from __future__ import annotations

from .run import PipelineRun
from .runner import Pipeline
from .spec import Group, Stage

__all__ = ["Group", "Pipeline", "PipelineRun", "Stage"]
