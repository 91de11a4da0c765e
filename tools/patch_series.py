# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""The pull requests the Paddle patch is split into (docs/patches.md), in order.

Each PR has a key, a title in Paddle's PR style, the files that first appear in it (overlay modules and
test files, paths from the repository root; a spliced overlay module's methods count from its first PR)
and its commit message: What, Why (the fault fixed, as a minimal reproduction), How, How tested, Size.
Text of a later PR inside a file is fenced in the source by comment lines ``# series: KEY`` ...
``# series: end`` (from PR KEY on), or ``# series: until KEY`` ... ``# series: end`` (commented-out
lines, uncommented in the PRs before KEY). ``tools/make_patch.py`` builds each PR's tree from them and
fills in ``{size}`` (measured), ``{version}`` and ``{cpu}`` (:data:`CPU_RESULTS`). A PR's ``new``
sections replace ``what``/``why`` for a release that has none of the code it supersedes (2.6).
"""

OPT = "paddle_overlay/distributed/fleet/meta_optimizers/dygraph_optimizer"
JIT = "paddle_overlay/jit/dy2static"
TESTS = "test/collective/fleet"

PRS = (
    {
        "key": "owner",
        "title": "[Distributed] Sharding stage 1 V1: one owner for the broadcast overlap, in an agreed order",
        "files": (
            f"{OPT}/dygraph_sharding_optimizer.py",
            f"{OPT}/hybrid_parallel_optimizer.py",
            f"{OPT}/broadcast_buckets.py",
            f"{OPT}/comm_unit.py",
            f"{OPT}/param_sync_overlap.py",
            f"{OPT}/sync_registry.py",
            f"{OPT}/sync_stats.py",
            f"{OPT}/unit_plan.py",
            f"{OPT}/wait_map.py",
            f"{TESTS}/test_dygraph_sharding_stage1_broadcast_overlap.py",
            f"{TESTS}/dygraph_sharding_stage1_broadcast_overlap.py",
        ),
        "what": """\
DygraphShardingOptimizer._set_broadcast_overlap(True, layers=model) (PR
#63945) gets one owner, ParamSyncOverlap (param_sync_overlap.py): the
post-update broadcasts start asynchronously inside step()/minimize(), on
every rank, in the order forward first uses the parameters, agreed across
the sharding group at the first update (one int64 broadcast of the count
and one of the order, the only host synchronization); each layer's forward
pre-hook waits for its own parameters. The code it replaces is removed: the
name sort in __init__, _forward_pre_hook_function, the overlap branch of
_sharding_sync_parameters and step()'s hook removal.""",
        "why": """\
With the code it replaces:
- the ranks broadcast in the order of
  int(param.name.split('.')[0].split('_')[-1]), not forward's: a model
  whose parameters are created in another order than forward uses them (a
  head built first) waits at its first layer for most broadcasts;
- step() removes the hooks and the sync registers one per leaf layer again:
  layers that own parameters but have sublayers are never waited, and
  _set_broadcast_overlap(False) leaves the hooks of the last step.
Reproduction (2 ranks): self.head = nn.Linear(...) built before self.embed;
with overlap on, the first forward after step() waits in embed for head's
broadcast. With this change a forward waits for nothing issued after what
it needs, and turning the overlap off waits for the pending broadcasts and
removes every hook.""",
        "new": {
            "what": """\
DygraphShardingOptimizer._set_broadcast_overlap(True, layers=model) (the
entry point PR #63945 added to later releases) overlaps the post-update
parameter broadcast with the next forward, through one owner,
ParamSyncOverlap (param_sync_overlap.py): the broadcasts start
asynchronously inside step()/minimize(), on every rank, in the order
forward first uses the parameters, agreed across the sharding group at the
first update (one int64 broadcast of the count and one of the order, the
only host synchronization); each layer's forward pre-hook waits for its own
parameters.""",
            "why": """\
_sharding_sync_parameters broadcasts every parameter with sync_op=True
after the update: the next forward starts only after the last broadcast.
Reproduction (2 ranks): step() returns after one blocking broadcast per
parameter; with overlap on it returns once they are launched, and the
forward waits layer by layer.""",
        },
        "how": """\
ParamSyncOverlap owns the order, the units (comm_unit.CommUnit, one task
each, from a planner of unit_plan: here one broadcast per parameter), the
hook handles and the registry of pending parameters (sync_registry). In
DygraphShardingOptimizer: one branch at the top of
_sharding_sync_parameters (launch instead of the blocking sync), one line
at the top of step() and minimize() (wait before the update), state_dict()
waits first. HybridParallelOptimizer._step holds the launch back until its
mp/pp parameter syncs are done (a line at its top, one at its end), as
without overlap. No hook issues a collective, so code one rank alone runs
between steps cannot make the ranks' collectives differ.""",
        "tested": """\
test_dygraph_sharding_stage1_broadcast_overlap (2 ranks): loss and
parameters bitwise equal to overlap off (gradient accumulation 1 and 2,
minimize()); the agreed order is forward's first use, on every rank; each
parameter launched every step and waited once; hooks constant across steps
and all removed when turned off. Its bf16 case (O1 vs O2 with main_grad,
GradScaler; overlap on vs off bitwise) needs 2 GPUs with bf16 and skips
with the reason otherwise. Measured on the CPU (2 gloo ranks, Paddle
{version}): {cpu}. GPU CI: the same row, both cases on 2 GPUs.""",
        "size": """\
{size}; larger than the others because the owner (param_sync_overlap.py,
most of it) is one state machine (record the first use, agree the order,
launch, wait, close) that the later PRs build on: a part of it alone would
launch collectives no hook waits for, or hooks no rank agrees on.""",
    },
    {
        "key": "buckets",
        "title": "[Distributed] Sharding stage 1 V1: broadcast overlap in buckets of contiguous storage",
        "files": (),
        "what": """\
_set_broadcast_overlap(..., bucket_size_mb=256) sends one broadcast per
(window of the agreed order, owner rank, dtype): at the first update the
parameters of a bucket move once into one 1-D buffer and become views of
it, as Paddle's tensor fusion does (ShardingGradView._share_param_buffer);
with sharding_configs.tensor_fusion or comm_overlap the buckets are slices
of Paddle's fused buffers, which are not moved. 0 keeps one broadcast per
parameter.""",
        "why": """\
One broadcast per parameter leaves the link idle between small messages: a
model of many small parameters (norms, biases) sends as many broadcasts as
it has parameters. Reproduction: the test model (11 parameters) on 2 ranks
launches 11 broadcasts per step, one per parameter; 6 with 2 KB buckets.""",
        "how": """\
broadcast_buckets.py plans buckets (pure, the same on every rank: windows
closed at the cap, slots aligned to 256 bytes; frozen parameters, tied
repeats and empty tensors get no slot) and owns their storage;
unit_plan.Buckets and unit_plan.FusedSlices turn them into units. Memory
replaced under a parameter later (a loader sharing new memory) is put back
into its slot at the next launch, locally; a dtype or size change is
refused with a ValueError naming the parameter, before anything is sent.""",
        "tested": """\
The cases of test_dygraph_sharding_stage1_broadcast_overlap run twice: one
broadcast per parameter, and 2 KB buckets (a bucket boundary inside a
layer): bitwise equal to overlap off, fewer units than parameters, each
launched every step and waited once. Measured on the CPU (2 gloo ranks,
Paddle {version}): {cpu}. GPU CI: the same row.""",
        "size": "{size}.",
    },
    {
        "key": "reads",
        "title": "[Distributed] Sharding stage 1: parameter reads and compiled programs wait for the overlapped sync",
        "files": (
            f"{OPT}/read_interception.py",
            f"{JIT}/pre_call_hooks.py",
            f"{JIT}/program_translator.py",
        ),
        "what": """\
While the parameter sync overlap is on, every Python read of a parameter
waits for its own pending broadcast (layer attributes, parameters(),
named_parameters(), state_dict(), the _parameters dict), and a call of a
paddle.jit.to_static function waits for every pending one; no
paddle.device.cuda.synchronize() is needed before paddle.save().""",
        "why": """\
Between step() and the next forward the parameters of non-owner ranks hold
their old values until their broadcast is waited, and only forward
pre-hooks waited: paddle.save(model.state_dict()) right after step(), an
EMA over model.parameters(), an evaluation through a compiled forward all
read old values, with no error. Reproduction (2 ranks, GPUs): step(), then
np.array(model.head.weight) on rank 1 differs from rank 0's; with this
change they are equal.""",
        "how": """\
read_interception.py makes each owning layer's _parameters a guarded
OrderedDict (every Python path to a parameter goes through it) whose reads
wait for exactly what they return, issuing no collective. A compiled
program reads parameters outside Python, so StaticFunction.__call__ now
runs the hooks of a small registry (paddle/jit/dy2static/pre_call_hooks.py,
empty by default, so paddle.jit does not import fleet), where the overlap
adds its wait while an owner is open. A forward most of whose broadcasts
were already waited by reads warns once (the overlap was lost).""",
        "tested": """\
test_dygraph_sharding_stage1_broadcast_overlap's reads case, in both modes:
an attribute, parameters(), state_dict() and a to_static forward right
after step(), each path first in turn, equal to overlap off bitwise; every
path counted. Measured on the CPU (2 gloo ranks, Paddle {version}): {cpu}.
GPU CI: the same row.""",
        "size": "{size}.",
    },
    {
        "key": "v2",
        "title": "[Distributed] Sharding stage 1 V2: all-gather overlap on the same owner",
        "files": (
            f"{TESTS}/test_dygraph_sharding_stage1_v2_allgather_overlap.py",
            f"{TESTS}/dygraph_sharding_stage1_v2_allgather_overlap.py",
        ),
        "what": """\
DygraphShardingOptimizerV2._set_all_gather_overlap_forward(True, model)
(split_param; PaddleFormers' --stage1_allgather_overlap) runs on the owner
of the broadcast overlap: step() starts the all-gather of every comm buffer
(FusedCommBuffer, Paddle's layout kept) asynchronously, on every rank, in
the order forward first uses the buffers; pre-hooks, reads and compiled
programs wait, none starts a gather. The code it replaces is removed:
_forward_pre_hook_function, _try_start_bucket_param_sync,
make_forward_hook, _register_pre_forward_hooks, the overlap branches of
_sharding_sync_parameters and step(), and their attributes.""",
        "why": """\
With the code it replaces:
- gathers start from forward pre-hooks, one at a time: a forward or a
  parameter read on one rank alone (rank 0 saving a checkpoint) starts a
  gather the other ranks never start, and the next collective hangs;
- a layer's hook starts the buffers of its parameters in the iteration
  order of a set, which differs across processes: ranks pair different
  buffers (of equal sizes: silently mixed data);
- state_dict() or parameters() right after step() read buffers never
  gathered; a frozen-only buffer is marked SYNCING with no task (assert);
  a parameter the optimizer lacks raises KeyError in the hook; the root
  layer's own parameters are never waited; the hooks are never removed.
Reproduction (2 ranks): step(), then model.state_dict() on rank 0 only,
then a barrier: rank 0 waits in the gather its read started, rank 1 in the
barrier.""",
        "new": {
            "what": """\
DygraphShardingOptimizerV2._set_all_gather_overlap_forward(True, model)
(split_param; the entry point of later releases that PaddleFormers'
--stage1_allgather_overlap calls) overlaps V2's post-update all-gathers
with the next forward on the owner of the broadcast overlap: step() starts
the all-gather of every comm buffer (FusedCommBuffer, Paddle's layout kept)
asynchronously, on every rank, in the order forward first uses the
buffers; pre-hooks, reads and compiled programs wait, none starts a
gather.""",
            "why": """\
V2's step() all-gathers every comm buffer with the blocking sync_params():
the next forward starts only after the last gather. Reproduction (2 ranks):
step() returns after one blocking all-gather per comm buffer; with overlap
on it returns once they are launched.""",
        },
        "how": """\
unit_plan.CommBuffers plans one all-gather unit per comm buffer (comm_unit:
kind "all_gather"); V2's step() and _sharding_sync_parameters take the same
two edits as V1's; the settings that move gradient or optimizer-state
storage (release_gradients, free_grads_in_comm,
enable_fuse_optimizer_states) are refused by name, as untested;
_set_broadcast_overlap on V2 says to use this method.""",
        "tested": """\
test_dygraph_sharding_stage1_v2_allgather_overlap (2 ranks,
TestMultipleGpus; comm buffers of 1 MB so the model has several): on == off
bitwise (losses, values read between steps, final parameters); the gathers
in forward's first-use order, on every rank; reads right after step()
(state_dict(), parameters(), an attribute, a to_static forward); a read on
rank 0 alone before a barrier; hooks constant and all removed. Its bf16
case (O2 with main_grad, on vs off bitwise) needs 2 GPUs with bf16 and
skips with the reason otherwise. Measured on the CPU (2 gloo ranks, Paddle
{version}): {cpu}. GPU CI: the same row, both cases on 2 GPUs.""",
        "size": "{size}.",
    },
)

SECTIONS = (("What", "what"), ("Why", "why"), ("How", "how"), ("How tested", "tested"), ("Size", "size"))

# What each PR's tests measured on the CPU (test/patch/test_patched_tree_broadcast_overlap.py: the
# series applied PR by PR to the release's tree, its drivers run after each PR; seconds of the launch,
# start-up included), per release; filled in the messages' {cpu}.
CPU_RESULTS = {
    "3.3.1": {
        "owner": "4 case runs pass in one launch (9 s); the bf16 case skips (no CUDA)",
        "buckets": "8 case runs pass (4 cases x 2 modes) in one launch (9 s)",
        "reads": "10 case runs pass (5 cases x 2 modes) in one launch (9 s)",
        "v2": "5 cases pass in one launch (5 s), the bf16 case skips (no CUDA); the V1 row's 10 case runs "
              "still pass (9 s)",
    },
    "2.6.2": {
        "owner": "4 case runs pass in one launch (7 s); the bf16 case skips (no CUDA)",
        "buckets": "8 case runs pass (4 cases x 2 modes) in one launch (5 s)",
        "reads": "10 case runs pass (5 cases x 2 modes) in one launch (6 s)",
        "v2": "5 cases pass in one launch (5 s), the bf16 case skips (no CUDA); the V1 row's 10 case runs "
              "still pass (6 s)",
    },
}


def message(pr, version, size, replaces):
    """The commit message of ``pr`` (title first) for a release; ``replaces``: whether the release has
    code the PR supersedes (else its ``new`` sections)."""
    import textwrap

    parts = dict(pr)
    if not replaces:
        parts.update(pr.get("new", {}))
    cpu = CPU_RESULTS.get(version, {}).get(pr["key"], "not measured for this release")
    out = [pr["title"], ""]
    for heading, key in SECTIONS:
        text = parts[key].format(size=size, version=version, cpu=cpu)
        paragraph = []
        for line in f"{heading}: {text}".splitlines():
            if line.startswith("- ") or not paragraph:
                paragraph.append(line)
            elif paragraph[-1].startswith("- ") and not line.startswith("  "):
                paragraph.append(line)
            else:
                paragraph[-1] += " " + line.strip()
        for item in paragraph:
            bullet = item.startswith("- ")
            out += textwrap.wrap(item, 72, subsequent_indent="  " if bullet else "", break_on_hyphens=False,
                                 break_long_words=False)
        out.append("")
    return "\n".join(out)
