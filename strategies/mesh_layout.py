"""How a strategy lays the ranks out: the shape of its device mesh, what each dimension does,
and which dimensions carry different data.

Plain data (no torch): a strategy declares its layout from the world size and its options
before any process group exists, so that the run can split the global batch over the
data-parallel ranks only, preflight can refuse a mesh that does not fit the world, and the
header, summary.json and the report can name it. Ranks are laid out row-major, as
torch.distributed.device_mesh.init_device_mesh lays them: the last dimension varies fastest,
so it is the one inside a node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

# The one dimension of a strategy that declares no mesh: every rank a data-parallel rank.
DATA = "data"


@dataclass(frozen=True)
class MeshLayout:
    shape: tuple[int, ...]
    dims: tuple[str, ...]
    # The dimensions across which ranks see different micro-batches; along the others (tensor
    # parallel) the ranks of a group see the same data and compute parts of one model.
    data_dims: tuple[str, ...]
    # What the run should know about this layout, in words (a dimension of size 1, and what the
    # layout then amounts to); empty when there is nothing to say.
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if len(self.shape) != len(self.dims) or not set(self.data_dims) <= set(self.dims):
            raise ValueError(f"mesh shape {self.shape}, dims {self.dims}, data dims {self.data_dims} do not agree")

    @classmethod
    def flat(cls, world_size: int) -> MeshLayout:
        """The layout of a strategy that declares none."""
        return cls((world_size,), (DATA,), (DATA,))

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def declared(self) -> bool:
        """Whether the strategy declared a mesh of its own (not the flat default)."""
        return self.dims != (DATA,)

    def coordinates(self, rank: int) -> tuple[int, ...]:
        """The rank's index along each dimension (row-major, as init_device_mesh)."""
        out = []
        for size in reversed(self.shape):
            rank, index = divmod(rank, size)
            out.append(index)
        return tuple(reversed(out))

    def data_parallel(self, rank: int) -> tuple[int, int]:
        """(data-parallel rank, data-parallel degree): which micro-batch this rank reads, among how many."""
        coords = dict(zip(self.dims, self.coordinates(rank), strict=True))
        sizes = dict(zip(self.dims, self.shape, strict=True))
        index, degree = 0, 1
        for dim in self.dims:  # row-major over the data dimensions alone
            if dim in self.data_dims:
                index, degree = index * sizes[dim] + coords[dim], degree * sizes[dim]
        return index, degree

    def leads_its_group(self, rank: int, apart: tuple[str, ...] = ()) -> bool:
        """Whether the rank is the first of the ranks that share its data (its tensor-parallel
        group): the one whose loss counts once for the group in the reported mean. `apart`: the
        dimensions whose ranks count apart besides the data dimensions (a pipeline's stages, each
        routing its own layers' tokens)."""
        coords = zip(self.dims, self.coordinates(rank), strict=True)
        return all(index == 0 for dim, index in coords if dim not in self.data_dims and dim not in apart)

    def describe(self) -> str:
        """'mesh 2 x 2: replicate x shard', with the notes after it."""
        text = f"mesh {' x '.join(map(str, self.shape))}: {' x '.join(self.dims)}"
        return text + "".join(f" ({note})" for note in self.notes)

    def as_dict(self) -> dict[str, Any]:
        return {
            "shape": list(self.shape),
            "dims": list(self.dims),
            "data_dims": list(self.data_dims),
            "notes": list(self.notes),
        }


class MeshError(ValueError):
    """A mesh that does not fit the world (one line, says what would)."""


class MeshSizeError(MeshError):
    """A size no world lays out (below 1, not a whole number): bad input wherever it is given, where
    a size that does not divide this world may divide another."""


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_divides(option: str, size: Any, world_size: int, what: str = "the world size") -> int:
    """`size` as a whole number that divides `world_size`, or a MeshError saying which sizes would."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise MeshSizeError(f"strategy_options.{option}={size} must be a whole number >= 1")
    if world_size % size:
        choices = ", ".join(map(str, divisors(world_size)))
        raise MeshError(
            f"strategy_options.{option}={size} does not divide {what} {world_size}: use one of {choices} "
            f"(or launch a world size that {size} divides)"
        )
    return size


PIPELINE = "pp"
ONE_NODE_STAGES = 2  # a pipeline strategy on one node still pipelines


def default_stages(ranks: int, nodes: int, blocks: int | None, virtual: int = 1) -> int:
    """A pipeline's default stages over `ranks`: one per node (ONE_NODE_STAGES on one), the most
    below that which divides the ranks and leaves each stage a block (`blocks` None: not known)."""
    target = nodes if nodes > 1 else ONE_NODE_STAGES
    return max(d for d in divisors(ranks) if d <= target and (blocks is None or d * virtual <= blocks))


def pipeline_layout(
    world_size: int,
    local_world_size: int,
    pp_size: Any,
    data_dim: str,
    inside: str,
    without_pipeline: str,
    blocks: int | None = None,
) -> MeshLayout:
    """pp x data-parallel for a pipeline strategy: by default one stage per node (the pipeline's
    traffic is the lightest to cross nodes), two on one node, never more than the model's `blocks`;
    `inside` (what shards or replicates the model, in words) over the ranks of each stage;
    `without_pipeline` names the strategy that pp 1 amounts to."""
    nodes = max(1, world_size // max(1, min(local_world_size, world_size)))
    default = default_stages(world_size, nodes, blocks)
    pp = check_divides("pp_size", default if pp_size is None else pp_size, world_size)
    notes = []
    if pp == world_size and pp > 1:
        notes.append(f"one data-parallel rank: the pipeline alone, {inside} over one rank")
    if pp == 1:
        notes.append(f"pp 1: no pipeline, the layout of {without_pipeline} (set strategy_options.pp_size)")
    if pp_size is None and pp > 1 and nodes == 1:
        notes.append(f"pp {pp}: a pipeline on one node by default (a stage per node on several; set pp_size)")
    return MeshLayout((pp, world_size // pp), (PIPELINE, data_dim), (data_dim,), tuple(notes))
