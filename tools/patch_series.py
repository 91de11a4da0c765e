# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""The manifest of the Paddle patch series (docs/patches.md): the pull requests, in order, and the
whole definitions each one adds. ``tools/make_patch.py`` builds PR k's tree from it.

Each PR has a key, a title, the files that first appear in it (``files``: repository paths; an overlay
module spliced into Paddle's class counts as appearing in the PR of its first methods), the whole
definitions it adds to files of earlier PRs (``adds``: ``path::name`` where name is a module-level
function, class or assigned name (``_STARTS["all_gather"]``), ``Class.method`` or ``Class.ATTR``), and
whether it deletes the upstream code the earlier PRs superseded (``superseded``). A definition of a file
not named in a later PR's ``adds`` comes with the file. The product holds one text of every definition: a
PR carries whole definitions only, never a different body of one.

The message of each PR follows Paddle's pull-request template (PR Category, PR Types, Description); its
Description has What, Why (a reproduction a reviewer can paste), How, Tests and Size. ``{size}`` is
measured, ``{version}`` and ``{cpu}`` (:data:`CPU_RESULTS`) filled in. ``new`` sections replace ``what``
and ``why`` for a release that has none of the upstream code the PR supersedes or replaces (2.6).
"""

OPT = "paddle_overlay/distributed/fleet/meta_optimizers/dygraph_optimizer"
JIT = "paddle_overlay/jit/dy2static"
TESTS = "test/collective/fleet"
PSO = f"{OPT}/param_sync_overlap.py"
HPO = f"{OPT}/hybrid_parallel_optimizer.py"
DSO = f"{OPT}/dygraph_sharding_optimizer.py"

PRS = (
    {
        "key": "buckets",
        "title": "[Distributed] Sharding stage 1: contiguous buckets for the parameter broadcast",
        "types": "New features",
        "files": (
            f"{OPT}/broadcast_buckets.py",
            f"{TESTS}/sharding_param_sync_utils.py",
            f"{TESTS}/test_dygraph_sharding_stage1_broadcast_buckets.py",
            f"{TESTS}/dygraph_sharding_stage1_broadcast_buckets.py",
        ),
        "adds": (),
        "what": """\
broadcast_buckets.py (new, no caller yet; the later PRs of this series
use it): plans buckets of parameters for the post-update broadcast of
sharding stage 1, one per (window of a given order, owner rank, dtype)
closed at a cap in MB, and moves their parameters once into one
contiguous 1-D buffer each, as Paddle's tensor fusion does
(ShardingGradView._share_param_buffer), so one broadcast sends a whole
bucket. The cap is read as Paddle reads its sharding knobs:
FLAGS_sharding_overlap_bucket_size_mb, default 256 (Paddle's own
comm_buffer_size_MB default; 0: one broadcast per parameter).""",
        "why": """\
One broadcast per parameter leaves the link idle between small messages:
a model of many small parameters (norms, biases) sends as many
broadcasts as it has parameters. Reproduction (2 ranks):

    python -m paddle.distributed.launch --nproc_per_node 2 \\
        test/collective/fleet/dygraph_sharding_stage1_broadcast_buckets.py

sends the 8 parameters of its model in 3 broadcasts of 1 KB buckets.""",
        "how": """\
plan_buckets is pure and the same on every rank (slots aligned to 256
bytes; frozen parameters, tied repeats and empty tensors get no slot);
plan_fused_slices cuts Paddle's fused buffers into such buckets without
moving anything. BucketStorage materializes the buckets, and rebinds a
parameter whose memory was replaced later (a loader sharing new memory)
into its slot, locally; a dtype or size change raises a ValueError
naming the parameter. The 256 MB default: Paddle's own default for fused
buffers; a smaller cap only adds collectives.""",
        "tested": """\
test_dygraph_sharding_stage1_broadcast_buckets (2 ranks): the buckets of
a model, materialized (values and parameter objects kept), broadcast from
their owners, hold the owners' values; replaced memory is rebound; a
dtype change is refused; the flag's default and value. Measured on the
CPU (2 gloo ranks, Paddle {version}): {cpu}. GPU CI: the same row.""",
        "size": "{size}.",
    },
    {
        "key": "units",
        "title": "[Distributed] Sharding stage 1: units of the parameter sync and their planners",
        "types": "New features",
        "files": (
            f"{OPT}/comm_unit.py",
            f"{OPT}/unit_plan.py",
            f"{TESTS}/test_dygraph_sharding_stage1_param_sync_units.py",
            f"{TESTS}/dygraph_sharding_stage1_param_sync_units.py",
        ),
        "adds": (),
        "what": """\
comm_unit.py and unit_plan.py (new; the owner of the next PRs uses
them): a CommUnit is one collective of the post-update parameter sync
and owns its task (start with sync_op=False, finish, both safe to call
again, as Megatron-LM's start_param_sync/finish_param_sync); planners
build a fixed list of units from an agreed order: PerParameter (one
broadcast per parameter, PR #63945's unit), Buckets (one per bucket of
the previous PR) and FusedSlices (slices of Paddle's fused buffers).""",
        "why": """\
The sync that the next PRs overlap with forward must be the same
collectives, in the same order, on every rank, and must not change after
the first step (no collective to agree again): a plan is made once,
locally, and checked locally before each launch. Reproduction (2 ranks):

    python -m paddle.distributed.launch --nproc_per_node 2 \\
        test/collective/fleet/dygraph_sharding_stage1_param_sync_units.py""",
        "how": """\
A unit knows its tensor, source rank and the positions of the parameters
it delivers; a unit whose parameters are all frozen is skipped (as V2's
need_reduce_scale_sync). A plan's prepare() checks the parameters
against the plan before each launch (and rebinds bucket slots): a dtype
or size change raises before anything is sent.""",
        "tested": """\
test_dygraph_sharding_stage1_param_sync_units (2 ranks): per parameter
and in buckets, the units started on both ranks deliver the owners'
values; frozen units are skipped; a unit started twice and a changed
parameter are refused. Measured on the CPU (2 gloo ranks, Paddle
{version}): {cpu}. GPU CI: the same row.""",
        "size": "{size}.",
    },
    {
        "key": "reads",
        "title": "[Distributed][Dy2St] Parameter reads and compiled programs wait for a pending sync",
        "types": "New features",
        "files": (
            f"{OPT}/sync_registry.py",
            f"{OPT}/sync_stats.py",
            f"{OPT}/read_interception.py",
            f"{JIT}/pre_call_hooks.py",
            f"{JIT}/program_translator.py",
            f"{TESTS}/test_dygraph_sharding_stage1_param_sync_reads.py",
            f"{TESTS}/dygraph_sharding_stage1_param_sync_reads.py",
        ),
        "adds": (),
        "what": """\
While a parameter's sync is pending (registered in sync_registry.PENDING
by an owner, the next PR), every Python read of it waits for its own unit
(layer attributes, parameters(), named_parameters(), state_dict(), the
_parameters dict of a guarded layer), and a call of a paddle.jit.to_static
function waits for every pending unit first. StaticFunction.__call__ runs
the hooks of a small registry (paddle/jit/dy2static/pre_call_hooks.py,
empty by default, so paddle.jit does not import fleet).""",
        "why": """\
An overlapped sync leaves the parameters of non-owner ranks with their old
values until it is waited; if only forward pre-hooks wait,
paddle.save(model.state_dict()) right after step(), an EMA over
model.parameters() or an evaluation through a compiled forward read old
values, with no error. Reproduction (2 ranks; a broadcast in flight, then
a read):

    python -m paddle.distributed.launch --nproc_per_node 2 \\
        test/collective/fleet/dygraph_sharding_stage1_param_sync_reads.py""",
        "how": """\
read_interception makes a guarded layer's _parameters a GuardedParameters
(an OrderedDict; every Python path to a parameter goes through it) whose
reads wait for exactly what they return, issuing no collective. A compiled
program reads parameters outside Python, so it waits for every open owner,
in creation order, through the pre-call hook. sync_stats names what is
counted (who waited first). Needs the nn and dy2static owners' review:
Layer._parameters is replaced per guarded layer while an owner is open,
and StaticFunction.__call__ gains one call.""",
        "tested": """\
test_dygraph_sharding_stage1_param_sync_reads (2 ranks): a broadcast in
flight, then an attribute, parameters(), state_dict() and a to_static
call each return rank 0's values, waiting only for what they read;
guards and the hook are removed when released. Measured on the CPU (2
gloo ranks, Paddle {version}): {cpu}. GPU CI: the same row.""",
        "size": "{size}.",
    },
    {
        "key": "waits",
        "title": "[Distributed] Sharding stage 1: which layer waits for which units of the parameter sync",
        "types": "New features",
        "files": (
            f"{OPT}/wait_map.py",
            f"{TESTS}/test_dygraph_sharding_stage1_param_sync_waits.py",
            f"{TESTS}/dygraph_sharding_stage1_param_sync_waits.py",
        ),
        "adds": (),
        "what": """\
wait_map.LayerWaits (new; the owner of the next PR uses it): given a
model and the positions of the optimizer's parameters, the layers whose
forward pre-hook waits for each unit of the parameter sync: every layer
that owns parameters directly waits for its own units only; a container
without forward (ParameterList) is waited by its nearest ancestor with a
forward; the root is always hooked; parameters no layer owns are
reported (the owner waits for them right after their launch). A forward
that needs a unit while an earlier one of the agreed order is pending is
counted out of order, with one warning.""",
        "why": """\
PR #63945 hooks leaf layers only: a layer that owns a parameter and has
sublayers (a block with its own scale, a ParameterList's parent) is never
waited, and its forward reads a parameter mid-broadcast. Reproduction (2
ranks; the checks are local):

    python -m paddle.distributed.launch --nproc_per_node 2 \\
        test/collective/fleet/dygraph_sharding_stage1_param_sync_waits.py""",
        "how": """\
The map is built once from the model's sublayers and rebuilt only when
the units change; the order check walks a cursor over the agreed order,
so a forward in that order costs one comparison per layer.""",
        "tested": """\
test_dygraph_sharding_stage1_param_sync_waits (2 ranks): a block owning a
parameter and a sublayer, a ParameterList and a parameter no layer owns
map to the expected layers and units; an out-of-order need is counted
each time and warned once. Measured on the CPU (2 gloo ranks, Paddle
{version}): {cpu}. GPU CI: the same row.""",
        "size": "{size}.",
    },
    {
        "key": "owner",
        "title": "[Distributed] Sharding stage 1: one owner that launches the parameter sync and waits per layer",
        "types": "New features",
        "files": (
            f"{OPT}/param_sync_overlap.py",
            f"{TESTS}/test_dygraph_sharding_stage1_param_sync_owner.py",
            f"{TESTS}/dygraph_sharding_stage1_param_sync_owner.py",
        ),
        "adds": (),
        "what": """\
ParamSyncOverlap (param_sync_overlap.py; no optimizer uses it before the
next PRs): records the order forward first uses the parameters (forward
pre-hooks, first in each layer's order), agrees it across the sharding
group at the first launch (one int64 broadcast of the count and one of
the order, the only host synchronization), then launches every unit, on
every rank, in that order; each layer that owns parameters waits for its
own units only. strict (FLAGS_sharding_overlap_strict) makes the first
hooked layer wait for everything.""",
        "why": """\
PR #63945's overlap sorts the broadcasts by parameter name, registers one
hook per leaf layer and removes the hooks in step(): a head built before
the embedding waits at the first layer for most broadcasts, layers that
own parameters but have sublayers are never waited, and a forward or a
read on one rank alone issues no collective only by chance. Reproduction
(2 ranks, the owner driven directly):

    python -m paddle.distributed.launch --nproc_per_node 2 \\
        test/collective/fleet/dygraph_sharding_stage1_param_sync_owner.py""",
        "how": """\
The layers and units each pre-hook waits for come from the previous PR's
wait map; parameters no layer owns are waited right after their launch,
with one warning. No hook issues a collective, so code one rank alone
runs between steps cannot make the ranks' collectives differ. Hooks are
registered once and removed together by close(); an owner whose
optimizer is collected is unhooked at the next explicit call.""",
        "tested": """\
test_dygraph_sharding_stage1_param_sync_owner (2 ranks): the agreed order
is forward's first use on both ranks; after a local update each forward
waits for its own units and sees the owners' values; hooks are constant
over steps and removed by close(); strict waits at the root. Measured on
the CPU (2 gloo ranks, Paddle {version}): {cpu}. GPU CI: the same row.""",
        "size": """\
{size}; above the others because the owner is one state machine (record,
agree, launch, wait, close): launching without the waits would let
forward read parameters mid-broadcast.""",
    },
    {
        "key": "hybrid",
        "title": "[Distributed] HybridParallelOptimizer: mp/pp parameter syncs wait for the sharding sync",
        "types": "New features",
        "files": (
            HPO,
            f"{TESTS}/test_dygraph_sharding_stage1_param_sync_lead.py",
            f"{TESTS}/dygraph_sharding_stage1_param_sync_lead.py",
        ),
        "adds": (
            f"{PSO}::ParamSyncOverlap.lead_with",
            f"{PSO}::ParamSyncOverlap.lead",
            f"{PSO}::wait_before_hybrid_sync",
            f"{PSO}::plan_hybrid_synced_first",
        ),
        "what": """\
HybridParallelOptimizer._step hands the parameters its model- and
pipeline-parallel syncs cover after the update (mp_configs.sync_param,
pp_configs.sync_param; Paddle's own filters) to the sharding sync's
owner before its first launch, which plans them into the first units
and waits for those before the update returns (the owner's launch waits
for its lead), so whichever code sends them on next (Paddle's
_insert_sync, or a trainer's replacement of it) reads the updated values;
_insert_sync also waits for any other parameter's unit before it sends
or all-reduces that parameter. Nothing changes while no owner is open.""",
        "why": """\
With the parameter sync overlapped, the mp/pp syncs right after the
inner step() would read parameters whose broadcast is still in flight
and send stale values (or race with the broadcast writing them).
Reproduction (2 ranks, the owner driven directly):

    python -m paddle.distributed.launch --nproc_per_node 2 \\
        test/collective/fleet/dygraph_sharding_stage1_param_sync_lead.py""",
        "how": """\
The lead set is agreed with the order (rank 0's, sent as position + n in
the same message), so every rank plans the same units; only the
parameters those syncs cover lose the overlap.""",
        "tested": """\
test_dygraph_sharding_stage1_param_sync_lead (2 ranks): the lead is
planned into the first units, rank 0's lead wins, and the wait before a
hybrid sync finishes exactly that parameter's unit. The 4-rank runs (mp2
x sharding2, pp2 x sharding2 with a shared weight) need 4 GPUs and stay
out of this PR's rows. Measured on the CPU (2 gloo ranks, Paddle
{version}): {cpu}. GPU CI: the same row.""",
        "size": "{size}.",
    },
    {
        "key": "v1",
        "title": "[Distributed] Sharding stage 1 V1: broadcast overlap on the owner, in buckets by default",
        "types": "New features",
        "files": (
            DSO,
            f"{TESTS}/test_dygraph_sharding_stage1_broadcast_overlap.py",
            f"{TESTS}/dygraph_sharding_stage1_broadcast_overlap.py",
        ),
        "adds": (
            f"{PSO}::check_overlap_flag",
            f"{PSO}::switch_owner",
            f"{PSO}::launch_param_sync",
            f"{PSO}::prepare_param_sync_update",
            f"{PSO}::wait_param_sync",
            f"{HPO}::HybridParallelOptimizer._set_broadcast_overlap",
            f"{HPO}::HybridParallelOptimizer._set_overlap_of_inner",
        ),
        "what": """\
DygraphShardingOptimizer._set_broadcast_overlap(True, layers=model) (the
entry point of PR #63945) runs on the owner of the previous PRs: step()
and minimize() launch the post-update broadcasts asynchronously where
the blocking sync was, in buckets (FLAGS_sharding_overlap_bucket_size_mb,
default 256; with tensor_fusion or comm_overlap: slices of Paddle's fused
buffers), and wait for whatever is pending before the update;
state_dict() waits first. Upstream's hook-based overlap becomes
unreachable (deleted by the last PR of this series).""",
        "new": {
            "what": """\
DygraphShardingOptimizer._set_broadcast_overlap(True, layers=model) (the
entry point PR #63945 added to later releases) overlaps the post-update
parameter broadcast with the next forward through the owner of the
previous PRs: step() and minimize() launch the broadcasts asynchronously
where the blocking sync was, in buckets
(FLAGS_sharding_overlap_bucket_size_mb, default 256; with tensor_fusion
or comm_overlap: slices of Paddle's fused buffers), and wait for whatever
is pending before the update; state_dict() waits first.""",
            "why": """\
_sharding_sync_parameters broadcasts every parameter with sync_op=True
after the update: the next forward starts only after the last broadcast.
Reproduction (2 ranks):

    python -m paddle.distributed.launch --nproc_per_node 2 \\
        test/collective/fleet/dygraph_sharding_stage1_broadcast_overlap.py""",
        },
        "why": """\
The upstream overlap (PR #63945) broadcasts in parameter-name order from
hooks that step() removes and registers again, one per leaf layer; the
owner gives forward's order, every layer that owns parameters, constant
hooks and waits for reads. Reproduction (2 ranks; on vs off bitwise,
forward's order, units and waits, reads right after step()):

    python -m paddle.distributed.launch --nproc_per_node 2 \\
        test/collective/fleet/dygraph_sharding_stage1_broadcast_overlap.py""",
        "how": """\
Three direct edits: a branch at the top of _sharding_sync_parameters
(launch instead of the blocking sync when the overlap is on), a line at
the top of step() and minimize() (wait, and check the parameters against
the plan before the update), state_dict() waits first. The wrapper
HybridParallelOptimizer._set_broadcast_overlap forwards to it and names
what to set around another optimizer. Arguments: strict and
bucket_size_mb default to None, which reads FLAGS_sharding_overlap_strict
and FLAGS_sharding_overlap_bucket_size_mb.""",
        "tested": """\
test_dygraph_sharding_stage1_broadcast_overlap (2 ranks): loss and
parameters bitwise equal to overlap off (gradient accumulation 1 and 2,
minimize()), per parameter and in 2 KB buckets; the agreed order is
forward's first use; each unit launched every step and waited once;
reads right after step() (attribute, parameters(), state_dict(), a
to_static forward); hooks constant and removed. Its bf16 case (O1 vs O2
with main_grad, GradScaler; on vs off bitwise) needs 2 GPUs with bf16 and
skips with the reason otherwise. Measured on the CPU (2 gloo ranks,
Paddle {version}): {cpu}. GPU CI: the same row, both cases.""",
        "size": """\
{size}; above 600 because most of it is its test: the comparison of a
real sharded training with the overlap off, on 2 ranks, per parameter
and in buckets, and the bf16 case GPU CI runs.""",
    },
    {
        "key": "v2",
        "title": "[Distributed] Sharding stage 1 V2: all-gather overlap on the same owner",
        "types": "New features",
        "files": (
            f"{TESTS}/test_dygraph_sharding_stage1_v2_allgather_overlap.py",
            f"{TESTS}/dygraph_sharding_stage1_v2_allgather_overlap.py",
        ),
        "adds": (
            f"{DSO}::DygraphShardingOptimizerV2._set_all_gather_overlap_forward",
            f"{DSO}::DygraphShardingOptimizerV2._set_broadcast_overlap",
            f"{DSO}::DygraphShardingOptimizerV2._sharding_sync_parameters",
            f"{DSO}::DygraphShardingOptimizerV2.step",
            f"{DSO}::DygraphShardingOptimizerV2.rebuild",
            f"{DSO}::DygraphShardingOptimizerV2.clear_param_storage",
            f"{DSO}::DygraphShardingOptimizerV2.state_dict",
            f"{DSO}::DygraphShardingOptimizerV2._check_all_gather_overlap_settings",
            f"{OPT}/comm_unit.py::PaddleComm.all_gather",
            f"{OPT}/comm_unit.py::_start_all_gather",
            f'{OPT}/comm_unit.py::_STARTS["all_gather"]',
            f"{OPT}/unit_plan.py::CommBuffers",
            f"{OPT}/unit_plan.py::_comm_buffer_units",
            f"{OPT}/unit_plan.py::_CommBufferPlan",
            f"{HPO}::HybridParallelOptimizer._set_all_gather_overlap_forward",
        ),
        "what": """\
DygraphShardingOptimizerV2._set_all_gather_overlap_forward(True, model)
(split_param; PaddleFormers' --stage1_allgather_overlap) runs on the
same owner: step() starts the all-gather of every comm buffer
(FusedCommBuffer, Paddle's layout kept) asynchronously, on every rank,
in the order forward first uses the buffers; pre-hooks, reads and
compiled programs wait, none starts a gather. rebuild() and
clear_param_storage() wait first, and the plan follows rebuilt buffers.
Upstream's hook-based V2 overlap becomes unreachable (deleted by the
last PR).""",
        "why": """\
Upstream's V2 overlap starts gathers from forward pre-hooks, one at a
time: a forward or a parameter read on one rank alone (rank 0 saving a
checkpoint) starts a gather the other ranks never start, and the next
collective hangs; a layer's hook starts its buffers in the iteration
order of a set, which differs across processes, so ranks pair different
buffers. Reproduction (2 ranks; includes a read on rank 0 alone before a
barrier):

    python -m paddle.distributed.launch --nproc_per_node 2 \\
        test/collective/fleet/dygraph_sharding_stage1_v2_allgather_overlap.py""",
        "new": {
            "what": """\
DygraphShardingOptimizerV2._set_all_gather_overlap_forward(True, model)
(split_param; the entry point of later releases that PaddleFormers'
--stage1_allgather_overlap calls) overlaps V2's post-update all-gathers
with the next forward on the same owner: step() starts the all-gather of
every comm buffer (FusedCommBuffer, Paddle's layout kept)
asynchronously, on every rank, in the order forward first uses the
buffers; pre-hooks, reads and compiled programs wait, none starts a
gather.""",
            "why": """\
V2's step() all-gathers every comm buffer with the blocking sync_params():
the next forward starts only after the last gather. Reproduction (2
ranks):

    python -m paddle.distributed.launch --nproc_per_node 2 \\
        test/collective/fleet/dygraph_sharding_stage1_v2_allgather_overlap.py""",
        },
        "how": """\
unit_plan.CommBuffers plans one all-gather unit per comm buffer
(comm_unit: kind "all_gather"); V2's step() and _sharding_sync_parameters
take the same two edits as V1's; the settings that move gradient or
optimizer-state storage (release_gradients, free_grads_in_comm,
enable_fuse_optimizer_states) are refused by name, as untested;
_set_broadcast_overlap on V2 says to use this method.""",
        "tested": """\
test_dygraph_sharding_stage1_v2_allgather_overlap (2 ranks; comm buffers
of 1 MB so the model has several): on == off bitwise (losses, values read
between steps, final parameters); the gathers in forward's first-use
order, on every rank; reads right after step(); a read on rank 0 alone
before a barrier; hooks constant and removed. Its bf16 case (O2 with
main_grad, on vs off bitwise) needs 2 GPUs with bf16 and skips with the
reason otherwise. Measured on the CPU (2 gloo ranks, Paddle {version}):
{cpu}. GPU CI: the same row, both cases.""",
        "size": """\
{size}; above 600 because most of it is its test: V2's training on 2
ranks with the overlap on and off, and the read on one rank before a
barrier that hangs upstream's overlap.""",
    },
    {
        "key": "cleanup",
        "title": "[Distributed] Sharding stage 1: remove the superseded hook-based overlap",
        "types": "Deprecations",
        "files": (),
        "adds": (),
        "superseded": True,
        "what": """\
Deletes the code the previous PRs made unreachable: V1's name sort of
_broadcast_order_params, _forward_pre_hook_function, the overlap
branches of _sharding_sync_parameters and step() and the flag they read
(_broadcast_overlap); V2's _forward_pre_hook_function,
_try_start_bucket_param_sync, make_forward_hook,
_register_pre_forward_hooks, the overlap branches of
_sharding_sync_parameters and step() and their attributes; and what only
they used in FusedCommBuffer (the Status enum, status, sync_param_task,
the asynchronous branch of sync_params and its parameters).""",
        "why": """\
Nothing in Paddle calls any of it since the entry points run on the
owner. Reproduction (nothing may name them after this PR):

    git grep -n -e _try_start_bucket_param_sync -e sync_param_task \\
        -e FusedCommBuffer.Status -- python/""",
        "how": """\
Each deleted if keeps the branch it took with the old overlap off.
PaddleFormers, PaddleNLP and ERNIE read none of these names (they read
_broadcast_overlap of GroupShardedOptimizerStage2 only, which is not
touched); a subclass outside Paddle that calls the deleted V2 methods
(fp8 variants overriding step()) has to move to the owner.""",
        "tested": """\
The rows of the previous PRs, unchanged, on this tree. Measured on the
CPU (2 gloo ranks, Paddle {version}): {cpu}.""",
        "size": "{size}.",
    },
)

# The PR template's fixed answers (Paddle's .github/PULL_REQUEST_TEMPLATE.md: PR Category, PR Types,
# Description).
CATEGORY = "Distributed Strategy"

SECTIONS = (("What", "what"), ("Why", "why"), ("How", "how"), ("Tests", "tested"), ("Size", "size"))

# What each PR's tests measured on the CPU (test/patch/test_patched_tree_broadcast_overlap.py: the
# series applied PR by PR to the release's checkout-like tree, the drivers of PRs 1..k run after PR k),
# per release; filled in the messages' {cpu}.
_CPU_RESULTS = {
    "buckets": "3 cases pass on both ranks",
    "units": "3 cases pass on both ranks",
    "reads": "3 cases pass on both ranks",
    "waits": "2 cases pass on both ranks",
    "owner": "2 cases pass on both ranks",
    "hybrid": "1 case passes on both ranks",
    "v1": "10 case runs pass (5 cases x 2 modes); the bf16 case skips (no CUDA)",
    "v2": "5 cases pass, the bf16 case skips (no CUDA); the V1 row's 10 case runs still pass",
    "cleanup": "every row of the previous PRs passes",
}
CPU_RESULTS = {"3.3.1": _CPU_RESULTS, "2.6.2": _CPU_RESULTS}  # the same counts on both


def message(pr, version, size, replaces):
    """The commit message of ``pr`` (title first, then Paddle's PR template) for a release;
    ``replaces``: whether the release has the upstream code the PR supersedes (else its ``new``
    sections)."""
    import textwrap

    parts = dict(pr)
    if not replaces:
        parts.update(pr.get("new", {}))
    cpu = CPU_RESULTS.get(version, {}).get(pr["key"], "not measured for this release")
    out = [pr["title"], "", "### PR Category", CATEGORY, "", "### PR Types", pr["types"], "", "### Description"]
    for heading, key in SECTIONS:
        text = parts[key].format(size=size, version=version, cpu=cpu)
        out.append("")
        paragraph = []
        code = []
        for line in f"{heading}: {text}".splitlines():
            if line.startswith("    "):  # a reproduction: kept as written, to paste
                code.append(line)
                continue
            if code:
                paragraph.append("\n".join(code))
                code = []
            if line.startswith("- ") or not paragraph or paragraph[-1].startswith("    "):
                paragraph.append(line)
            elif not line.strip():
                paragraph.append("")
            else:
                paragraph[-1] += " " + line.strip()
        if code:
            paragraph.append("\n".join(code))
        for item in paragraph:
            if item.startswith("    ") or not item:
                out.append(item)
                continue
            bullet = item.startswith("- ")
            out += textwrap.wrap(item, 72, subsequent_indent="  " if bullet else "", break_on_hyphens=False,
                                 break_long_words=False)
    out.append("")
    return "\n".join(out)
