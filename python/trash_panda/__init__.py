"""trash-panda: run models bigger than your GPU by streaming weights across GPU, RAM and disk."""

from __future__ import annotations

from . import diffusers, dtype, errors
from ._core import __version__
from .adapters import AdapterHandle, adapter_report, load_adapter, read_adapter
from .checkpoint import Checkpoint
from .errors import (
    ArgumentError,
    CheckpointError,
    DtypeError,
    OrderError,
    PlanError,
    ReadError,
    StreamError,
    SystemProbeError,
    TraceError,
    TrashPandaError,
)
from .hf import from_pretrained
from .offload import (
    LoadReport,
    OffloadHandle,
    empty_weights,
    install_offload,
    measure_activation_vram,
    offload_blocks,
    release,
    stream_load,
)
from .pipeline import Group, Pipeline, PipelineRun, Stage
from .plan import Plan, Tier, plan
from .stage import stage
from .trace import trace_order

__all__ = [
    "AdapterHandle",
    "ArgumentError",
    "Checkpoint",
    "CheckpointError",
    "DtypeError",
    "Group",
    "LoadReport",
    "OffloadHandle",
    "OrderError",
    "Pipeline",
    "PipelineRun",
    "Plan",
    "PlanError",
    "ReadError",
    "StreamError",
    "Stage",
    "SystemProbeError",
    "Tier",
    "TraceError",
    "TrashPandaError",
    "__version__",
    "adapter_report",
    "diffusers",
    "dtype",
    "empty_weights",
    "install_offload",
    "load_adapter",
    "measure_activation_vram",
    "offload_blocks",
    "errors",
    "from_pretrained",
    "plan",
    "read_adapter",
    "release",
    "stage",
    "stream_load",
    "trace_order",
]
