"""Replay of the Alibaba openb GPU trace under the protocol of Weng et al. (USENIX ATC'23).

Modules, in the order a run uses them: :mod:`~bench.openb.trace` (CSV -> numpy tables),
:mod:`~bench.openb.variant2d` (the 2-D slice variant), :mod:`~bench.openb.protocol` (arrival
order, 1.3x tune, typical pods, the allocation metric), :mod:`~bench.openb.state` (free resources
of the cluster), :mod:`~bench.openb.baselines` (the paper's six policies),
:mod:`~bench.openb.tessera` (Tessera's policy), :mod:`~bench.openb.solver` (the production
solver as a policy), :mod:`~bench.openb.replay` (one run),
:mod:`~bench.openb.runner` (a matrix of runs on a process pool), :mod:`~bench.openb.report`
(``results.json``, ``summary.md``, the plot), :mod:`~bench.openb.cli` (``tessera bench openb``).
"""
