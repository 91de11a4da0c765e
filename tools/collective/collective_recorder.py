# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""Every rank's collectives, and the checks that they form one schedule (test harness only; docs/harness.md).

In each rank of every launch (started by the rank-signal hook, :mod:`rank_signals`), :func:`install_after_import`
wraps, as soon as ``import paddle`` has finished, every collective method of Paddle's process-group classes
(``paddle.base.core.ProcessGroup`` and its subclasses: ``all_gather``, ``all_reduce``, ``broadcast``, ``barrier``,
``send``/``recv``, ``reduce``, ``scatter``, ``all_to_all``, ``reduce_scatter``, their ``*_on_calc_stream``,
``*_tensor``, ``*_partial`` variants: every public method but :data:`NOT_COLLECTIVES`, as each release defines
them), so V2's ``group.process_group.all_gather(shard, full)`` is seen as well as ``paddle.distributed``'s
functions, which call these methods. Also the collective operators of ``paddle._legacy_C_ops``
(:data:`LEGACY_OPS`: Paddle 2.6's model-parallel and pipeline helpers call some directly), by their
``ring_id``. Before each call runs, one JSON line goes to ``<signal dir>/collectives-<rank>.jsonl``
(``os.write``, so a rank killed in a hang has written it): ``i`` (the rank's count), ``op`` (the method),
``gid`` and ``ranks`` (the group's id and global ranks, from Paddle's group map by the process-group object),
``tensors`` (``[shape, dtype]`` per tensor argument, in order), ``src``/``dst`` (global) of rooted
collectives, ``peer`` (global) of send/recv. The wrappers pass every argument on and return what Paddle
returns; a failure to record is swallowed, never raised.

Not seen (the gap): collectives that C++ issues on its own (gradients of ``c_identity``, the collectives
inside a compiled program: ``paddle.jit.to_static``, static graphs, auto-parallel) and the collective operators
of ``paddle._C_ops`` (Paddle 3.x: ``c_concat``, ``all_reduce_``, ``mp_allreduce_sum`` in ``mp_ops``,
``all_gather`` in ``pp_utils``, ``c_softmax_with_cross_entropy``; their arguments are positional, without
names). On the CPU (gloo) the tests' model-parallel and pipeline paths go through the process-group methods
(``hybrid_parallel_cpu_shim``).

After a launch :func:`load` reads the files and :func:`schedule_problems` checks (``collective_launch`` does it
for every launch): per group, every member issued the same sequence of (op, shapes, dtypes, root), the k-th
send a->b paired with the k-th recv at b from a (same shapes; shapes compare by element count); and the ranks' program orders merge into one
order: the graph whose nodes are the k-th collective of a group (or the k-th send a->b with its recv) and
whose edges follow each rank's order has no cycle (a cycle is a wait cycle: each rank waits in a collective
that another rank reaches only later). :func:`last_collectives` names each rank's last one.
"""

import collections
import importlib.abc
import importlib.util
import json
import os
import re
import sys
import threading

FILE_PATTERN = r"collectives-(\d+)\.jsonl"
# public process-group methods that are no collective
# (the one list: collective_methods(), which blocking_calls.py beside this file uses too)
NOT_COLLECTIVES = frozenset("name rank size id create create_default_device get_comm_name get_group_id backend "
                            "eager_connect eager_connect_ring_exchange".split())
# _legacy_C_ops operators that communicate (found by their 'ring_id' attribute; 'root'/'root_id', 'peer')
LEGACY_OPS = re.compile(r"(alltoall|barrier|c_allgather|c_allreduce_(max|min|prod|sum)|c_broadcast|c_concat"
                        r"|c_reduce_(max|min|prod|sum)|c_reducescatter|c_scatter|c_softmax_with_(multi_label_)?"
                        r"cross_entropy|global_(gather|scatter)|mp_allreduce_sum|partial_(allgather|recv|send)"
                        r"|recv_v2|send_v2)_?")
# position of the group rank in a process-group method's arguments (after self), and its field
_ROOT = {"broadcast": (1, "src", ("src", "source_rank")), "scatter": (2, "src", ("src",)),
         "scatter_tensor": (2, "src", ("src",)), "reduce": (1, "dst", ("dst",)), "gather": (2, "dst", ("dst",)),
         "send": (1, "peer", ("dst",)), "send_partial": (1, "peer", ("dst",)), "recv": (1, "peer", ("src",)),
         "recv_partial": (1, "peer", ("src",))}
_LEGACY_ROOT = {"root": "src", "root_id": "dst", "peer": "peer"}
_ALIASES = {"allreduce": "all_reduce", "alltoall": "all_to_all", "alltoall_single": "all_to_all_single",
            "send_v2": "send", "recv_v2": "recv", "partial_send": "send_partial", "partial_recv": "recv_partial"}
SEND_OPS, RECV_OPS = ("send", "send_partial"), ("recv", "recv_partial")
# shapes may differ between the ranks (uneven splits): compared by dtype only
UNEVEN_OPS = ("all_to_all_single", "global_gather", "global_scatter")


class _Recorder:
    def __init__(self, path):
        self.path, self.fd, self.count, self.lock, self.pid = path, None, 0, threading.Lock(), os.getpid()
        self.tensor_type = None

    def write(self, entry):
        with self.lock:
            if self.fd is None:  # at the first collective: a rank that issues none leaves no file
                self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self.count += 1
            os.write(self.fd, (json.dumps({"i": self.count, **entry}, separators=(",", ":")) + "\n").encode())

    def tensors(self, values):
        out = []
        for value in values:
            for t in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(t, self.tensor_type):
                    out.append([list(t.shape), str(t.dtype).replace("paddle.", "")])
        return out


_STATE = {}


def _group_of(match):
    """(gid, global ranks) of the first group in Paddle's group map that ``match(group)``, else (None, None)."""
    collective = sys.modules.get("paddle.distributed.collective")
    maps = [getattr(collective, "_group_map", {}), getattr(collective, "_group_map_by_name", {})]
    for group in (g for m in maps for g in list(m.values())):
        if match(group):
            return group.id, list(group.ranks)
    return None, None


def _global(ranks, local):
    return ranks[local] if ranks and isinstance(local, int) and 0 <= local < len(ranks) else local


def _method_entry(recorder, name, pg, args, kwargs):
    gid, ranks = _group_of(lambda g: getattr(g, "_pg", None) is pg)
    entry = {"op": name, "gid": gid, "ranks": ranks, "tensors": recorder.tensors(list(args) + list(kwargs.values()))}
    if gid is None:
        entry["pg"] = f"{type(pg).__name__} rank {pg.rank()} of {pg.size()}"
    root = _ROOT.get(canonical(name))
    if root:
        index, field, names = root
        local = next((kwargs[k] for k in names if k in kwargs), args[index] if len(args) > index else None)
        entry[field] = _global(ranks, local)
    return entry


def _legacy_entry(recorder, name, args):
    attrs = {args[i]: args[i + 1] for i in range(len(args) - 1) if isinstance(args[i], str)}
    gid, ranks = _group_of(lambda g: g.id == attrs.get("ring_id", 0))
    entry = {"op": name, "gid": gid, "ranks": ranks, "tensors": recorder.tensors(args)}
    for attr, field in _LEGACY_ROOT.items():
        if attr in attrs:
            entry[field] = _global(ranks, attrs[attr])
    return entry


def _wrap(recorder, name, fn, make_entry):
    def recorded(*args, **kwargs):
        if os.getpid() == recorder.pid:  # not in a forked child
            try:
                entry = make_entry(recorder, name, args, kwargs)
            except Exception as e:  # never change what the rank does: the checks report it
                entry = {"op": name, "gid": None, "error": f"{type(e).__name__}: {e}"}
            try:
                recorder.write(entry)
            except Exception:
                pass
        return fn(*args, **kwargs)

    recorded.__name__, recorded.__doc__, recorded.__wrapped__ = name, getattr(fn, "__doc__", None), fn
    return recorded


def collective_methods(cls):
    """The collective methods a process-group class defines itself: every public callable of its own namespace
    but :data:`NOT_COLLECTIVES`."""
    return [n for n in list(vars(cls))
            if not n.startswith("_") and n not in NOT_COLLECTIVES and callable(getattr(cls, n))]


def install(signal_dir, rank):
    """Wrap the collectives of the imported Paddle (once per process); records go to ``signal_dir``. Returns
    the names wrapped ([] without Paddle's process groups, e.g. a fake ``paddle`` in ``test/tools``)."""
    if "recorder" in _STATE:
        return _STATE["wrapped"]
    recorder = _STATE["recorder"] = _Recorder(os.path.join(signal_dir, f"collectives-{rank}.jsonl"))
    _STATE["wrapped"] = wrapped = []
    try:
        import paddle
        from paddle.base import core

        recorder.tensor_type = paddle.Tensor
        classes = [getattr(core, n) for n in dir(core) if n.startswith("ProcessGroup")]
        classes = [c for c in classes if isinstance(c, type) and issubclass(c, core.ProcessGroup)]
    except (ImportError, AttributeError):
        return wrapped
    for cls in classes:
        for name in collective_methods(cls):
            method = _wrap(recorder, name, getattr(cls, name), lambda r, n, a, k: _method_entry(r, n, a[0], a[1:], k))
            setattr(cls, name, method)
            wrapped.append(f"{cls.__name__}.{name}")
    legacy = getattr(paddle, "_legacy_C_ops", None)
    for name in [n for n in dir(legacy) if LEGACY_OPS.fullmatch(n)] if legacy else ():
        setattr(legacy, name, _wrap(recorder, name, getattr(legacy, name), lambda r, n, a, k: _legacy_entry(r, n, a)))
        wrapped.append(f"_legacy_C_ops.{name}")
    return wrapped


class _AfterPaddleImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: hands Paddle's own spec back with :func:`install` run after ``paddle`` executed."""

    def __init__(self, signal_dir, rank):
        self.signal_dir, self.rank = signal_dir, rank

    def find_spec(self, name, path=None, target=None):
        if name != "paddle":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        if loader is not None and hasattr(loader, "exec_module"):
            exec_module = loader.exec_module

            def exec_then_install(module):
                exec_module(module)
                install(self.signal_dir, self.rank)

            loader.exec_module = exec_then_install
        return spec


def install_after_import(signal_dir, rank):
    """:func:`install` once ``import paddle`` has finished (now if it has), in this process."""
    if "paddle" in sys.modules:
        return install(signal_dir, rank)
    if not any(isinstance(f, _AfterPaddleImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterPaddleImport(signal_dir, rank))
    return None


# ----------------------------------------------------------------------------------------------------------
# after the launch (pure Python: no Paddle)
def load(signal_dir):
    """{rank: [entry, ...]} of the records in ``signal_dir`` (a line cut short by a kill is left out)."""
    records = {}
    try:
        names = os.listdir(signal_dir)
    except OSError:
        return records
    for m in filter(None, map(re.compile(FILE_PATTERN).fullmatch, names)):
        entries = records[int(m.group(1))] = []
        with open(os.path.join(signal_dir, m.group()), errors="replace") as f:
            for line in f:
                try:
                    entries.append(json.loads(line))
                except ValueError:
                    pass
    return records


def canonical(op):
    """The collective an op name runs: ``broadcast_on_calc_stream`` -> ``broadcast``, ``send_v2`` -> ``send``."""
    op = op[: -len("_on_calc_stream")] if op.endswith("_on_calc_stream") else op.rstrip("_")
    return _ALIASES.get(op, op)


def group_key(entry):
    return ("gid", entry["gid"]) if entry.get("gid") is not None else ("pg", entry.get("pg"))


def group_name(entry):
    return f"group {entry['gid']} {entry['ranks']}" if entry.get("gid") is not None else f"process group {entry.get('pg')}"


def describe(entry):
    """``#12 all_gather on group 0 [0, 1]: float32[1024], float32[2048]`` (root and peer as global ranks)."""
    tensors = ", ".join(f"{dtype}{shape}" for shape, dtype in entry.get("tensors", []))
    roots = "".join(f" {k} {entry[k]}" for k in ("src", "dst", "peer") if k in entry)
    return f"#{entry.get('i')} {entry['op']}{roots} on {group_name(entry)}" + (f": {tensors}" if tensors else "")


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _signature(entry, p2p=False):
    """What the ranks must agree on: tensors by element count and dtype (Paddle's pipeline sends a 0-d tensor
    that its peer receives into a [1] one: what a communication library matches is elements and dtype)."""
    op = canonical(entry["op"])
    tensors = [[None if op in UNEVEN_OPS else _numel(shape), dtype] for shape, dtype in entry.get("tensors", [])]
    return json.dumps(tensors) if p2p else (op, json.dumps(tensors), entry.get("src"), entry.get("dst"))


def _nodes(records):
    """{rank: [(node, entry), ...]} in program order; node = (group key, k) for the k-th collective of a group,
    (group key, 'p2p', sender, receiver, k) for the k-th send sender -> receiver and its recv."""
    out = {}
    for rank, entries in records.items():
        seen, nodes = collections.Counter(), []
        for e in entries:
            op, key = canonical(e["op"]), group_key(e)
            if op in SEND_OPS or op in RECV_OPS:
                pair = (rank, e.get("peer")) if op in SEND_OPS else (e.get("peer"), rank)
                node = (key, "p2p") + pair
            else:
                node = (key,)
            nodes.append((node + (seen[node],), e))
            seen[node] += 1
        out[rank] = nodes
    return out


def _sequence_problem(sequence, by_node, expected, complete):
    """The first problem of one sequence (a group's collectives, or one p2p direction), or None."""
    for node in sorted(sequence, key=lambda n: n[-1]):
        got, p2p = by_node[node], node[1:2] == ("p2p",)
        if len({_signature(e, p2p) for e in got.values()}) > 1:
            return "differ: " + "; ".join(f"rank {r} {describe(e)}" for r, e in sorted(got.items()))
        missing = sorted(r for r in expected if r not in got)
        if missing and complete:
            r, e = min(got.items())
            if p2p:
                other = "recv" if r == node[2] else "send"
                return f"unpaired {canonical(e['op'])}: rank {r}'s {describe(e)} has no matching {other} at rank {missing[0]}"
            return f"missing collective: rank(s) {missing} never issued the one matching rank {r}'s {describe(e)}"
    return None


def schedule_problems(records, complete=True, limit=8):
    """What keeps the recorded collectives from being one schedule (list of str; [] when they are).

    ``complete``: the launch ended normally, so every collective a rank issued must have its partners; with
    False (a launch that failed) sequences may stop early and only what was recorded is compared."""
    problems = [f"the recorder could not describe rank {r}'s #{e.get('i')} {e['op']}: {e['error']}"
                for r, es in sorted(records.items()) for e in es if "error" in e]
    nodes = _nodes(records)
    # (a) per group, the members' sequences; per p2p direction, each send against its recv
    by_node = collections.defaultdict(dict)  # node -> {rank: entry}
    members = collections.defaultdict(set)  # sequence (node less k) -> ranks that must issue it
    for rank, items in nodes.items():
        for node, e in items:
            by_node[node][rank] = e
            members[node[:-1]].update(node[2:4] if node[1:2] == ("p2p",) else e.get("ranks") or [rank])
    sequences = collections.defaultdict(list)
    for node in by_node:
        sequences[node[:-1]].append(node)
    for seq in sorted(sequences, key=repr):
        problem = _sequence_problem(sequences[seq], by_node, members[seq], complete)
        if problem:
            problems.append(problem)
    # (b) one order: the graph of the ranks' program orders must be acyclic
    cycle = _find_cycle(nodes)
    if cycle:
        problems.append("wait cycle: " + "; ".join(f"rank {r} issues {' before '.join(map(describe, es))}"
                                                  for r, es in cycle))
    ranks, waits = _rank_wait_cycle(records)
    if ranks and not complete:  # a launch that failed: where its ranks stood waiting on each other
        problems.append("the ranks' last collectives wait on each other: " + "; ".join(
            f"rank {r} in {describe(waits[r][0])}, never issued by rank {waits[r][1][0]}" for r in ranks))
    if len(problems) > limit:
        problems = problems[:limit] + [f"... and {len(problems) - limit} more"]
    return problems


def _find_cycle(nodes):
    """[(rank, [entry, ...]), ...] of a cycle in the program-order graph (the ranks' runs along it), or None."""
    succ = collections.defaultdict(dict)  # node -> {next node: (rank, entry a, entry b)}
    for rank, items in nodes.items():
        for (a, ea), (b, eb) in zip(items, items[1:]):
            succ[a].setdefault(b, (rank, ea, eb))
    color, stack = {}, []  # iterative depth-first search: 1 on the path, 2 done

    for start in list(succ):
        if color.get(start):
            continue
        color[start], path, stack = 1, [start], [iter(succ[start].items())]
        while stack:
            step = next(stack[-1], None)
            if step is None:
                color[path.pop()] = 2
                stack.pop()
                continue
            node, _ = step
            if color.get(node) == 1:  # back edge: path[from node] + node is a cycle
                loop = path[path.index(node):] + [node]
                runs = []
                for a, b in zip(loop, loop[1:]):
                    rank, ea, eb = succ[a][b]
                    if runs and runs[-1][0] == rank:
                        runs[-1][1].append(eb)
                    else:
                        runs.append((rank, [ea, eb]))
                return runs
            if not color.get(node):
                color[node] = 1
                path.append(node)
                stack.append(iter(succ[node].items()))
    return None


def _last_waits(records):
    """{rank: (its last entry, [member ranks that never issued that collective or its send/recv])}."""
    nodes = _nodes(records)
    issued = {r: {n for n, _ in items} for r, items in nodes.items()}
    out = {}
    for rank, items in nodes.items():
        if items:
            node, e = items[-1]
            members = node[2:4] if node[1:2] == ("p2p",) else e.get("ranks") or [rank]
            out[rank] = (e, sorted(r for r in members if node not in issued.get(r, ())))
    return out


def _rank_wait_cycle(records):
    """The ranks, in order, of a cycle of 'its last collective was never issued by the next' (a deadlock at
    the end of a failed launch), or None."""
    waits = _last_waits(records)
    for start in sorted(waits):
        path = [start]
        while waits.get(path[-1]) and waits[path[-1]][1]:
            following = waits[path[-1]][1][0]
            if following in path:
                return path[path.index(following):], waits
            path.append(following)
    return None, waits


def last_collectives(records, nproc):
    """One line per rank: its last recorded collective, and the members that never issued it."""
    waits, lines = _last_waits(records), []
    for rank in range(nproc):
        e, missing = waits.get(rank, (None, []))
        line = describe(e) if e else "none recorded"
        lines.append(f"  rank {rank}: {line}" + (f" (never issued by rank(s) {missing})" if missing else ""))
    return lines
