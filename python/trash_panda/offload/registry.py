"""The hook layer: one registry per model, and the named hooks it calls around each block and
module, in the order of one rank table.

As diffusers' ``HookRegistry`` and accelerate's ``ModelHook``/``SequentialHook``: each concern
(refusing removed hooks, freeing in a final pass, waiting for an overlap load, timing, staging,
recording the order) is a :class:`BlockHook` with a name, ``pre_forward`` and ``post_forward``.
The registry calls the block hooks around each block it wraps: ``pre_forward`` in rank order,
``post_forward`` in reverse. Features add and remove their hooks here; they never reach into
another hook's state, and this module knows none of them (only their names, in :data:`RANKS`).

The order (:data:`RANKS`, lowest first; module hooks and block hooks share it):

1. ``pipeline_chain`` (module): a chained pipeline's hook starts the component's stage: it loads
   the component, lifts its ``released`` refusal and adds the hooks below, which wait for weights
   only its start lets in.
2. ``pipeline_group`` (module): a pipeline group's hook counts a member's calls; when members
   take turns it starts the member's stage (as the chain's does) and opens its last call's
   final pass.
3. ``released`` (module): a released model refuses to run.
4. ``release_guard``: refuses a block once the offload hooks were removed.
5. ``final_pass``: refuses a block a final pass freed or gave back; after the run, frees it.
6. ``lookup_table_guards`` (module): refuses a lookup in a mapped table its file no longer holds.
7. ``gpu_released``: restores a model released from the GPU (the first hook that does work).
8. ``overlap_wait``: waits for ``stage(overlap=True)``'s loader to read the block.
9. ``timing``: times each run (from here the block runs: what staging waits for is in it).
10. ``staging``: brings the block's weights, and gives them back after the run.
11. ``pace``: a pipeline's running stage times each block's compute, with and without the next
    stage's reads beside it (from here the weights are there: its time is the compute's).
12. ``order``: records each block's first run, once it has its weights.

Why this order: refusals come first (they cost nothing, hold nothing and raise before any hook
does work for a call that cannot happen: a freed block does not restore a model, nor wait for a
loader that may wait for memory only a later stage frees); then the hooks that make the weights
present (the restore before the loader's wait, so nothing reads weights left in host memory);
then the run (timing around staging, so the profile sees the bring's wait inside the run and
not the gates'); the order record last, as the block then runs. ``post_forward`` runs in
reverse: staging gives a block's weights back before the final pass frees it.

Hooks of other names (custom hooks) take the rank given to :meth:`HookRegistry.add` (``rank=``),
or :data:`CUSTOM_GATE` for a gate (after the built-in gates that refuse, restore or wait, before
``timing`` and ``staging``: a gate after ``staging`` that raised would leave the bring it made
unreturned) and :data:`CUSTOM` for any other (after ``order``: it sees the block with its
weights). Hooks of one rank run in the order they were added.

A block *starts* once every pre hook up to the last *gate* (a hook whose failure means the block
cannot run: ``gate = True``) has completed. The post hooks run only for a block that started: a
gate that raises undoes its own work, and nothing after it runs. A pre hook after the last gate
that raises still leaves the block started, so its post hooks give back what the gates took.
A post hook that raises stops the ones after it (the error is the block's).

The registry also holds plain module hooks by name (:meth:`HookRegistry.on_module_start`,
:meth:`HookRegistry.on_module_end`): one named for a block hook goes with it; one named on its
own (a released model's refusal to run, the checks of mapped lookup tables, a pipeline's hooks
that load a component on its first call) stays until removed by that name. A model's registry
(:func:`model_hooks`) lives on the model and outlives each install of the offload hooks: those
wrap its blocks (:meth:`HookRegistry.wrap`) and go with :meth:`HookRegistry.unwrap`, and the
hooks named on their own stay.

Dispatch: the registry puts one torch pre-hook and one torch post-hook (``always_call=True``;
both prepended, so before the torch hooks already there) on each module it touches, while it has
hooks there, and keeps its own list of that module's hooks in rank order; torch's hook dicts
are never reordered nor read. A wrapped block's hooks are one entry of its module's
list, of rank :data:`BLOCK_HOOKS` (a module hook of a built-in name runs before them, a custom
one inside them). The list is walked at call time and looked at again after each hook: a hook
added while the call is beginning (a stage started by ``pipeline_chain``, or set up meanwhile on
a pipeline runner's thread) runs in its place in the same call, and one removed meanwhile does
not run. Every module post hook runs, also when the call raised; the first error is raised
after them. Changes take the registry's lock and replace the lists the calls walk, so hooks may
be added from another thread while the model runs.
"""

from __future__ import annotations

import bisect
import functools
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from .cleanup import Cleanup

if TYPE_CHECKING:
    from torch import nn

    from .state import BlockState

__all__ = [
    "BLOCK_HOOKS",
    "CUSTOM",
    "CUSTOM_GATE",
    "HOOKS_ATTR",
    "RANKS",
    "BlockHook",
    "HookRegistry",
    "hook_rank",
    "model_hooks",
]

# Where a model keeps its registry (see :func:`model_hooks`).
HOOKS_ATTR = "_trash_panda_hooks"

# Each built-in hook's rank: lowest first for ``pre_forward`` (and module pre-hooks), reverse for
# ``post_forward``. Why this order: see the module's docstring, which lists it (and so does
# docs/architecture.md; a test checks both against this table).
RANKS: dict[str, int] = {
    # Module hook of a chained pipeline: starts the component's stage, which loads it, lifts its
    # refusal and adds every hook below; they wait for weights only that start lets in.
    "pipeline_chain": 0,
    # Module hook of a pipeline's group: counts a member's calls, starts its turn when members
    # take turns (which loads it, as the chain's does) and opens its last call's final pass.
    "pipeline_group": 5,
    # Refusals: no work done, nothing held, raised before any hook works for a call that cannot
    # happen (a freed block must not restore a model, nor wait for a loader that waits for memory).
    "released": 10,  # module hook: a released model refuses to run
    "release_guard": 20,  # a block of removed hooks
    "final_pass": 30,  # a block freed by a final pass, or given back; frees it after its run
    "lookup_table_guards": 40,  # module hook: a lookup in a mapped table its file no longer holds
    # The weights made present: the restore from host memory first (nothing reads weights left
    # there; the loader is done before a release), then the loader's wait.
    "gpu_released": 50,
    "overlap_wait": 60,
    # The run: timed from here (the gates' waits are not the run's; the bring's is, and the
    # profile splits it out), then the weights brought (the last gate), then the run recorded.
    "timing": 80,
    "staging": 90,
    "pace": 95,  # a pipeline's running stage: the compute's time, with reads beside it or not
    "order": 100,
}
# A custom gate: after the built-in gates that refuse, restore or wait, before ``timing`` and
# ``staging`` (a gate after staging that raised would leave the block's bring unreturned).
CUSTOM_GATE = 70
# A wrapped block's hooks, as one entry among its module's hooks.
BLOCK_HOOKS = 110
# Any other custom hook: after ``order``, it sees the block with its weights.
CUSTOM = 120


class BlockHook:
    """One named concern around each block's forward. Subclasses set ``name`` (unique in a
    registry) and override what they need; hooks that do not override ``pre_forward`` or
    ``post_forward`` cost nothing on that side."""

    name: str = ""
    gate: bool = False  # its pre_forward decides whether the block can run (see the module)

    def pre_forward(self, block: BlockState) -> None:
        """Before the block's forward."""

    def post_forward(self, block: BlockState) -> None:
        """After the block's forward, also when it raised (for a block that started)."""

    def attach(self, registry: HookRegistry) -> None:
        """Called when added: a hook that needs torch hooks on other modules adds them with
        :meth:`HookRegistry.on_module_start` or :meth:`HookRegistry.on_module_end`, and they
        go when the hook is removed."""

    def close(self) -> None:
        """Called when removed (``remove`` or ``remove_all``)."""


def _overrides(hook: BlockHook, method: str) -> bool:
    return getattr(type(hook), method) is not getattr(BlockHook, method)


def hook_rank(name: str, *, gate: bool = False, rank: int | None = None) -> int:
    """The rank of a hook named ``name``: the table's for a built-in name (``rank`` must then
    be None or the same), else ``rank``, else :data:`CUSTOM_GATE` for a gate and
    :data:`CUSTOM` otherwise."""
    fixed = RANKS.get(name)
    if fixed is not None:
        if rank is not None and rank != fixed:
            raise ValueError(f"{name!r} is a built-in hook of rank {fixed}; its rank is not {rank}")
        return fixed
    if rank is not None:
        if not isinstance(rank, int) or isinstance(rank, bool):
            raise ValueError(f"rank: expected an int, got {rank!r}")
        return rank
    return CUSTOM_GATE if gate else CUSTOM


class _Entry:
    """One hook of a module's list: its place (rank, then the order of adding) and what it calls."""

    __slots__ = ("fn", "key")

    def __init__(self, key: tuple[int, int], fn: Callable[[], None]) -> None:
        self.key = key
        self.fn = fn


# A module hook as placed: the module's hooks, the entry, and whether it is a post hook.
_Placed = tuple["_ModuleHooks", _Entry, bool]
# A list as the calls walk it: the entries, and their keys for the search of the next one.
_Walk = tuple[tuple[_Entry, ...], tuple[tuple[int, int], ...]]
_EMPTY: _Walk = ((), ())


class _ModuleHooks:
    """The registry's hooks on one module, behind one torch pre-hook and one torch post-hook."""

    def __init__(self, module: nn.Module) -> None:
        self.module = weakref.ref(module)
        self.starts: list[_Entry] = []
        self.ends: list[_Entry] = []
        self._pre: _Walk = _EMPTY  # ascending keys
        self.args: tuple[Any, ...] | None = None  # the call's inputs, while its start hooks run
        self._post: _Walk = _EMPTY  # the entries in descending keys, each key negated (ascending)
        self.handles = (
            module.register_forward_pre_hook(self._call_pre, prepend=True),
            module.register_forward_hook(self._call_post, prepend=True, always_call=True),
        )

    def publish(self) -> None:
        """Replaces the lists the calls walk (under the registry's lock)."""
        pre = sorted(self.starts, key=lambda e: e.key)
        post = sorted(self.ends, key=lambda e: e.key, reverse=True)
        self._pre = (tuple(pre), tuple(e.key for e in pre))
        self._post = (tuple(post), tuple((-e.key[0], -e.key[1]) for e in post))

    @property
    def empty(self) -> bool:
        return not self.starts and not self.ends

    def _call_pre(self, _module: Any, args: Any) -> None:
        entries, keys = self._pre
        i = 0
        self.args = args
        try:
            while i < len(entries):
                entry = entries[i]
                entry.fn()
                walk = self._pre
                if walk[0] is entries:
                    i += 1
                else:  # changed by that hook (or another thread): go on after it in the new list
                    entries, keys = walk
                    i = bisect.bisect_right(keys, entry.key)
        finally:
            self.args = None  # not kept past the call: they are activations

    def _call_post(self, _module: Any, _args: Any, _out: Any) -> None:
        entries, keys = self._post
        steps = Cleanup()  # every post hook runs: each gives back what it holds
        i = 0
        while i < len(entries):
            entry = entries[i]
            steps.run(entry.fn)
            walk = self._post
            if walk[0] is entries:
                i += 1
            else:
                entries, keys = walk
                i = bisect.bisect_right(keys, (-entry.key[0], -entry.key[1]))
        steps.done()

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


class HookRegistry:
    """The hooks of one model: the block hooks, called around each block it wraps, and module
    hooks by name, all placed by rank (see the module)."""

    def __init__(self, blocks: Iterable[BlockState] = ()) -> None:
        self._lock = threading.RLock()  # every change; the calls read lists replaced whole
        self._hooks: list[BlockHook] = []  # in rank order
        self._keys: dict[str, tuple[int, int]] = {}  # each block hook's (rank, order of adding)
        self._added = 0
        self._per_module: weakref.WeakKeyDictionary[nn.Module, _ModuleHooks] = weakref.WeakKeyDictionary()
        self._wrapped: list[_Placed] = []  # the blocks' entries
        self._owned: dict[str, list[_Placed]] = {}  # module hooks, by name
        self._started: set[int] = set()  # blocks whose gates completed (for the post hooks)
        # The hot path: bound methods, rebuilt on each add/remove.
        self._gates: tuple[Callable[[BlockState], None], ...] = ()
        self._rest: tuple[Callable[[BlockState], None], ...] = ()
        self._post: tuple[Callable[[BlockState], None], ...] = ()
        self.wrap(blocks)

    # -- module lists -------------------------------------------------------------------------

    def _next_key(self, rank: int) -> tuple[int, int]:
        self._added += 1
        return (rank, self._added)

    def _put(self, module: nn.Module, key: tuple[int, int], fn: Callable[[], None], end: bool) -> _Placed:
        with self._lock:
            hooks = self._per_module.get(module)
            if hooks is None:
                hooks = self._per_module[module] = _ModuleHooks(module)
            entry = _Entry(key, fn)
            (hooks.ends if end else hooks.starts).append(entry)
            hooks.publish()
            return hooks, entry, end

    def _take(self, placed: _Placed) -> None:
        hooks, entry, end = placed
        with self._lock:
            entries = hooks.ends if end else hooks.starts
            if entry in entries:
                entries.remove(entry)
                hooks.publish()
            if hooks.empty:
                module = hooks.module()
                if module is not None and self._per_module.get(module) is hooks:
                    del self._per_module[module]
                hooks.remove()

    # -- blocks -------------------------------------------------------------------------------

    def wrap(self, blocks: Iterable[BlockState]) -> None:
        """Calls the block hooks around each of ``blocks`` from now on (until :meth:`unwrap`)."""
        for block in blocks:
            self._wrap(block)

    def _wrap(self, block: BlockState) -> None:
        with self._lock:
            key = self._next_key(BLOCK_HOOKS)
            pre = functools.partial(self._pre_forward, block)
            post = functools.partial(self._post_forward, block)
            self._wrapped.append(self._put(block.module, key, pre, end=False))
            self._wrapped.append(self._put(block.module, key, post, end=True))

    def _pre_forward(self, block: BlockState) -> None:
        for f in self._gates:
            f(block)
        self._started.add(block.index)
        for f in self._rest:
            f(block)

    def _post_forward(self, block: BlockState) -> None:
        if block.index not in self._started:  # a gate raised: nothing to undo
            return
        self._started.discard(block.index)
        for f in self._post:
            f(block)

    def _rebuild(self) -> None:
        self._hooks.sort(key=lambda h: self._keys[h.name])
        last_gate = max((i for i, h in enumerate(self._hooks) if h.gate), default=-1)
        pre = [(i, h.pre_forward) for i, h in enumerate(self._hooks) if _overrides(h, "pre_forward")]
        self._gates = tuple(f for i, f in pre if i <= last_gate)
        self._rest = tuple(f for i, f in pre if i > last_gate)
        self._post = tuple(h.post_forward for h in reversed(self._hooks) if _overrides(h, "post_forward"))

    @property
    def names(self) -> list[str]:
        """The hooks' names, in the order their ``pre_forward`` runs (their ranks')."""
        return [h.name for h in self._hooks]

    def __contains__(self, name: object) -> bool:
        """Whether a block hook, or module hooks, are registered under ``name``."""
        return isinstance(name, str) and (self.get(name) is not None or name in self._owned)

    def get(self, name: str) -> BlockHook | None:
        for h in self._hooks:
            if h.name == name:
                return h
        return None

    def add(self, hook: BlockHook, *, rank: int | None = None) -> None:
        """Adds ``hook`` at its rank (see the module: the table's for a built-in name, else
        ``rank``, else :data:`CUSTOM_GATE` for a gate and :data:`CUSTOM` otherwise), after the
        hooks of the same rank added before it."""
        if not hook.name:
            raise ValueError(f"{type(hook).__name__}: a block hook needs a name")
        at = hook_rank(hook.name, gate=hook.gate, rank=rank)
        with self._lock:
            if hook.name in self:
                raise ValueError(f"a hook named {hook.name!r} is already registered")
            self._keys[hook.name] = self._next_key(at)
            self._hooks.append(hook)
            self._rebuild()
            hook.attach(self)

    # -- module hooks -------------------------------------------------------------------------

    def _module_key(self, owner: BlockHook | str, rank: int | None) -> tuple[str, tuple[int, int]]:
        name = _owner_name(owner)
        found = self._keys.get(name) if isinstance(owner, BlockHook) else None
        at = found[0] if found is not None else hook_rank(name, gate=getattr(owner, "gate", False), rank=rank)
        return name, self._next_key(at)

    def on_module_start(
        self, owner: BlockHook | str, module: nn.Module, fn: Callable[[], None], *, rank: int | None = None
    ) -> None:
        """``fn()`` before each call of ``module``, at the rank of ``owner`` (a block hook's, or
        the table's for a name; ``rank`` or :data:`CUSTOM` for another name), removed with the
        hook ``owner``, or, for a name, by ``remove(name)`` (the model's other hooks may come and
        go meanwhile)."""
        with self._lock:
            name, key = self._module_key(owner, rank)
            self._owned.setdefault(name, []).append(self._put(module, key, fn, end=False))

    def call_inputs(self, module: nn.Module) -> tuple[Any, ...] | None:
        """The positional inputs of the call of ``module`` whose start hooks are running (for a
        start hook that needs them); None outside them."""
        hooks = self._per_module.get(module)
        return hooks.args if hooks is not None else None

    def on_module_end(
        self, owner: BlockHook | str, module: nn.Module, fn: Callable[[], None], *, rank: int | None = None
    ) -> None:
        """``fn()`` after each call of ``module`` (also when it raised), in reverse rank order;
        placed and removed as :meth:`on_module_start`'s."""
        with self._lock:
            name, key = self._module_key(owner, rank)
            self._owned.setdefault(name, []).append(self._put(module, key, fn, end=True))

    # -- removal ------------------------------------------------------------------------------

    def remove(self, name: str) -> BlockHook | None:
        """Takes out the block hook named ``name`` and closes it, and removes the module hooks
        registered under that name; returns the block hook (None when there is none). Every
        step runs, even when one raises."""
        steps = Cleanup()
        with self._lock:
            hook = self.get(name)
            if hook is not None:
                self._hooks.remove(hook)
                del self._keys[name]
                self._rebuild()
            for placed in self._owned.pop(name, []):
                steps.run(self._take, placed)
        if hook is not None:
            steps.run(hook.close)
        steps.done()
        return hook

    def unwrap(self) -> None:
        """Removes every block hook, the last in rank first, and the hooks around the blocks;
        module hooks registered under a name of their own stay. Every step runs, and the first
        error is raised after them."""
        steps = Cleanup()
        for hook in reversed(list(self._hooks)):
            steps.run(self.remove, hook.name)
        with self._lock:
            wrapped, self._wrapped = self._wrapped, []
            for placed in wrapped:
                steps.run(self._take, placed)
        self._started.clear()
        steps.done()

    def remove_all(self) -> None:
        """:meth:`unwrap`, then every module hook left; every step runs, and the first error is
        raised after them."""
        steps = Cleanup()
        steps.run(self.unwrap)
        for name in list(self._owned):
            steps.run(self.remove, name)
        steps.done()


def _owner_name(owner: BlockHook | str) -> str:
    name = owner if isinstance(owner, str) else owner.name
    if not name:
        raise ValueError("a module hook needs a name, or a block hook with one")
    return name


def model_hooks(model: nn.Module) -> HookRegistry:
    """The model's registry, made on first use; it stays on the model (a released model keeps
    its refusal to run in it)."""
    found = getattr(model, HOOKS_ATTR, None)
    if isinstance(found, HookRegistry):
        return found
    registry = HookRegistry()
    setattr(model, HOOKS_ATTR, registry)
    return registry
