"""The hook layer: one registry per model, and the named block hooks it calls around each block.

As diffusers' ``HookRegistry`` and accelerate's ``ModelHook``/``SequentialHook``: each concern
(refusing removed hooks, freeing in a final pass, waiting for an overlap load, timing, staging,
recording the order) is a :class:`BlockHook` with a name, ``pre_forward`` and ``post_forward``.
The registry puts one torch pre-hook and one torch post-hook (``always_call=True``) on each block
module and calls the block hooks from them: ``pre_forward`` in the registry's order,
``post_forward`` in reverse. Features add and remove their hooks here; they never reach into
another hook's state, and this module knows none of them.

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
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from .cleanup import Cleanup

if TYPE_CHECKING:
    from torch import nn
    from torch.utils.hooks import RemovableHandle

    from .state import BlockState

__all__ = ["HOOKS_ATTR", "BlockHook", "HookRegistry", "model_hooks"]

# Where a model keeps its registry (see :func:`model_hooks`).
HOOKS_ATTR = "_trash_panda_hooks"


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


class HookRegistry:
    """The hooks of one model: the block hooks, called around each block it wraps, and module
    hooks by name."""

    def __init__(self, blocks: Iterable[BlockState] = ()) -> None:
        self._hooks: list[BlockHook] = []
        self._torch: list[RemovableHandle] = []  # the registry's own, one pair per wrapped block
        self._owned: dict[str, list[RemovableHandle]] = {}  # module hooks, by the name they go with
        self._outermost: list[RemovableHandle] = []  # module pre-hooks kept before the others
        self._started: set[int] = set()  # blocks whose gates completed (for the post hooks)
        # The hot path: bound methods, rebuilt on each add/remove.
        self._gates: tuple[Callable[[BlockState], None], ...] = ()
        self._rest: tuple[Callable[[BlockState], None], ...] = ()
        self._post: tuple[Callable[[BlockState], None], ...] = ()
        self.wrap(blocks)

    def wrap(self, blocks: Iterable[BlockState]) -> None:
        """Calls the block hooks around each of ``blocks`` from now on (until :meth:`unwrap`)."""
        for block in blocks:
            self._wrap(block)

    def _wrap(self, block: BlockState) -> None:
        pre, post = self._pre_forward, self._post_forward
        module = block.module
        self._torch.append(module.register_forward_pre_hook(lambda _m, _args: pre(block)))
        self._torch.append(module.register_forward_hook(lambda _m, _args, _out: post(block), always_call=True))

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
        last_gate = max((i for i, h in enumerate(self._hooks) if h.gate), default=-1)
        pre = [(i, h.pre_forward) for i, h in enumerate(self._hooks) if _overrides(h, "pre_forward")]
        self._gates = tuple(f for i, f in pre if i <= last_gate)
        self._rest = tuple(f for i, f in pre if i > last_gate)
        self._post = tuple(h.post_forward for h in reversed(self._hooks) if _overrides(h, "post_forward"))

    @property
    def names(self) -> list[str]:
        """The hooks' names, in the order their ``pre_forward`` runs."""
        return [h.name for h in self._hooks]

    def __contains__(self, name: object) -> bool:
        """Whether a block hook, or module hooks, are registered under ``name``."""
        return isinstance(name, str) and (self.get(name) is not None or name in self._owned)

    def get(self, name: str) -> BlockHook | None:
        for h in self._hooks:
            if h.name == name:
                return h
        return None

    def add(self, hook: BlockHook, *, before: str | None = None) -> None:
        """Adds ``hook`` last, or just before the hook named ``before`` (last when there is
        none by that name)."""
        if not hook.name:
            raise ValueError(f"{type(hook).__name__}: a block hook needs a name")
        if hook.name in self:
            raise ValueError(f"a hook named {hook.name!r} is already registered")
        at = len(self._hooks)
        if before is not None:
            at = next((i for i, h in enumerate(self._hooks) if h.name == before), at)
        self._hooks.insert(at, hook)
        self._rebuild()
        hook.attach(self)

    def on_module_start(
        self,
        owner: BlockHook | str,
        module: nn.Module,
        fn: Callable[[], None],
        *,
        prepend: bool = False,
        outermost: bool = False,
    ) -> None:
        """A torch pre-hook on ``module`` that calls ``fn()``, removed with the hook ``owner``,
        or, for a name, by ``remove(name)`` (the model's other hooks may come and go meanwhile).
        ``prepend``: before the module's other pre-hooks, except the outermost ones.
        ``outermost``: before every pre-hook the registry puts on the module, also those
        prepended later (a pipeline's hook that starts the component's stage: the hooks that
        stage adds wait for weights that only its start lets in)."""
        handle = module.register_forward_pre_hook(lambda _m, _args: fn(), prepend=prepend or outermost)
        self._owned.setdefault(_owner_name(owner), []).append(handle)
        if outermost:
            self._outermost.append(handle)
        elif prepend:
            # Torch's prepend puts the new hook first: the outermost ones go back before it.
            hooks = module._forward_pre_hooks
            for h in reversed(self._outermost):
                if h.hooks_dict_ref() is hooks and h.id in hooks:
                    hooks.move_to_end(h.id, last=False)

    def on_module_end(self, owner: BlockHook | str, module: nn.Module, fn: Callable[[], None]) -> None:
        """A torch post-hook on ``module`` (also when it raised), removed as
        :meth:`on_module_start`'s."""
        handle = module.register_forward_hook(lambda _m, _args, _out: fn(), always_call=True)
        self._owned.setdefault(_owner_name(owner), []).append(handle)

    def remove(self, name: str) -> BlockHook | None:
        """Takes out the block hook named ``name`` and closes it, and removes the module hooks
        registered under that name; returns the block hook (None when there is none). Every
        step runs, even when one raises."""
        hook = self.get(name)
        steps = Cleanup()
        if hook is not None:
            self._hooks.remove(hook)
            self._rebuild()
        for h in self._owned.pop(name, []):
            if h in self._outermost:
                self._outermost.remove(h)
            steps.run(h.remove)
        if hook is not None:
            steps.run(hook.close)
        steps.done()
        return hook

    def unwrap(self) -> None:
        """Removes every block hook, the last added first, and the torch hooks on the blocks;
        module hooks registered under a name of their own stay. Every step runs, and the first
        error is raised after them."""
        steps = Cleanup()
        for hook in reversed(list(self._hooks)):
            steps.run(self.remove, hook.name)
        for h in self._torch:
            steps.run(h.remove)
        self._torch.clear()
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
