"""load_pipeline(): a diffusers pipeline whose large components are streamed by trash_panda.

The components named in ``stream`` are built from their configs on the meta device and loaded
with stream_load, so diffusers' from_pretrained never reads them into RAM; the others are loaded
by diffusers as usual. With ``chain=True`` the streamed components are the stages of a
:class:`trash_panda.Pipeline`, in the order the pipeline calls them: a component's stage starts
when the pipeline first calls it (and one pipeline call is one run), the next component is read
while it runs, and what the next components do not need the memory of stays loaded for the next
call.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .checkpoint import Checkpoint
from .errors import ArgumentError
from .hf import build_empty, checkpoint_dtype, checkpoint_of, guard_to
from .offload import empty_weights
from .offload.registry import model_hooks
from .offload.tuner_layers import expect_device, watch_peft

if TYPE_CHECKING:
    import torch
    from torch import nn

    from .pipeline import Pipeline, PipelineRun

__all__ = ["load_pipeline", "pipeline_report", "release_pipeline"]

_ATTR = "_trash_panda_pipeline"
_LIBRARIES = ("diffusers", "transformers")
# The name, in each chained component's hook registry, of the pre-hooks that load it.
CHAIN = "pipeline_chain"
# What a diffusers pipeline calls as its __call__ ends (for its model offload's hooks).
_END_OF_CALL = "maybe_free_model_hooks"


@dataclass
class _Component:
    name: str
    model: nn.Module
    path: Path  # its checkpoint, opened again for each load (release() closes it)
    stage: contextlib.AbstractContextManager[Any] | None = None  # the stage() it is loaded in
    key_map: Any = None  # a single file's tensors under the model's names (files=)
    group: str | None = None  # a chain's group of components run together, it is a member of


@dataclass
class _Chain:
    """The runner of a chained pipeline, and the run and stage open in it: entered by the chain
    hooks, left when the next component starts (or the pipeline is called again) and at the
    release."""

    runner: Pipeline
    run_cm: contextlib.AbstractContextManager[PipelineRun] | None = None
    run: PipelineRun | None = None
    stage_cm: contextlib.AbstractContextManager[Any] | None = None
    at: int = -1  # the component running, by its place in the chain
    busy: int = 0  # module calls of its components under way

    def enter(self, index: int, name: str, group: str | None = None) -> None:
        """Starts the component ``name`` (or the ``group`` it is a member of, whose members
        share ``index``): ends the one running, and the run when ``name`` does not come after
        it (the pipeline was called again)."""
        self.leave_stage()
        if self.run is None or index <= self.at:
            self.leave_run()
            self.run_cm = self.runner.run()
            self.run = self.run_cm.__enter__()
        stage = self.run.group(group) if group is not None else self.run.stage(name)
        stage.__enter__()  # left when the next component starts: the pipeline says when
        self.stage_cm, self.at = stage, index

    def leave_stage(self) -> None:
        if self.stage_cm is not None:
            stage, self.stage_cm = self.stage_cm, None
            stage.__exit__(None, None, None)

    def leave_run(self) -> None:
        self.leave_stage()
        if self.run_cm is not None:
            run, self.run_cm, self.run = self.run_cm, None, None
            run.__exit__(None, None, None)
        self.at = -1


@dataclass
class _Streamed:
    """The streamed components of one pipeline and, with chain=True, the runner of its chain."""

    components: list[_Component]
    device: torch.device
    plan_kwargs: dict[str, Any]
    chain: bool
    overlap: bool = False
    chained: _Chain | None = None
    pipeline_class: type | None = None  # a chain's pipeline's own class (see _reporting_device)
    groups: dict[str, list[str]] = field(default_factory=dict)  # a chain's groups, by name


def load_pipeline(
    pipeline_cls: Any,
    folder: str | os.PathLike[str],
    *,
    stream: Iterable[str] = ("transformer",),
    chain: bool = False,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device | None = None,
    overlap: bool = False,
    files: Mapping[str, str | os.PathLike[str]] | None = None,
    groups: Mapping[str, Sequence[str]] | None = None,
    **plan_kwargs: Any,
) -> Any:
    """Builds ``pipeline_cls`` (a diffusers pipeline class) from ``folder`` with the components
    named in ``stream`` (``"transformer"``, ``"unet"``, ``"text_encoder"`` ...) streamed.

    The keyword arguments go to :func:`trash_panda.plan` for each streamed component; ``dtype``
    is their compute dtype (by default their checkpoint's). With ``chain=True`` the streamed
    components are the stages of a :class:`trash_panda.Pipeline` and ``ram`` and ``vram`` are
    its budget: what the components it holds together may take, not each one's. ``overlap``
    goes to each streamed component's :func:`trash_panda.stage`: with ``True`` its resident
    blocks (and the weights outside its blocks that its order file places after the first
    block) are read on a worker thread while it starts to run, in its run order, rather than
    before the stage begins; a chain's :class:`trash_panda.Pipeline` always reads so. A chain's
    call of the pipeline ends its last component as the call ends (diffusers pipelines call
    ``maybe_free_model_hooks`` there). The other components are loaded by diffusers and moved
    to ``device``. :func:`pipeline_report` prints what a chain did; free everything with
    :func:`release_pipeline`.

    ``files`` gives a streamed component its weights from one file instead of its folder's, as
    diffusers' ``from_single_file`` does: a GGUF file (``{"transformer":
    "flux1-dev-Q4_K_M.gguf"}``, relative to ``folder`` or a path) or a single safetensors file,
    its names converted by diffusers' own converter for the component's class (transformers'
    tables for a transformers component). The folder still gives the configs. A GGUF file's
    blocks stay in their GGML form in every tier and are expanded one block at a time.

    ``groups`` (with ``chain=True``) names streamed components that run together, as
    :class:`trash_panda.Group` does for a :class:`trash_panda.Pipeline`: ``{"experts":
    ["transformer", "transformer_2"]}``, each group's members next to one another in
    ``stream``. By default Wan 2.2's two experts (``transformer`` and ``transformer_2``) are a
    group, and so is a ``controlnet`` with the denoiser it guides (``unet`` or
    ``transformer``); ``groups={}`` makes none. The schedule of a group's calls is learned from
    the first call of the pipeline: members that take turns are then loaded one at a time,
    the next read while the one before it runs; members that alternate are loaded together.
    """
    if not isinstance(pipeline_cls, type) or not hasattr(pipeline_cls, "from_pretrained"):
        raise ArgumentError(f"pipeline_cls: expected a diffusers pipeline class, got {pipeline_cls!r}")
    root = Path(folder)
    index_file = root / "model_index.json"
    if not index_file.is_file():
        raise ArgumentError(f"folder: {root} has no model_index.json (expected a diffusers pipeline folder)")
    names = [stream] if isinstance(stream, str) else list(stream)
    if not names:
        raise ArgumentError("stream: expected the names of one or more components")
    index = json.loads(index_file.read_text(encoding="utf-8"))
    for name in names:
        entry = index.get(name)
        if not isinstance(entry, list) or len(entry) != 2 or entry[0] not in _LIBRARIES:
            have = [k for k, v in index.items() if isinstance(v, list) and len(v) == 2 and v[0] in _LIBRARIES]
            raise ArgumentError(
                f"stream: {name!r} is not a diffusers or transformers component of {index_file} "
                f"(components: {', '.join(have)})"
            )
    if "plan" in plan_kwargs:
        raise ArgumentError("plan: each component is planned on its own; pass plan options (max_vram=, ...)")
    if not isinstance(overlap, bool):
        raise ArgumentError(f"overlap: expected True or False, got {overlap!r}")
    singles = _single_files(root, files, names)
    if groups is not None and not chain:
        raise ArgumentError("groups: expected chain=True (the components of a chain are what runs in groups)")
    chained = _chain_groups(names, groups) if chain else {}
    return _load_pipeline(
        pipeline_cls, root, index, names, chain, dtype, device, overlap, plan_kwargs, singles, chained
    )


# The components a chain groups unless told otherwise: Wan 2.2's experts, which take turns
# (one for the high-noise steps, one for the rest), and a ControlNet with the denoiser it
# guides at every step.
_EXPERTS = ("transformer", "transformer_2")
_DENOISERS = ("unet", "transformer")


def _chain_groups(names: list[str], groups: Mapping[str, Sequence[str]] | None) -> dict[str, list[str]]:
    """The groups of a chain's components ``names``: ``groups`` checked, or the default ones
    the streamed components make."""
    if groups is None:
        found: dict[str, list[str]] = {}
        if all(n in names for n in _EXPERTS):
            found["experts"] = list(_EXPERTS)
        denoiser = next((d for d in _DENOISERS if d in names), None)
        # A stage is in one group at most: experts guided by a ControlNet need groups= given.
        if "controlnet" in names and denoiser is not None and "experts" not in found:
            found["controlnet"] = ["controlnet", denoiser]
        groups = found
    if not isinstance(groups, Mapping):
        raise ArgumentError(f"groups: expected a dict of group names to component names, got {type(groups).__name__}")
    out: dict[str, list[str]] = {}
    for name, members in groups.items():
        if isinstance(members, str) or not all(isinstance(m, str) for m in members):
            raise ArgumentError(f"groups: {name}: expected a list of component names, got {members!r}")
        members = sorted(members, key=lambda m: names.index(m) if m in names else -1)
        unknown = [m for m in members if m not in names]
        if unknown:
            raise ArgumentError(
                f"groups: {name}: {', '.join(unknown)} not streamed; expected some of {', '.join(names)}"
            )
        places = [names.index(m) for m in members]
        if places != list(range(places[0], places[0] + len(places))):
            raise ArgumentError(
                f"groups: {name}: {', '.join(members)} run together, so they are loaded as one; expected "
                f"them next to one another in stream= (given {', '.join(names)})"
            )
        out[name] = members
    return out


def _single_files(root: Path, files: object, names: list[str]) -> dict[str, Path]:
    if files is None:
        return {}
    if not isinstance(files, Mapping):
        raise ArgumentError(f"files: expected a dict of component names to files, got {type(files).__name__}")
    out = {}
    for name, file in files.items():
        if name not in names:
            raise ArgumentError(f"files: expected streamed components ({', '.join(names)}), got {name!r}")
        if not isinstance(file, (str, os.PathLike)):
            raise ArgumentError(f"files: expected a file name or path for {name!r}, got {type(file).__name__}")
        path = Path(file) if Path(file).is_absolute() else root / file
        if not path.is_file():
            raise ArgumentError(f"files: expected a file for {name!r}, and {path} is not one")
        out[name] = path
    return out


def _load_pipeline(
    pipeline_cls: Any,
    root: Path,
    index: dict[str, Any],
    names: list[str],
    chain: bool,
    dtype: str | torch.dtype | None,
    device: str | torch.device | None,
    overlap: bool,
    plan_kwargs: dict[str, Any],
    singles: dict[str, Path],
    groups: dict[str, list[str]],
) -> Any:
    from torch import nn

    from .device import resolve_device

    dev = resolve_device(device)
    streamed = _Streamed([], dev, plan_kwargs, chain, overlap, groups=groups)
    try:
        for name in names:
            library, class_name = index[name]
            cls = getattr(importlib.import_module(library), class_name)
            model, path, key_map = _build(cls, library, root / name, dtype, singles.get(name))
            group = next((g for g, members in groups.items() if name in members), None)
            streamed.components.append(_Component(name, model, path, key_map=key_map, group=group))
            if not chain:
                _begin_stage(streamed, streamed.components[-1])
        pipe = pipeline_cls.from_pretrained(root, **{c.name: c.model for c in streamed.components})
    except BaseException:
        _release_all(streamed)
        raise
    for name, component in pipe.components.items():
        if isinstance(component, nn.Module) and name not in names:
            component.to(dev)
    if chain:
        streamed.chained = _Chain(_runner(streamed))
        for c in streamed.components:
            _chain_hooks(streamed, c)
            expect_device(c.model, dev)  # adapters loaded before its first call go there
            if isinstance(getattr(type(c.model), "device", None), property):
                # Until its first call it is on meta, and a pipeline sends its inputs where the
                # component says it is: the chain's device, as its load will place it.
                object.__setattr__(c.model, _CHAIN_DEVICE, dev)
                c.model.__class__ = _reporting_device(type(c.model))
            # diffusers' LoRA loading moves a text encoder "to" its own device: for a component
            # still on meta that would send its buffers there too.
            guard_to(c.model)
        watch_peft()
        # Until a component is loaded it is on meta, and a diffusers pipeline takes its
        # execution device from ``device`` (its ``_execution_device`` does, for components that
        # no accelerate hook offloads): the chain's pipeline reports the chain's device.
        streamed.pipeline_class = type(pipe)
        pipe.__class__ = _reporting_device(type(pipe))
        end = getattr(pipe, _END_OF_CALL, None)
        if callable(end):
            # Each diffusers pipeline calls it as its __call__ ends: the call's last component
            # ends there, not when the next call starts (its time and what it keeps or gives
            # back are the call's, and its given-back memory goes to the next call's reads).
            setattr(pipe, _END_OF_CALL, functools.partial(_end_of_call, streamed.chained, end))
    setattr(pipe, _ATTR, streamed)
    return pipe


def _build(
    cls: Any, library: str, folder: Path, dtype: str | torch.dtype | None, single: Path | None = None
) -> tuple[nn.Module, Path, Any]:
    """A component built from its config on meta (buffers real), its checkpoint's path, and the
    map of a single file's names to its own (None for its folder's checkpoint)."""
    from ._dtypes import resolve

    if library == "transformers":
        path = single if single is not None else checkpoint_of(folder)
        model, compute = build_empty(cls, folder, Checkpoint(path), dtype)
    else:
        path = single if single is not None else checkpoint_of(folder, "diffusion_pytorch_model")
        compute = resolve(dtype) if dtype is not None else checkpoint_dtype(Checkpoint(path))
        with empty_weights():
            model = cls.from_config(cls.load_config(folder)).eval()
        if model.dtype != compute:
            model.to(compute)
    model._trash_panda_compute = compute
    key_map = None
    if single is not None:
        ckpt = Checkpoint(path)
        if library == "transformers":
            if ckpt.gguf_metadata() is not None:
                from .gguf_names import gguf_tensor_map

                key_map = gguf_tensor_map(model, ckpt)
        else:
            from .diffusers_names import diffusers_tensor_map

            key_map = diffusers_tensor_map(model, ckpt)
        ckpt.close()
    return model, path, key_map


def _runner(streamed: _Streamed) -> Pipeline:
    """The pipeline runner of a chain: one stage per streamed component, in the order given."""
    from .pipeline import Group, Pipeline, Stage

    # The budgets are the chain's: its components together hold no more than ram= and vram=.
    kw = streamed.plan_kwargs
    options = {k: v for k, v in kw.items() if k not in ("device", "ram", "vram")}

    def stage(c: _Component) -> Stage:
        # The component itself, on meta again after each release: the pipeline object holds it.
        model = c.model
        own = {"compute_dtype": model._trash_panda_compute, **options}
        if c.key_map is not None:
            own["key_map"] = c.key_map
        return Stage(c.name, lambda: model, c.path, options=own)

    return Pipeline(
        [stage(c) for c in streamed.components],
        device=streamed.device,
        ram=kw.get("ram"),
        vram=kw.get("vram"),
        groups=[Group(name, members) for name, members in streamed.groups.items()],
    )


def _begin_stage(streamed: _Streamed, c: _Component) -> None:
    """Plans, loads and hooks one component in a :func:`trash_panda.stage` (chain=False): its
    order file and its remembered activation memory come with it."""
    from .stage import stage

    kwargs = {"compute_dtype": c.model._trash_panda_compute, "device": streamed.device, **streamed.plan_kwargs}
    if c.key_map is not None:
        kwargs["key_map"] = c.key_map
    cm = stage(lambda: c.model, c.path, overlap=streamed.overlap, **kwargs)
    cm.__enter__()  # entered here and left in _end_stage: the pipeline, not a with block, says when
    c.stage = cm
    guard_to(c.model)


def _end_stage(c: _Component) -> None:
    if c.stage is not None:
        cm, c.stage = c.stage, None
        cm.__exit__(None, None, None)  # releases the model (and writes its order file if need be)


def _end_of_call(chain: _Chain, end: Any, *args: Any, **kwargs: Any) -> Any:
    if chain.busy == 0:
        chain.leave_run()
    return end(*args, **kwargs)


def _chain_hooks(streamed: _Streamed, c: _Component) -> None:
    """Hooks that start the component's stage before it, or any of its direct children, runs:
    a pipeline may call ``vae.decode`` rather than the VAE's forward.

    They are the first of the component's hooks (``pipeline_chain`` in the registry's rank
    table): the refusal a released component puts on itself comes after them (loading it lifts
    that), and so do the waits for weights that its stage adds as it starts, or that the
    runner's thread added while the component before it ran (they wait for memory only its
    start lets in). The registry walks its own list of the module's hooks as the call goes, so
    the hooks the start added run in this same call, at their ranks. A component's call ends
    once the next one's read-ahead is set up (:meth:`~trash_panda.Pipeline.settle`)."""
    chain = streamed.chained
    assert chain is not None
    # A group's members start as one: the group's own hooks start each member's turn.
    index = next(i for i, other in enumerate(streamed.components) if other is c or (c.group and other.group == c.group))

    calls = [0]  # the component's module calls under way (a child's inside its forward)

    def before() -> None:
        calls[0] += 1
        chain.busy += 1
        if chain.at == index:
            return
        chain.enter(index, c.name, c.group)
        guard_to(c.model)

    def after() -> None:
        calls[0] = max(0, calls[0] - 1)
        chain.busy = max(0, chain.busy - 1)
        if calls[0] == 0:
            # The next component is set up on the runner's thread while this one runs: it is
            # loaded by the time this call ends, as a stage read ahead is by its turn.
            chain.runner.settle()

    hooks = model_hooks(c.model)
    modules = [c.model, *(m for m in c.model.children() if any(True for _ in m.parameters()))]
    for m in modules:
        hooks.on_module_start(CHAIN, m, before)
        hooks.on_module_end(CHAIN, m, after)


_REPORTING: dict[type, type] = {}  # each pipeline or component class, its chained subclass
# A chained component's attribute: the chain's device, which its ``device`` reports.
_CHAIN_DEVICE = "_trash_panda_chain_device"


def _reporting_device(cls: type[Any]) -> type:
    """A chained pipeline's class, or a chained component's: ``cls`` whose ``device`` (a
    public property of diffusers' pipelines, what ``_execution_device`` returns for components
    no accelerate hook offloads; of a component, where diffusers'
    ``get_module_execution_device`` sends its inputs) is the chain's device while it is
    chained, whatever device the components are on (meta until each is loaded). One subclass
    per class, of the same name: the config and saving see ``cls``."""
    found = _REPORTING.get(cls)
    if found is not None:
        return found

    def device(self: Any) -> torch.device:
        streamed = self.__dict__.get(_ATTR)
        if isinstance(streamed, _Streamed) and streamed.chained is not None:
            return streamed.device
        chained: torch.device | None = self.__dict__.get(_CHAIN_DEVICE)
        if chained is not None:
            return chained
        plain: torch.device = cls.device.__get__(self, cls)  # the class's own
        return plain

    sub = type(
        cls.__name__,
        (cls,),
        {"device": property(device, doc=cls.device.__doc__), "__module__": cls.__module__},
    )
    sub.__qualname__ = cls.__qualname__
    _REPORTING[cls] = sub
    return sub


def pipeline_report(pipe: Any) -> str:
    """The report of a chained pipeline's runs (see :meth:`trash_panda.Pipeline.report`): per
    call and component, how its weights came, the memory predicted and found, and what became
    of it. A call whose last component is still running (a pipeline that does not call
    ``maybe_free_model_hooks`` as its call ends, or a call that raised) ends here, as the next
    call would end it first, so the report covers the whole of that call."""
    streamed = getattr(pipe, _ATTR, None)
    if not isinstance(streamed, _Streamed):
        raise ArgumentError("pipe: expected a pipeline made by trash_panda.diffusers.load_pipeline()")
    chain = streamed.chained
    if chain is None:
        raise ArgumentError("pipe: it was loaded with chain=False; only a chained pipeline runs as a Pipeline")
    if chain.busy == 0:
        chain.leave_run()
    return chain.runner.report()


def release_pipeline(pipe: Any) -> None:
    """Releases the streamed components of a pipeline made by :func:`load_pipeline` (their RAM
    and device memory are given back) and removes its chain hooks. The pipeline cannot run after."""
    streamed = getattr(pipe, _ATTR, None)
    if not isinstance(streamed, _Streamed):
        raise ArgumentError("pipe: expected a pipeline made by trash_panda.diffusers.load_pipeline()")
    _release_all(streamed)
    delattr(pipe, _ATTR)
    pipe.__dict__.pop(_END_OF_CALL, None)  # the class's own again
    if streamed.pipeline_class is not None:
        pipe.__class__ = streamed.pipeline_class
    for c in streamed.components:
        if c.model.__dict__.pop(_CHAIN_DEVICE, None) is not None:
            c.model.__class__ = type(c.model).__mro__[1]  # the class's own again


def _release_all(streamed: _Streamed) -> None:
    from .offload.cleanup import Cleanup

    steps = Cleanup()
    # The registry takes its lock for each change: the runner's thread may still be setting up
    # a component's hooks (the runner's close waits for it, below).
    for c in streamed.components:
        steps.run(model_hooks(c.model).remove, CHAIN)
    if streamed.chained is not None:
        steps.run(streamed.chained.leave_run)
        steps.run(streamed.chained.runner.close)
    for c in streamed.components:
        steps.run(_end_stage, c)
    steps.done()
