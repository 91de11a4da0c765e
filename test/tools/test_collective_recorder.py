# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""The collective recorder without a launch: its schedule checks on made-up records (cases that must fail
and pass), and its wrappers, installed by the rank-signal hook, on a fake Paddle in a fake rank."""

import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HARNESS = os.path.join(ROOT, "tools", "collective")
import collective_recorder as rec  # noqa: E402
import rank_signals  # noqa: E402

WORLD, SHARDING = (0, [0, 1]), (1, [0, 1])  # two groups of the same ranks (gid, ranks)


def c(op, group=WORLD, tensors=(), **roots):
    return {"op": op, "gid": group[0], "ranks": group[1], "tensors": [list(t) for t in tensors], **roots}


def numbered(records):
    return {r: [dict(e, i=i + 1) for i, e in enumerate(es)] for r, es in records.items()}


def problems(records, complete=True):
    return rec.schedule_problems(numbered(records), complete=complete)


U2 = c("all_gather", SHARDING, [([1024], "float32"), ([2048], "float32")])
BARRIER = c("barrier")


def test_same_sequences_and_paired_send_recv_pass():
    world, dp = (0, [0, 1, 2]), (2, [0, 2])
    loss = [([1], "float32")]
    records = {
        0: [c("broadcast", world, [([4], "int64")], src=0), U2, c("barrier", world), c("all_reduce", dp, loss),
            c("send", dp, [([2, 3], "float32")], peer=2), c("recv", dp, [([2, 3], "float32")], peer=2)],
        # the same collective on the calc stream
        1: [c("broadcast_on_calc_stream", world, [([4], "int64")], src=0), U2, c("barrier", world)],
        2: [c("broadcast", world, [([4], "int64")], src=0), c("barrier", world), c("all_reduce", dp, loss),
            c("recv", dp, [([2, 3], "float32")], peer=0), c("send", dp, [([2, 3], "float32")], peer=0)],
    }
    assert problems(records) == []


def test_equal_per_group_but_opposite_orders_is_a_wait_cycle():
    # the example: rank 0 gathers u2 then enters the barrier, rank 1 the other way round
    found = problems({0: [U2, BARRIER], 1: [BARRIER, U2]})
    assert len(found) == 1 and found[0].startswith("wait cycle: "), found
    assert "rank 0 issues #1 all_gather on group 1 [0, 1]" in found[0] and "before #2 barrier" in found[0]
    assert "rank 1 issues #1 barrier on group 0 [0, 1]" in found[0], found


def test_one_group_in_different_orders_differs():
    found = problems({0: [c("all_gather", WORLD, [([8], "float32")]), BARRIER],
                      1: [BARRIER, c("all_gather", WORLD, [([8], "float32")])]})
    assert found and found[0].startswith("differ: rank 0 #1 all_gather"), found
    assert "rank 1 #1 barrier" in found[0]


def test_mismatched_shapes_dtypes_and_sources_fail():
    for other in (c("all_reduce", tensors=[([3], "float32")]), c("all_reduce", tensors=[([4], "float64")])):
        found = problems({0: [c("all_reduce", tensors=[([4], "float32")])], 1: [other]})
        assert found and found[0].startswith("differ: ") and "float32[4]" in found[0], found
    same_numel = problems({0: [c("send", tensors=[([], "int64")], peer=1)], 1: [c("recv", tensors=[([1], "int64")], peer=0)]})
    assert same_numel == []  # Paddle's pipeline: a 0-d tensor sent, received into a [1] one
    assert problems({0: [c("all_reduce", tensors=[([2, 3], "float32")])], 1: [c("all_reduce", tensors=[([6], "float32")])]}) == []
    found = problems({0: [c("broadcast", src=0)], 1: [c("broadcast", src=1)]})
    assert found == ["differ: rank 0 #1 broadcast src 0 on group 0 [0, 1]; rank 1 #1 broadcast src 1 on group 0 [0, 1]"]


def test_missing_collective_fails_a_complete_launch_only():
    records = {0: [BARRIER, U2], 1: [BARRIER]}
    found = problems(records)
    assert found and found[0].startswith("missing collective: rank(s) [1] never issued"), found
    assert "#2 all_gather" in found[0]
    assert problems(records, complete=False) == []  # a failed launch: rank 1 may have stopped early
    assert problems({0: [BARRIER]}) and problems({0: [BARRIER]})[0].startswith("missing collective")  # no file


def test_unpaired_send_and_mismatched_pair_fail():
    dp = (2, [0, 1])
    send = c("send", dp, [([4], "float32")], peer=1)
    found = problems({0: [send, send], 1: [c("recv", dp, [([4], "float32")], peer=0)]})
    assert found and found[0].startswith("unpaired send: rank 0's #2 send peer 1"), found
    assert "no matching recv at rank 1" in found[0]
    found = problems({0: [send], 1: [c("recv", dp, [([5], "float32")], peer=0)]})
    assert found and found[0].startswith("differ: ") and "float32[5]" in found[0], found
    found = problems({0: [c("recv", dp, peer=1)], 1: []})
    assert found and found[0].startswith("unpaired recv: rank 0's #1 recv") and "no matching send" in found[0]


def test_failed_launch_names_where_the_ranks_wait_on_each_other():
    # pp2 x sharding2 cut short: rank 0 in a sharding broadcast rank 1 never issued, rank 1 in a barrier
    # rank 0 never reached (no cycle among what was recorded), rank 2 in a recv of a send rank 0 never made
    world, pipe = (0, [0, 1, 2]), (10, [0, 2])
    records = numbered({0: [c("barrier", world), U2], 1: [c("barrier", world), c("barrier", world)],
                        2: [c("barrier", world), c("barrier", world), c("recv", pipe, peer=0)]})
    found = rec.schedule_problems(records, complete=False)
    assert found == ["the ranks' last collectives wait on each other: rank 0 in #2 all_gather on group 1 [0, 1]: "
                     "float32[1024], float32[2048], never issued by rank 1; rank 1 in #2 barrier on group 0 "
                     "[0, 1, 2], never issued by rank 0"], found
    assert rec.last_collectives(records, 3) == [
        "  rank 0: #2 all_gather on group 1 [0, 1]: float32[1024], float32[2048] (never issued by rank(s) [1])",
        "  rank 1: #2 barrier on group 0 [0, 1, 2] (never issued by rank(s) [0])",
        "  rank 2: #3 recv peer 0 on group 10 [0, 2] (never issued by rank(s) [0])"]


def test_blocking_sends_towards_each_other_are_a_cycle():
    dp = (2, [0, 1])
    found = problems({0: [c("send", dp, peer=1), c("recv", dp, peer=1)],
                      1: [c("send", dp, peer=0), c("recv", dp, peer=0)]})
    assert found and found[-1].startswith("wait cycle: "), found


def test_uneven_all_to_all_compares_dtypes_only():
    assert problems({0: [c("all_to_all_single", tensors=[([3], "float32")])],
                     1: [c("all_to_all_single", tensors=[([5], "float32")])]}) == []


def test_recorder_errors_and_last_collectives_are_reported():
    records = numbered({0: [BARRIER, {"op": "broadcast", "gid": None, "error": "KeyError: 'x'"}], 1: [BARRIER]})
    assert rec.schedule_problems(records)[0] == "the recorder could not describe rank 0's #2 broadcast: KeyError: 'x'"
    assert rec.last_collectives(records, 3)[1:] == ["  rank 1: #1 barrier on group 0 [0, 1]", "  rank 2: none recorded"]


FAKE_PADDLE = {
    "__init__.py": "from .base import core\nfrom . import distributed\nTensor = core.Tensor\n",
    "base/__init__.py": "",
    "base/core.py": textwrap.dedent("""
        class Tensor:
            def __init__(self, shape, dtype="paddle.float32"):
                self.shape, self.dtype = shape, dtype
        class ProcessGroup:
            def rank(self): return 0
            def size(self): return 2
            def all_gather(self, a, b): return ("task", a.shape, b.shape)
            def broadcast(self, t, src, sync_op=True): return ("task", src)
            def send(self, t, dst, sync_op=True): return ("sent", dst)
        class ProcessGroupGloo(ProcessGroup):
            def create(self): pass
    """),
    "distributed/__init__.py": "from . import collective\n",
    "distributed/collective.py": textwrap.dedent("""
        class Group:
            def __init__(self, gid, ranks, pg): self.id, self.ranks, self._pg = gid, ranks, pg
        _group_map, _group_map_by_name = {}, {}
    """),
}


def test_hook_records_every_process_group_call_after_paddle_import(tmp_path):
    for name, text in FAKE_PADDLE.items():
        path = tmp_path / "site" / "paddle" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    body = textwrap.dedent(f"""
        import runpy, sys
        runpy.run_path({os.path.join(HARNESS, 'rank_signals.py')!r}, run_name={rank_signals._HOOK_RUN_NAME!r})
        assert "paddle" not in sys.modules
        import paddle
        from paddle.distributed import collective
        pg, other = paddle.base.core.ProcessGroupGloo(), paddle.base.core.ProcessGroup()
        collective._group_map[3] = collective.Group(3, [2, 5], pg)
        assert pg.all_gather(paddle.Tensor([2]), paddle.Tensor([4])) == ("task", [2], [4])
        assert pg.broadcast(paddle.Tensor([1], "paddle.int64"), 1, sync_op=False) == ("task", 1)
        assert other.send(paddle.Tensor([3]), dst=1) == ("sent", 1)
        assert pg.rank() == 0
    """)
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"), PADDLE_TRAINER_ID="1",
               PADDLE_OVERLAY_RANK_SIGNAL_DIR=str(tmp_path / "signals"))
    done = subprocess.run([sys.executable, "-S", "-c", body], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    with open(tmp_path / "signals" / "collectives-1.jsonl") as f:
        entries = [json.loads(line) for line in f]
    assert entries == [
        {"i": 1, "op": "all_gather", "gid": 3, "ranks": [2, 5], "tensors": [[[2], "float32"], [[4], "float32"]]},
        {"i": 2, "op": "broadcast", "gid": 3, "ranks": [2, 5], "tensors": [[[1], "int64"]], "src": 5},
        {"i": 3, "op": "send", "gid": None, "ranks": None, "tensors": [[[3], "float32"]],
         "pg": "ProcessGroup rank 0 of 2", "peer": 1},
    ]
    assert rec.load(str(tmp_path / "signals")) == {1: entries}
