"""One forward of a model, watched op by op, for what a pipeline cut must know of it: the order
its blocks run in and what each is given, where each weight is read, and which weights'
values every tensor carries.

The forward runs on fake tensors (no memory, no data: the model's weights swapped for fakes
with torch.func.functional_call), or, for a model that reads a value mid-forward, on its real
weights and a batch of one. Every op is seen by a dispatch mode: a tensor an op makes carries
the *sources* of its inputs, where a source is "a weight read before the first block" (-1) or
"block i's output" (i). A block's output carries only its own index: a later stage receives
exactly that tensor, so whatever fed it need not be on that stage.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

BEFORE_BLOCKS = -1  # the source of a value computed from weights read before the first block


class TraceFailed(RuntimeError):
    """The forward could not run as traced (one line: the exception's own)."""


@dataclass
class BlockCall:
    """One call of a block: its first argument and output (identity, not value, is compared),
    and the earliest source among all its arguments, with the argument that carries it."""

    first_arg: Any
    output: Any = None
    earliest: int | None = None  # None: no argument carries a source
    earliest_arg: str = ""


@dataclass
class Trace:
    """What one forward showed. Positions are "after block j returned" (-1: before any block)."""

    calls: list[int] = field(default_factory=list)  # block indices, in the order they were called
    block_calls: dict[int, BlockCall] = field(default_factory=dict)  # the first call of each
    output: Any = None  # what the forward returned
    names: dict[str, list[str]] = field(default_factory=dict)  # a weight's first name -> all its names
    # A weight (by name) read by an op outside every block: [(position, part read in or None)].
    outside_reads: dict[str, list[tuple[int, str | None]]] = field(default_factory=dict)
    # A weight read inside block i: {name: {i, ...}}.
    block_reads: dict[str, set[int]] = field(default_factory=dict)
    # The earliest source any op read at each position (an op inside block i is at position i - 1,
    # where the block's stage starts from), that op's name and the block it ran in (None: none).
    earliest_at: dict[int, tuple[int, str, int | None]] = field(default_factory=dict)


def run_traced(model: nn.Module, block_names: list[str], parts: list[str], seq_len: int, real: bool = False) -> Trace:
    """The forward of `model` on (2, seq_len) token ids (real: its own weights, one sequence),
    watched. `parts`: the submodules (by name) outside the blocks whose calls are told apart."""
    weights = _weight_names(model)
    trace = Trace(names={names[0]: names for names in weights.values()})
    with contextlib.ExitStack() as stack:
        if real:
            # The run's own random stream and the model's buffers (running statistics) are left as
            # they were: a traced dropout draws from a copy, and the buffers are put back.
            stack.enter_context(torch.random.fork_rng(devices=[]))
            stack.enter_context(_buffers_kept(model))
            state = None
            device = next(iter(model.parameters())).device
            inputs = torch.zeros((1, seq_len), dtype=torch.long, device=device)
        else:
            from torch._subclasses.fake_tensor import FakeTensorMode

            stack.enter_context(FakeTensorMode())
            by_id: dict[int, torch.Tensor] = {}
            state = {}
            for name, t in _named_state(model):
                state[name] = by_id.setdefault(id(t), torch.empty(t.shape, dtype=t.dtype))
            inputs = torch.zeros((2, seq_len), dtype=torch.long)
            weights = {id(state[names[0]]): names for names in weights.values()}
        watcher = _Watcher(trace, weights, block_names)
        stack.enter_context(_hooks(model, block_names, parts, watcher))
        stack.enter_context(torch.no_grad())
        stack.enter_context(watcher)
        try:
            if state is None:
                trace.output = model(inputs, inputs)
            else:
                trace.output = torch.func.functional_call(model, state, (inputs, inputs), tie_weights=False)
        except Exception as exc:  # whatever the model does that the trace cannot
            text = str(exc).strip().splitlines()
            raise TraceFailed(f"{type(exc).__name__}: {text[0] if text else ''}") from None
    return trace


@contextlib.contextmanager
def _buffers_kept(model: nn.Module) -> Iterator[None]:
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)


def _named_state(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    yield from model.named_parameters(remove_duplicate=False)
    yield from model.named_buffers(remove_duplicate=False)


def _weight_names(model: nn.Module) -> dict[int, list[str]]:
    """id of each parameter and persistent buffer -> its names in the model (several where tied)."""
    persistent = set(model.state_dict(keep_vars=True))
    names: dict[int, list[str]] = {}
    for name, t in _named_state(model):
        if name in persistent:
            names.setdefault(id(t), []).append(name)
    return names


@contextlib.contextmanager
def _hooks(model: nn.Module, block_names: list[str], parts: list[str], watcher: _Watcher) -> Iterator[None]:
    handles = []
    for index, name in enumerate(block_names):
        block = model.get_submodule(name)
        handles.append(block.register_forward_pre_hook(watcher.entering_block(index), with_kwargs=True))
        handles.append(block.register_forward_hook(watcher.leaving_block(index)))
    for name in parts:
        part = model.get_submodule(name)
        handles.append(part.register_forward_pre_hook(watcher.entering_part(name)))
        handles.append(part.register_forward_hook(watcher.leaving_part(name)))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


class _Watcher(TorchDispatchMode):
    """Sees every op: the weights it reads, the sources it passes on."""

    def __init__(self, trace: Trace, weights: dict[int, list[str]], block_names: list[str]):
        super().__init__()
        self.trace = trace
        self.weights = weights  # id of a traced weight -> its names
        self.sources: dict[int, tuple[torch.Tensor, frozenset[int]]] = {}  # kept alive: ids stay unique
        self.block: int | None = None  # the block running now
        self.done = BEFORE_BLOCKS  # the last block that returned
        self.parts: list[str] = []  # the parts running now, innermost last

    def of(self, value: Any) -> frozenset[int]:
        flat, _ = tree_flatten(value)
        out: frozenset[int] = frozenset()
        for t in flat:
            if isinstance(t, torch.Tensor) and id(t) in self.sources:
                out |= self.sources[id(t)][1]
        return out

    def mark(self, value: Any, sources: frozenset[int]) -> None:
        flat, _ = tree_flatten(value)
        for t in flat:
            if isinstance(t, torch.Tensor):
                self.sources[id(t)] = (t, sources)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        made, _ = tree_flatten(out)
        if not any(isinstance(t, torch.Tensor) for t in made):
            return out  # a query (device, size): no value flows
        flat, _ = tree_flatten((args, kwargs))
        sources = self.of(flat)
        for t in flat:
            names = self.weights.get(id(t)) if isinstance(t, torch.Tensor) else None
            if names:
                sources |= self.read(names[0])
        if sources:
            earliest = min(sources)
            position = self.done if self.block is None else self.block - 1
            if position not in self.trace.earliest_at or earliest < self.trace.earliest_at[position][0]:
                self.trace.earliest_at[position] = (earliest, str(func.__name__).split(".")[0], self.block)
            self.mark(out, sources)  # an in-place op returns the tensor it changed: marked too
        return out

    def read(self, name: str) -> frozenset[int]:
        if self.block is not None:
            self.trace.block_reads.setdefault(name, set()).add(self.block)
            return frozenset()
        part = self.parts[-1] if self.parts else None
        self.trace.outside_reads.setdefault(name, []).append((self.done, part))
        return frozenset({BEFORE_BLOCKS}) if self.done == BEFORE_BLOCKS else frozenset()

    def entering_block(self, index: int) -> Any:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            self.trace.calls.append(index)
            if self.block is not None or index in self.trace.block_calls:
                return  # nested or repeated: the checks refuse it from `calls`
            first = args[0] if args else next(iter(kwargs.values()), None)
            call = BlockCall(first)
            named = [(f"argument {i}", a) for i, a in enumerate(args)] + list(kwargs.items())
            for label, value in named:
                found = self.of(value)
                if found and (call.earliest is None or min(found) < call.earliest):
                    call.earliest, call.earliest_arg = min(found), label
            self.trace.block_calls[index] = call
            self.block = index

        return hook

    def leaving_block(self, index: int) -> Any:
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            if self.block != index:
                return
            self.block, self.done = None, index
            self.trace.block_calls[index].output = output
            self.mark(output, frozenset({index}))

        return hook

    def entering_part(self, name: str) -> Any:
        def hook(module: nn.Module, args: tuple) -> None:
            self.parts.append(name)

        return hook

    def leaving_part(self, name: str) -> Any:
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            if self.parts and self.parts[-1] == name:
                self.parts.pop()

        return hook
