"""A deterministic virtual clock at the process-group level, to time the parameter sync's overlap
without a GPU (test and benchmark code, not the product; ``docs/performance.md`` Section 3).

Modules, one job each:

* ``timeline``: the time model (one in-order stream per process group, compute with contention, waits)
  and the bound;
* ``costs``: collective and forward times from the measured H200 figures in ``benchmarks/data/``;
* ``contention``: the two contention rates, from measured figures;
* ``standins``: the torch stand-ins' schedules replayed on the model, next to their measurements;
* ``clock``: the process-group wrapper that drives the timelines from real collectives, modelled sizes
  and forward hooks;
* ``waiter``: who waited for a task, from the call stack;
* ``fake_group``: sharding groups of N ranks in one process;
* ``llama``: LLaMA-7B-shaped models built tiny, with modelled sizes;
* ``runs``: the modes (off, the product, upstream) trained under the clock.
"""
