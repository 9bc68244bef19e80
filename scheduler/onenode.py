"""The FGD class of ONE node's targets in plain Python: the same numbers as numpy, faster.

After every placement the greedy stage re-ranks the targets of the one node the placement
changed (``greedy.TargetIndex``): the node, or its GPUs for a slice, against the mix's ten or so
distinct shapes. On arrays that small numpy's cost is its per-call overhead, and plain Python
floats are several times faster. This module computes the FGD class
(``objective.fgd_class``: ``100 - trunc(100 * sigmoid(-dF / 1000))`` of the node's fragment
growth ``dF``) of such a re-ranking; ``objective.Ranking`` uses it, node by node, whenever it
must compute few targets (``objective.PLAIN_TARGETS``), and the vectorised form
(``Ranking._fgd_node``/``_fgd_slice``) for more.

**Why the numbers are the same.** Both forms get the same inputs bit for bit: every GPU's free
shares ``1000 * free_vram / size`` and ``10 * free_sm``, its idle share, which shapes fit it,
which shapes the node can serve (CPU, memory, model, GPUs that fit) are elementwise IEEE
operations and comparisons, exact in numpy and in Python alike. They differ only in the order
of the sums (per shape: the idle share of the GPUs that do not fit it; per node: the weighted
sum over the shapes), which numpy and BLAS choose (pairwise sums, SIMD lanes, fused
multiply-adds; a row's result even depends on its place in a matrix-vector product), so ``dF``
can differ in its last bits. The class hides that unless ``100 * sigmoid(-dF / 1000)`` lies that
close to an integer, where it flips. So :func:`fgd_classes` bounds how far ANY order of the same
sums can land from the exact value (the textbook bound ``n * u * sum |terms|`` of a sum of ``n``
terms, ``u = 2**-53``, with every GPU's idle share at most 1000 thousandths) and answers only
when the whole interval ``dF +- tol`` gives one class (with a margin for ``exp``'s own
rounding), which is then the vectorised form's class whatever order, and whatever batch of
targets, it would have summed in; otherwise it answers None and the caller computes the
vectorised form on exactly the targets it was asked for, whose number is then the one used. ``tol`` is a few 1e-10 of a GPU: a fallback takes a ``dF`` within that of
a class boundary, in practice ``dF == 0`` exactly, where the class is 50 (``sigmoid(0) = 1/2``)
or 49/51 as the last bits fall.

Two such cases are decided without falling back, where the vectorised form builds
bit-identical per-shape vectors before and after (each node's at the same place of its
batch), so that its ``dF`` is exactly 0 and its class exactly 50:

* a CPU-only pod that changes no shape's usability (the form shares the node's GPU summary
  between before and after);
* a whole-GPU pod after which every shape is still usable, as it was before, on GPUs that
  fit every shape: each shape's fragment is then the idle share of the GPUs that do not fit
  it, to which a taken GPU adds nothing, before (it fits) or after (nothing is idle on it).
  Sums of equal terms in one order are equal.

A slice on a mix of slices only, on a GPU that still fits every shape, also changes no
fragment; but the vectorised form sums "after" in a matrix-vector product of several GPUs and
"before" alone, which may round differently: those fall back (a mix with CPU-only shapes, as
recent workloads have, does not get there: the node's idle share is their fragment).

``tests/scheduler/test_onenode.py`` compares both forms on random nodes, on nodes built so
that ``dF`` is 0, and counts that the fallback is rare.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from scheduler.cycle import CycleState
from scheduler.jobs import Kind, Shape
from scheduler.ledger import Ledger
from scheduler.scoring import TargetShapes

UNIT_ROUNDOFF = 2.0**-53  # of float64: a sum of n terms is off by at most n * u * sum |terms|
CLASS_MARGIN = 1e-9  # on 100 * sigmoid, for exp's and the division's rounding (~1e-13)
MAX_SHARE = 1000.0  # a GPU's free VRAM and SM shares, hence its idle share, are at most this


@dataclass(frozen=True)
class Layout:
    """The static facts of a cycle state's nodes as Python lists (shared by derived states)."""

    start: list[int]  # first GPU number of each node
    count: list[int]  # GPUs of each node
    size: list[int]  # the node's VRAM per GPU (the largest; 0 without GPUs), as ``_rows`` has it
    model: list[int]  # model id of each node, -1 without GPUs
    healthy: list[bool]  # per GPU
    vram: list[int]  # per GPU
    width: int  # GPUs of the widest node: ``_rows`` pads every node to it

    @classmethod
    def of(cls, cycle: CycleState) -> Layout:
        start = cycle.node_gpu_start.tolist()
        count = cycle.node_gpu_count.tolist()
        vram = cycle.gpu_vram.tolist()
        return cls(
            start=start,
            count=count,
            size=[max(vram[s : s + c], default=0) for s, c in zip(start, count, strict=True)],
            model=cycle.node_model.tolist(),
            healthy=cycle.gpu_healthy.tolist(),
            vram=vram,
            width=int(cycle.node_gpus.shape[1]),
        )


Summary = tuple[list[float], list[float], list[int], list[float], float]


@dataclass(frozen=True)
class PlainMix:
    """The distinct shapes of a target for GPUs of ``size`` MiB (``TargetShapes.distinct``)
    as Python tuples, with the number of shapes of the whole mix (the length of the
    vectorised form's weighted sum), and the summaries of the GPU states met so far (nodes
    in one state are many in a pool: all pristine, all full, ...)."""

    size: int
    vram: tuple[float, ...]
    sm: tuple[float, ...]
    count: tuple[int, ...]
    cpu: tuple[float, ...]
    mem: tuple[float, ...]
    mask: tuple[int, ...]
    weight: tuple[float, ...]  # summed over the equal shapes of the mix
    shapes: int
    _summaries: dict[tuple[tuple[int, ...], tuple[int, ...], int], Summary] = field(
        default_factory=dict, repr=False
    )

    @classmethod
    def of(cls, target: TargetShapes, size: int) -> PlainMix:
        uniq = target.distinct[0]
        return cls(
            size=size,
            vram=tuple(uniq.vram.tolist()),
            sm=tuple(uniq.sm.tolist()),
            count=tuple(uniq.count.tolist()),
            cpu=tuple(uniq.cpu.tolist()),
            mem=tuple(uniq.mem.tolist()),
            mask=tuple(uniq.model_mask.tolist()),
            weight=tuple(uniq.weight.tolist()),
            shapes=target.size,
        )

    def summary(self, free_vram: tuple[int, ...], free_sm: tuple[int, ...], pad: int) -> Summary:
        """The shares of a node's GPUs with these free amounts (the VRAM and SM % of the
        healthy ones, 0 for the others; ``pad`` more GPUs of padding) and their
        :func:`_summary`."""
        key = (free_vram, free_sm, pad)
        found = self._summaries.get(key)
        if found is None:
            if len(self._summaries) >= 4096:
                self._summaries.clear()
            v = [1000.0 * x / self.size for x in free_vram]
            s = [10.0 * x for x in free_sm]
            found = self._summaries[key] = (v, s, *_summary(v, s, pad, self))
        return found

    def access(self, model: int) -> list[bool]:
        """Which shapes accept a node of model id ``model`` (``scoring.shape_access``)."""
        bit = 1 << model if model >= 0 else 0
        return [bit & mask != 0 for mask in self.mask]


def _summary(
    v: Sequence[float], s: Sequence[float], pad: int, mix: PlainMix
) -> tuple[list[int], list[float], float]:
    """``scoring.fragment_stats`` of one node: per shape the GPUs that fit it and the idle share
    of the others, and the node's idle share (``pad`` GPUs of padding: nothing free)."""
    idle = [(a + b) / 2.0 for a, b in zip(v, s, strict=True)]
    n_fit: list[int] = []
    stranded: list[float] = []
    for vm, sm in zip(mix.vram, mix.sm, strict=True):
        n = pad if vm <= 0.0 and sm <= 0.0 else 0
        rest = 0.0
        for a, b, i in zip(v, s, idle, strict=True):
            if a >= vm and b >= sm:
                n += 1
            else:
                rest += i
        n_fit.append(n)
        stranded.append(rest)
    return n_fit, stranded, sum(idle)


def _usable(mix: PlainMix, access: list[bool], n_fit: list[int], cpu: int, mem: int) -> list[bool]:
    """``scoring.usable`` of one node."""
    return [
        count > 0 and ok and cpu >= c and n >= count and mem >= m
        for count, ok, c, n, m in zip(mix.count, access, mix.cpu, n_fit, mix.mem, strict=True)
    ]


def _fragment(mix: PlainMix, usable: list[bool], stranded: list[float], total: float) -> float:
    """``F(n)``: per shape the stranded idle share where it is usable, else all of it."""
    return sum(
        w * (rest if ok else total)
        for w, ok, rest in zip(mix.weight, usable, stranded, strict=True)
    )


def certain_class(delta: float, tol: float) -> int | None:
    """The FGD class of every growth within ``tol`` of ``delta``, or None if they differ.

    ``100 * sigmoid(-delta / 1000)`` as ``objective.fgd_class`` computes it (clipped at 50
    GPUs) has a slope of at most ``100 / 1000 / 4``: over the interval it moves by at most
    ``tol / 40``."""
    score = 100.0 / (1.0 + math.exp(min(max(delta, -50_000.0), 50_000.0) / 1000.0))
    spread = tol / 40.0 + CLASS_MARGIN
    low = math.floor(max(score - spread, 0.0))
    return 100 - low if low == math.floor(min(score + spread, 100.0)) else None


def fgd_classes(
    layout: Layout,
    mix: PlainMix | None,
    ledger: Ledger,
    shape: Shape,
    node: int,
    wanted: Sequence[int],
) -> list[int] | None:
    """The FGD class of one pod of ``shape`` on each of ``wanted`` (``[node]``, or GPUs of
    ``node`` for a slice), as ``Ranking._fgd_node``/``_fgd_slice`` compute it on exactly these
    targets; None where a class is not certain (see the module docstring). ``mix`` is the
    plain form of the mix for the node's VRAM size (None for a node without GPUs)."""
    size = layout.size[node]
    if mix is None or size == 0:  # no GPUs: no fragment before or after
        return None if shape.kind is Kind.SLICE else [50] * len(wanted)
    cpu, mem = int(ledger.cpu[node]), int(ledger.mem[node])
    cpu_after, mem_after = cpu - shape.cpu_milli, mem - shape.memory_mib
    if shape.kind is Kind.CPU and not any(
        cpu_after < c <= cpu or mem_after < m <= mem for c, m in zip(mix.cpu, mix.mem, strict=True)
    ):  # the pod leaves every shape the CPU and memory it needs: see below
        return [50]
    start, count, width = layout.start[node], layout.count[node], layout.width
    access = mix.access(layout.model[node])
    raw_v = ledger.vram[start : start + count].tolist()
    raw_s = ledger.sm[start : start + count].tolist()
    healthy = layout.healthy[start : start + count]
    free_v = tuple(x if ok else 0 for x, ok in zip(raw_v, healthy, strict=True))
    free_s = tuple(x if ok else 0 for x, ok in zip(raw_s, healthy, strict=True))
    v, s, n_fit, stranded, total = mix.summary(free_v, free_s, width - count)
    usable = _usable(mix, access, n_fit, cpu, mem)
    before = _fragment(mix, usable, stranded, total)
    # Every quantity summed is at most ``scale`` (idle shares of ``width`` GPUs, and of the one
    # a slice changes), the weights sum to 1: both forms are within ``tol / 2`` of exact dF.
    scale = MAX_SHARE * (width + 2)
    tol = 16.0 * (mix.shapes + width + 4) * UNIT_ROUNDOFF * scale

    if shape.kind is Kind.CPU:
        usable_after = _usable(mix, access, n_fit, cpu_after, mem_after)
        if usable_after == usable:  # bit-identical vectors in the vectorised form: dF == 0
            return [50]
        found = certain_class(_fragment(mix, usable_after, stranded, total) - before, tol)
        return None if found is None else [found]

    if shape.kind is Kind.WHOLE:  # the lowest-index pristine GPUs are taken
        v_after, s_after = list(free_v), list(free_s)
        taken: list[int] = []
        for c in range(count):
            vram = layout.vram[start + c]
            if len(taken) < shape.gpus and vram > 0 and free_v[c] == vram and free_s[c] == 100:
                v_after[c] = s_after[c] = 0
                taken.append(c)
        shapes = list(zip(mix.vram, mix.sm, strict=True))
        _, _, n_after, stranded_after, total_after = mix.summary(
            tuple(v_after), tuple(s_after), width - count
        )
        usable_after = _usable(mix, access, n_after, cpu_after, mem_after)
        if (
            all(usable)
            and all(usable_after)
            and all(v[c] >= vm and s[c] >= sm for c in taken for vm, sm in shapes)
        ):  # bit-identical vectors: see the module docstring
            return [50]
        after = _fragment(mix, usable_after, stranded_after, total_after)
        found = certain_class(after - before, tol)
        return None if found is None else [found]

    out: list[int] = []
    done: dict[tuple[int, int, bool], int] = {}  # GPUs in one state get one class
    for g in wanted:  # a slice changes one GPU: the node's summary, updated for that GPU
        c = g - start
        state = (raw_v[c], raw_s[c], healthy[c])
        if state in done:
            out.append(done[state])
            continue
        v_old, s_old = v[c], s[c]
        v_new = 1000.0 * (raw_v[c] - shape.vram_mib) / size
        s_new = 10.0 * (raw_s[c] - shape.sm_pct)
        idle_old, idle_new = (v_old + s_old) / 2.0, (v_new + s_new) / 2.0
        if not 0.0 <= idle_new <= MAX_SHARE:  # not a GPU the slice fits: outside ``scale``
            return None
        n_new: list[int] = []
        stranded_new: list[float] = []
        for m, (vm, sm) in enumerate(zip(mix.vram, mix.sm, strict=True)):
            fit_old = v_old >= vm and s_old >= sm
            fit_new = v_new >= vm and s_new >= sm
            n_new.append(n_fit[m] + fit_new - fit_old)
            stranded_new.append(
                stranded[m] + (0.0 if fit_new else idle_new) - (0.0 if fit_old else idle_old)
            )
        total_new = total - (idle_old - idle_new)
        usable_new = _usable(mix, access, n_new, cpu_after, mem_after)
        after = _fragment(mix, usable_new, stranded_new, total_new)
        found = certain_class(after - before, tol)
        if found is None:
            return None
        out.append(found)
        done[state] = found
    return out
