"""The routed experts module's hooks, honoured around the fused call that replaces its forward.

Under ``mok`` the experts module (and its submodules) is never called: ``experts_compute`` reads
its Parameters and runs one fused call. What calling it would have triggered is done, or refused,
here, before the fused call reads the Parameters:
  - forward pre-hooks run, modules in ``named_modules()`` order (a module before its children),
    each module's hooks in registration order, as Megatron replays them for its own fused expert
    implementations. Megatron's DDP with ``--overlap-param-gather`` waits in one for the
    all-gather of the module's parameter buckets (and starts the next bucket's): without it every
    rank would compute with its own half-updated copy of the experts. The fused call never builds
    the modules' inputs, so a pre-hook that returns a value (to replace them) is an error;
  - newer Megatron publishes asynchronously gathered Parameters through
    ``megatron.core.utils.ensure_params_ready`` (0.19 has no such function): called where it
    exists, on the Parameters the fused call reads;
  - forward hooks and module backward hooks cannot run (there is no module output, and no
    module-level backward): they are refused, naming the module and the hook, not skipped;
  - hooks on the Parameters themselves (DDP's gradient-accumulation hooks) need nothing: the
    fused call returns each Parameter's gradient through autograd, so they fire as usual.
"""

from __future__ import annotations

from typing import Sequence

import megatron.core.utils as megatron_utils
import torch

from .validation import MokConfigError

_ALTERNATIVE = "or use --moe-token-dispatcher-type alltoall"

# Hooks that need the module's output or its backward, neither of which exists under mok.
_HOOKS_THAT_CANNOT_RUN = {
    "_forward_hooks": "forward hook (register_forward_hook)",
    "_backward_pre_hooks": "backward pre-hook (register_full_backward_pre_hook)",
    "_backward_hooks": "backward hook (register_full_backward_hook / register_backward_hook)",
}


class ExpertHooks:
    """The experts module's hooks, taken at the layer's first forward (after PEFT, which wraps
    modules once the model is built, has run) and read on every call. A module keeps the same
    hook dicts for its life - registering or removing a hook (DDP toggles its pre-hooks between
    steps) changes their contents - so the dicts are gathered once and a call only looks into
    them: it costs a pass over a flat list, not a walk of the module tree."""

    def __init__(self, experts: torch.nn.Module, prefix: str):
        self._modules = list(experts.named_modules(prefix=prefix))
        self._cannot_run = [getattr(module, attribute) for _, module in self._modules
                            for attribute in _HOOKS_THAT_CANNOT_RUN]
        self._pre_hooks = [(name, module, module._forward_pre_hooks)
                           for name, module in self._modules]

    def before_fused_call(self, params: Sequence[torch.Tensor]) -> None:
        """Run the modules' forward pre-hooks and make ``params`` ready to read; refuse hooks
        that cannot run."""
        if any(self._cannot_run):
            _refuse_hooks_that_cannot_run(self._modules)
        for name, module, hooks in self._pre_hooks:
            if hooks:
                _run_pre_hooks(name, module, hooks)
        # Looked up per call rather than at import, so that the Megatron in use decides.
        ensure_params_ready = getattr(megatron_utils, "ensure_params_ready", None)
        if ensure_params_ready is not None:
            ensure_params_ready(params)


def _run_pre_hooks(name: str, module: torch.nn.Module, hooks: dict) -> None:
    for hook_id, hook in list(hooks.items()):
        if hook_id in module._forward_pre_hooks_with_kwargs:
            result = hook(module, (), {})
        else:
            result = hook(module, ())
        if result is not None:
            raise MokConfigError(
                f"the forward pre-hook {_hook_name(hook)} on {_describe(name, module)} "
                f"returns a value, replacing the module's input: mok runs the routed experts "
                f"as one fused call that never builds their modules' inputs; remove the hook, "
                f"{_ALTERNATIVE}"
            )


def _refuse_hooks_that_cannot_run(modules: Sequence[tuple[str, torch.nn.Module]]) -> None:
    found = [
        f"{kind} {_hook_name(hook)} on {_describe(name, module)}"
        for name, module in modules
        for attribute, kind in _HOOKS_THAT_CANNOT_RUN.items()
        for hook in getattr(module, attribute).values()
    ]
    if found:
        lines = "\n".join(f"  - {f}" for f in found)
        raise MokConfigError(
            "mok runs the routed experts as one fused call and never calls their modules, so "
            f"these hooks would never run:\n{lines}\nRemove them from the routed experts' "
            f"modules (hooks on other modules, and forward pre-hooks, work), {_ALTERNATIVE}"
        )


def _describe(name: str, module: torch.nn.Module) -> str:
    return f"{name} ({type(module).__name__})"


def _hook_name(hook) -> str:
    qualname = getattr(hook, "__qualname__", None) or type(hook).__qualname__
    module = getattr(hook, "__module__", None)
    return f"{module}.{qualname}" if module else qualname
