# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""The case module of the per-rank scripts of the sharding stage 1 parameter-sync overlap (V1 broadcasts and V2
all-gathers alike), imported everywhere as ``import sharding_cases as cases``. (The launcher that starts the ranks is
elsewhere: ``tools/collective/collective_launch.py``.)

- Models: :class:`TinyLM` (embedding, :class:`Block` s, head; sized by its arguments) and :class:`VariantLM` (the same
  with overridable parts); deterministic per-rank data (:func:`batch`); seeded builds.
- :func:`train`: the one training loop, returning a :class:`Run`; what it trains is a :class:`Build`; every callback of
  it takes the ``Run`` alone (``run.step``, ``run.micro``: where the loop is). :func:`compare_on_off`: overlap off vs on
  bitwise (losses, values read between steps, final parameters, ranks equal per group) under the wait checker
  (:mod:`param_sync_checker`), which every on run gets.
- Public views of the owner (:func:`overlap_impl`, :func:`optimizer_parameters`, :func:`bucket_units`, ...) and of
  fleet's set-up (:func:`init_fleet`, :func:`sharding_configs`, :func:`sharding_v2`).
- :func:`run_cases` / :func:`run_named`: the per-rank ``main``: fleet init, the cases named in env
  ``BROADCAST_OVERLAP_CASES`` (all by default), expected failures, a verdict agreed across the ranks, exit code non-zero
  on any failure; ``dygraph_sharding_stage1_broadcast_overlap_groups.py`` runs several scripts' cases in one launch.

The collective-sequence recorder (``tools/collective/collective_recorder.py``) needs nothing here: the launcher installs
it in every rank of every launch and checks its records after each launch.
"""

import contextlib
import dataclasses
import functools
import importlib
import json
import os
import re
import tempfile
import time
import traceback
import types
import warnings
import zlib
from collections import OrderedDict
from unittest import mock

import hybrid_parallel_cpu_shim
import numpy as np
from param_sync_checker import ParamSyncWaitChecker

import paddle
from paddle.distributed import fleet

VOCAB, HIDDEN, SEQ, BATCH = 32, 16, 6, 4
STEPS = int(os.environ.get("BROADCAST_OVERLAP_STEPS", "4"))
KB = 1 / 1024  # in MB (bucket_size_mb)
# V2's comm buffers in MB (sharding_configs.comm_buffer_size_MB on Paddle 3.x, an int: 1 is the smallest; the CPU shim's
# item 9 on 2.6)
V2_BUFFER_MB = 1
PADDLE_2 = paddle.__version__.startswith("2.")


# ----------------------------------------------------------------------
# models
class Block(paddle.nn.Layer):
    """LayerNorm -> Linear -> gelu -> Linear, residual; [B, S, H] -> [B, S, H]."""

    def __init__(self, hidden=HIDDEN):
        super().__init__()
        self.norm = paddle.nn.LayerNorm(hidden)
        self.up = paddle.nn.Linear(hidden, 2 * hidden)
        self.down = paddle.nn.Linear(2 * hidden, hidden)

    def forward(self, x):
        return x + self.down(paddle.nn.functional.gelu(self.up(self.norm(x))))


class TinyLM(paddle.nn.Layer):
    """Embedding -> blocks -> head: [B, S] int64 tokens -> [B, S, vocab] float32 logits; the one model family of the
    scripts, sized by its arguments; subclasses override its steps (``embedded``, ``run_block``, ``logits``)."""

    def __init__(self, num_blocks=2, vocab=VOCAB, hidden=HIDDEN):
        super().__init__()
        self.embed = paddle.nn.Embedding(vocab, hidden)
        self.blocks = paddle.nn.LayerList([Block(hidden) for _ in range(num_blocks)])
        self.head = paddle.nn.Linear(hidden, vocab)

    def forward(self, tokens):
        x = self.embedded(tokens)
        for i in range(len(self.blocks)):
            x = self.run_block(i, x)
        return self.logits(x)

    def embedded(self, tokens):
        return self.embed(tokens)

    def run_block(self, i, x):
        return self.blocks[i](x)

    def logits(self, x):
        return self.head(x)


def WideLM():
    """TinyLM of 3 blocks of width 256, about 3.2 MB of fp32 parameters: 4 V2 comm buffers of 1 MB."""
    return TinyLM(num_blocks=3, hidden=256)


# ----------------------------------------------------------------------
# data and set-up
def rank():
    return paddle.distributed.get_rank()


def batch(step, micro=0, vocab=VOCAB):
    """Deterministic ([B, S] int64 tokens, [B, S] int64 labels), per rank."""
    rng = np.random.RandomState(1000 * step + 10 * micro + rank())
    tokens = rng.randint(0, vocab, size=(BATCH, SEQ)).astype("int64")
    labels = rng.randint(0, vocab, size=(BATCH, SEQ)).astype("int64")
    return paddle.to_tensor(tokens), paddle.to_tensor(labels)


def seeded(model):
    """``model()`` with weights from a seeded build, the same on all ranks and in every run of one case."""
    paddle.seed(2026)
    state = snapshot(model())
    built = model()
    built.set_state_dict({k: paddle.to_tensor(v) for k, v in state.items()})
    return built


def snapshot(layer):
    """{name: numpy copy} of ``layer.state_dict()``."""
    return {k: v.numpy().copy() for k, v in layer.state_dict().items()}


def lm_loss(model, step, micro=0):
    tokens, labels = batch(step, micro)
    return paddle.nn.functional.cross_entropy(model(tokens), labels).mean()


def default_micro_step(run):
    """Forward and backward of one micro-batch; returns the loss."""
    loss = lm_loss(run.model, run.step, run.micro)
    (loss / run.acc_steps).backward()
    return loss


def step_aware_micro_step(run):
    """``default_micro_step`` that first sets the user's layer's ``step``."""
    run.model._layers.step = run.step
    return default_micro_step(run)


def adamw(parameters, **settings):
    """AdamW of learning rate 0.01 and weight decay 0.01 (``settings``: other values, or more of AdamW's arguments)."""
    return paddle.optimizer.AdamW(parameters=parameters, **{"learning_rate": 0.01, "weight_decay": 0.01, **settings})


def sgd(parameters):
    """For float64 or bfloat16 parameters: the CPU has no such AdamW kernel with a float32 learning rate."""
    return paddle.optimizer.SGD(learning_rate=0.05, parameters=parameters)


@dataclasses.dataclass
class Build:
    """What :func:`train` builds, each field a callable: ``model()`` the user's layer; ``init(model)`` it with the run's
    initial weights (default :func:`seeded`); ``wrap(layer)`` the layer fleet wraps (e.g. ``MixPrecisionLayer``);
    ``parameters(layer)`` the optimizer's list (default all); ``optimizer(parameters)`` the inner optimizer;
    ``around()`` a context manager fleet's optimizer and model are built in (V2: :func:`sharding_v2`). ``made()``:
    ``(fleet model, fleet optimizer)`` built by the caller instead (several optimizers, a continued run: :meth:`of`)."""

    model: object = TinyLM
    init: object = seeded
    wrap: object = None
    parameters: object = None
    optimizer: object = adamw
    around: object = contextlib.nullcontext
    made: object = None

    @classmethod
    def of(cls, model, opt):
        """A Build of fleet's ``model`` and ``opt`` as they are."""
        return cls(made=lambda: (model, opt))


class Optimizers(list):
    """Optimizers stepped one after the other as one."""

    def step(self):
        for opt in self:
            opt.step()

    def clear_grad(self):
        for opt in self:
            opt.clear_grad()


class Run(types.SimpleNamespace):
    """One training run, the one argument of every callback of :func:`train`: ``raw`` (the user's layer), ``model``
    (fleet's), ``opt``, ``checker`` (the wait checker, None with overlap off), ``acc_steps``, ``losses``, ``extras``
    (numpy values ``after_step`` returned), ``reports`` (the checker's per step), at the end ``params`` (numpy copies);
    while the loop runs ``step``, ``micro`` and ``loss``. Callbacks may keep their own attributes on it."""


def v1(bucket_mb=0.0, strict=False):
    """``train``'s ``enable`` of V1's broadcast overlap (``bucket_mb``: ``bucket_size_mb``, 0 one broadcast per parameter,
    None the product's default)."""
    sizes = {} if bucket_mb is None else {"bucket_size_mb": bucket_mb}

    def enable(run):
        run.opt._set_broadcast_overlap(True, layers=run.model, strict=strict, **sizes)

    return enable


def v2(run):
    """``train``'s ``enable`` of V2's all-gather overlap, turned on as PaddleFormers does (two arguments)."""
    run.opt._set_all_gather_overlap_forward(True, run.model)
    assert overlap_impl(run.opt) is not None, "no overlap owner on V2"


def no_update(run):
    """``train``'s ``update`` when the micro-step updates (a pipeline's ``train_batch``)."""


def train(
    build=TinyLM,
    overlap=False,
    *,
    steps=STEPS,
    acc_steps=1,
    first_step=0,
    checker=None,
    enable=None,
    built=None,
    prepare=None,
    micro_step=default_micro_step,
    update=None,
    after_step=None,
    final=None,
):
    """Train ``build`` (a :class:`Build`, or its ``model`` alone) and return the :class:`Run`: the one training loop of the
    scripts. Every callback takes the Run.

    After building: ``built(run)``, off and on alike (e.g. freezing parameters the optimizer holds); with ``overlap``,
    ``enable(run)`` turns it on (default ``v1()``: one broadcast per parameter); the ``checker`` watches;
    ``prepare(run)`` before the first step. Each step from ``first_step``: ``micro_step(run)`` per micro-batch returns
    its loss, ``update(run)`` (default ``run.opt.step()``), ``clear_grad``, then ``after_step(run)``, which may return
    values read between steps (kept in ``run.extras``). At the end ``final(run)`` (e.g. one more forward), then
    ``run.params`` from ``model.state_dict()``."""
    build = build if isinstance(build, Build) else Build(build)
    run = Run(checker=checker, acc_steps=acc_steps, losses=[], extras=[], reports=[])
    if build.made is not None:
        run.model, run.opt = build.made()
        run.raw = getattr(run.model, "_layers", run.model)
    else:
        run.raw = build.init(build.model)
        if build.wrap is not None:
            run.raw = build.wrap(run.raw)
        params = run.raw.parameters() if build.parameters is None else build.parameters(run.raw)
        with build.around():
            run.opt = fleet.distributed_optimizer(build.optimizer(params))
            run.model = fleet.distributed_model(run.raw)
    if built is not None:
        built(run)
    if overlap:
        (enable or v1())(run)
    if checker is not None:
        checker.watch(run.model, run.opt)
    if prepare is not None:
        prepare(run)
    for step in range(first_step, first_step + steps):
        run.step = step
        for micro in range(acc_steps):
            run.micro = micro
            run.loss = micro_step(run)
            run.losses.append(np.array(run.loss.numpy()).copy())
        if update is None:
            run.opt.step()
        else:
            update(run)
        run.opt.clear_grad()
        if checker is not None:
            checker.hooks_last()  # after hooks a first step() registered
            run.reports.append(checker.step_report())
            print(f"rank {rank()} step {step} wait check: {run.reports[-1]}")
        if after_step is not None:
            run.extras += [np.array(v).copy() for v in after_step(run) or ()]
    if final is not None:
        final(run)
    run.params = snapshot(run.model)
    return run


def assert_bitwise_equal(expected, actual, what):
    """Bitwise equality of (losses, params) pairs of numpy copies."""
    expected_losses, expected_params = expected
    actual_losses, actual_params = actual
    assert len(expected_losses) == len(actual_losses), what
    for i, (a, b) in enumerate(zip(expected_losses, actual_losses)):
        assert a.tobytes() == b.tobytes(), f"{what}: loss {i} differs: {a} vs {b}"
    assert expected_params.keys() == actual_params.keys(), what
    for k in expected_params:
        a, b = expected_params[k], actual_params[k]
        assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {k}"
        assert a.tobytes() == b.tobytes(), (
            f"{what}: parameter {k} differs, max abs diff " f"{np.abs(a.astype('float64') - b.astype('float64')).max()}"
        )


def overlap_module(name="param_sync_overlap"):
    """The product's module ``name`` (default the one holding ParamSyncOverlap; ``read_interception``, ``sync_registry``),
    found next to the DygraphShardingOptimizer module that defines _set_broadcast_overlap (Paddle's own when the patch
    is applied; the overlay's when it was applied at start-up, e.g. by PADDLE_OVERLAY=1)."""
    from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer import dygraph_sharding_optimizer as dso

    defined_in = dso.DygraphShardingOptimizer._set_broadcast_overlap.__module__
    return importlib.import_module(f"{defined_in.rpartition('.')[0]}.{name}")


def read_guard_removed():
    """Negative controls: inside the block a layer's ``_parameters`` lookups (``[]``, ``get``) are plain ``OrderedDict``
    ones, so attribute reads of a parameter no longer wait for its sync."""
    guarded = overlap_module("read_interception").GuardedParameters
    return mock.patch.multiple(guarded, __getitem__=OrderedDict.__getitem__, get=OrderedDict.get)


def overlap_impl(opt):
    """The ParamSyncOverlap of a fleet optimizer (None when off)."""
    return overlap_module().get_param_sync_overlap(opt)


def sharding_optimizer(opt):
    """The sharding stage 1 optimizer (V1 or V2) inside fleet's wrappers."""
    inner = opt
    while not type(inner).__name__.startswith("DygraphShardingOptimizer"):
        inner = vars(inner)["_inner_opt"]
    return inner


def optimizer_parameters(opt):
    """The sharding optimizer's own parameter list, whose positions the overlap's ``order`` and units' ``indices`` are
    (V1's ``_origin_parameter_list``, V2's ``_parameter_list``); checked against the overlap's public ``index_of``."""
    inner = sharding_optimizer(opt)
    params = list(getattr(inner, "_origin_parameter_list", None) or inner._parameter_list)
    impl = overlap_impl(opt)
    if impl is not None:
        where = [impl.index_of(p) for p in params]
        assert where == list(range(len(params))), where
    return params


def bucket_units(opt):
    """The units of ``opt``'s overlap that send a bucket (a 1-D buffer, or a slice of Paddle's fused buffer, holding
    ``.params``), in launch order; the others send their one parameter itself."""
    return [u for u in overlap_impl(opt).units if not (len(u.params) == 1 and u.tensor is u.params[0])]


def assert_per_parameter(opt):
    """``opt``'s overlap sends one broadcast per parameter of the sharding optimizer (no bucket: each unit sends its
    parameter itself)."""
    units, n = overlap_impl(opt).units, len(optimizer_parameters(opt))
    assert not bucket_units(opt), bucket_units(opt)
    assert len(units) == n, (len(units), n)


def assert_v2(opt, buffers=3):
    """``opt``'s sharding optimizer is V2 with at least ``buffers`` comm buffers; returns them."""
    inner = sharding_optimizer(opt)
    assert type(inner).__name__ == "DygraphShardingOptimizerV2", inner
    found = inner._comm_buffer_list
    assert len(found) >= buffers, f"{len(found)} comm buffers"
    return found


def slot_offsets(unit):
    """Element offsets of a bucket unit's ``params`` in its buffer."""
    size, start = unit.tensor.element_size(), unit.tensor.data_ptr()
    offsets = []
    for p in unit.params:
        delta = p.data_ptr() - start
        assert delta % size == 0, (unit.label, p.name, delta)
        offsets.append(delta // size)
    return offsets


def total_forward_pre_hooks(model):
    return sum(len(l._forward_pre_hooks) for l in model.sublayers(include_self=True))


def overlap_hook_ids(layer, checker):
    """Ids of ``layer``'s forward pre-hooks that are not ``checker``'s (the overlap's, on layers without hooks of their
    own)."""
    return [h for h in layer._forward_pre_hooks if not checker.owns_hook(layer, h)]


@contextlib.contextmanager
def raises(error, *texts):
    """The block must raise ``error`` with each of ``texts`` in its message; yields a namespace whose ``message`` and
    ``traceback`` are set to the error's."""
    caught = types.SimpleNamespace(message=None, traceback=None)
    try:
        yield caught
    except error as e:
        caught.message, caught.traceback = str(e), traceback.format_exc()
    else:
        raise AssertionError(f"no {error.__name__} raised")
    for text in texts:
        assert text in caught.message, (text, caught.message)


def rename_state_keys(state, renames):
    """Optimizer state keys start with a parameter name: rename them."""
    by_length = sorted(renames, key=len, reverse=True)
    renamed = {}
    for key, value in state.items():
        if isinstance(value, dict):
            value = rename_state_keys(value, renames)
        for old in by_length:
            if key == old or key.startswith(old + "_"):
                key = renames[old] + key[len(old) :]
                break
        renamed[key] = value
    return renamed


def fused_spans(opt):
    """(start, end) addresses of the float32 fused parameter buffers of Paddle's V1 tensor fusion (``_rank2fused``) in
    fleet optimizer ``opt``."""
    fused = sharding_optimizer(opt)._rank2fused.values()
    return [(t.data_ptr(), t.data_ptr() + 4 * int(t._numel())) for ts in fused for t in ts]


def inside(spans, address):
    return any(lo <= address < hi for lo, hi in spans)


def assert_slices_of_fused(opt, units):
    """Each of ``units`` sends a slice of Paddle's fused buffers (its first and last element inside one), nothing of the
    overlap's own."""
    spans = fused_spans(opt)
    for unit in units:
        first, size = unit.tensor.data_ptr(), unit.tensor.element_size()
        last = first + size * (int(unit.tensor._numel()) - 1)
        assert inside(spans, first), (unit.label, first)
        assert inside(spans, last), (unit.label, last)


def reloaded(state):
    """``state`` saved with ``paddle.save`` (per rank, no synchronize first) and loaded back with ``paddle.load``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"state_rank{rank()}.pdparams")
        paddle.save(state, path)
        return paddle.load(path)


def save_and_load_fresh(model, opt, build=TinyLM):
    """``model``'s layer and ``opt``'s state saved and loaded (:func:`reloaded`) into a fresh ``build()`` and fleet AdamW
    as a new process would (this process names the fresh parameters differently: the state's keys renamed). Returns
    (fleet model, fleet optimizer, both overlap off; the loaded model state)."""
    model_state, opt_state = reloaded(model._layers.state_dict()), reloaded(opt.state_dict())
    paddle.distributed.barrier()
    names = {k: p.name for k, p in model._layers.named_parameters()}
    fresh = build()
    fresh.set_state_dict(model_state)
    fresh_opt = fleet.distributed_optimizer(adamw(fresh.parameters()))
    renames = {names[k]: p.name for k, p in fresh.named_parameters()}
    fresh_opt.set_state_dict(rename_state_keys(opt_state, renames))
    return fleet.distributed_model(fresh), fresh_opt, model_state


def compare_on_off(build=TinyLM, *, replicas=None, train=train, started_in_step=True, **kwargs):
    """Off run, then on run under the wait checker (``train``: the training function, default :func:`train`, called as
    ``train(build, overlap, checker=..., **kwargs)``): bitwise-equal losses, values read between steps and final
    parameters; the final parameters equal on every rank of ``replicas`` (a group; ``"world"``: every rank; None: not
    checked), gathered before any assertion so a failure on one rank leaves the ranks in step; no read of a pending
    sync, some async sync seen, every one started inside step()/minimize() (none by a hook or a read;
    ``started_in_step=False``: not checked, for Paddle's own V2 overlap, whose hooks start them), none left unwaited.
    Returns ``(checker, the on run)``; ``on.off`` is the off run."""
    off = train(build, False, **kwargs)
    with ParamSyncWaitChecker() as checker:
        on = train(build, True, checker=checker, **kwargs)
    group = None if replicas == "world" else replicas
    same = replicas is None or equal_in_group(digests(on.params), group)
    model = build.model if isinstance(build, Build) else build
    what = f"{getattr(model, '__name__', model)} {sorted(kwargs)}"
    # first: a schedule fault (a hook or a read starting a sync) also breaks the values, and this names it
    assert checker.watching, "the wait checker watched no optimizer"
    assert not (started_in_step and checker.outside_step), (
        "syncs started outside step()/minimize() (by a hook or a read): " f"{checker.outside_step[:8]}"
    )
    assert_runs_equal(off, on, what)
    assert checker.violations == [], f"reads of a parameter whose sync is pending: " f"{checker.violations[:8]}"
    assert checker.counts["launched"] > 0, "no async sync was issued"
    # the final model.state_dict() waited for the last launch
    assert checker.num_unwaited() == 0, checker.num_unwaited()
    assert same, f"{what}: final parameters differ across ranks"
    on.off = off
    return checker, on


def assert_runs_equal(off, on, what):
    """Two :class:`Run` s bitwise equal: losses, values read between steps (``extras``) and final parameters."""
    assert len(off.extras) == len(on.extras), what
    for i, (a, b) in enumerate(zip(off.extras, on.extras)):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), (
            f"{what}: value {i} read between steps differs from overlap off (max abs diff "
            f"{np.abs(a.astype('float64') - b.astype('float64')).max()})"
        )
    assert_bitwise_equal((off.losses, off.params), (on.losses, on.params), what)


def equal_in_group(values, group=None):
    """True when the int list ``values`` is the same on every rank of ``group`` (None: every rank; every rank of the group
    must call it)."""
    if group is not None and group.nranks < 2:
        return True
    gathered = []
    paddle.distributed.all_gather(gathered, paddle.to_tensor(values, dtype="int64"), group=group)
    return all(g.numpy().tolist() == list(values) for g in gathered)


@contextlib.contextmanager
def hybrid_configs(section, optional=(), **fields):
    """Fields of fleet's ``strategy.hybrid_configs[section]`` (``"sharding_configs"``, ``"pp_configs"``) set for the block
    (Paddle reads them when it builds the model and optimizer, the overlap when it is turned on), restored on exit; the
    fields named in ``optional`` only where this Paddle has them (3.x's ``comm_buffer_size_MB``)."""
    config = fleet.fleet._user_defined_strategy.hybrid_configs[section]
    fields = {k: v for k, v in fields.items() if k not in optional or hasattr(config, k)}
    saved = {k: getattr(config, k) for k in fields}
    for k, v in fields.items():
        setattr(config, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(config, k, v)


# :func:`hybrid_configs` of ``sharding_configs`` and of ``pp_configs``
sharding_configs = functools.partial(hybrid_configs, "sharding_configs")
pp_configs = functools.partial(hybrid_configs, "pp_configs")


@contextlib.contextmanager
def sharding_v2(buffer_mb=V2_BUFFER_MB):
    """V2 for the optimizer built in the block: ``split_param`` on and, on Paddle 3.x, ``comm_buffer_size_MB`` (both
    restored on exit); the CPU shim's items 8 and 9 (a no-op on GPUs)."""
    with sharding_configs(("comm_buffer_size_MB",), split_param=True, comm_buffer_size_MB=buffer_mb):
        with hybrid_parallel_cpu_shim.cpu_sharding_v2(buffer_mb):
            yield


def init_fleet(degrees=None, *, split_param=False, buffer_mb=None, mp_sync_param=False, micro_batch=2):
    """fleet.init, the one of every script: ``degrees`` (``dp_degree``, ``mp_degree``, ``pp_degree``, ``sharding_degree``;
    default every rank in one sharding group); a pipeline of 2 micro-batches of ``micro_batch`` without batched p2p
    (gloo has none on the calc stream: 3.x setting, 2.6 always batches, see hybrid_parallel_cpu_shim);
    ``mp_sync_param``: ``mp_configs.sync_param``; ``split_param``: V2, with comm buffers of ``buffer_mb`` MB on Paddle
    3.x."""
    hybrid_parallel_cpu_shim.install()  # CPU ranks (a no-op on GPUs)
    if os.environ.get("PADDLE_OVERLAY_TEST_DEVICE"):
        # set by this project's launcher; Paddle's CI keeps its default device
        paddle.set_device(os.environ["PADDLE_OVERLAY_TEST_DEVICE"])
    world = int(os.environ.get("PADDLE_TRAINERS_NUM", "2"))
    strategy = fleet.DistributedStrategy()
    configs = dict(dp_degree=1, mp_degree=1, pp_degree=1, sharding_degree=1)
    configs.update(degrees or {"sharding_degree": world})
    if configs["pp_degree"] > 1:
        if hasattr(strategy.strategy.hybrid_configs.pp_configs, "use_batch_p2p_comm"):
            configs["pp_configs"] = {"use_batch_p2p_comm": False}
        strategy.pipeline_configs = {"accumulate_steps": 2, "micro_batch_size": micro_batch}
    if mp_sync_param:
        configs["mp_configs"] = {"sync_param": True}
    strategy.hybrid_configs = configs
    if split_param:
        sharding_configs = strategy.hybrid_configs["sharding_configs"]
        sharding_configs.split_param = True
        if hasattr(sharding_configs, "comm_buffer_size_MB"):  # Paddle 3.x
            sharding_configs.comm_buffer_size_MB = buffer_mb
    fleet.init(is_collective=True, strategy=strategy)


class VariantLM(TinyLM):
    """TinyLM running ``front(x)`` on the embedding's output and ``run_block(i, x)`` per block, which variants override
    after adding layers in ``build()``; ``read_check(params)`` is called right before a variant reads ``params`` outside
    their layer's call (a case passes the wait checker's); ``step``: set by ``step_aware_micro_step``."""

    step = 0

    def __init__(self, read_check=None):
        super().__init__()
        self.read_check = read_check or (lambda params: None)
        self.build()

    def build(self):
        pass

    def embedded(self, tokens):
        return self.front(self.embed(tokens))

    def front(self, x):
        return x


def assert_order_agreed(run):
    """The overlap of ``run`` (a :class:`Run`) agreed on one order, the same on every rank."""
    impl = overlap_impl(run.opt)
    assert impl.order is not None and equal_in_group(impl.order)


# Warnings any case may raise without asserting on them: Paddle's own notices about its set-up, none about what the
# cases check. Every other warning raised in a case (and not caught by the case itself) fails it.
EXPECTED_WARNINGS = (
    # DygraphShardingOptimizer on a build without NCCL >= 2.10 (the CPU wheels): it falls back from reduce_avg to sum
    # and scale
    (UserWarning, r"^nccl reduce_avg requires paddle compiled with cuda"),
    # PipelineLayer without a SharedLayerDesc (the plain pipeline model)
    (UserWarning, r"^No shared comm will be constructed"),
)

# The overlap's warning (once per owner) that a training forward used the parameters in another order than the agreed
# one.
ORDER_WARNING = "in another order than the first one"
# The overlay's lost-overlap warning (once per owner), when reads between step() and the next training forward waited
# for most of the step's units in at least LOST_STEPS of the last WINDOW steps (paddle_overlay's overlap_monitor).
LOST_OVERLAP_WARNING = "so they did not overlap it"


@contextlib.contextmanager
def overlap_warnings(text):
    """Yields a list that holds, once the block ends, the messages of the warnings raised in the block that contain
    ``text``; every other warning goes on to ``run_cases``, which fails the case on it."""
    found = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield found
    for w in caught:
        if text in str(w.message):
            found.append(str(w.message))
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


# ``overlap_warnings`` of the order warning and of the lost-overlap warning
order_warnings = functools.partial(overlap_warnings, ORDER_WARNING)
lost_overlap_warnings = functools.partial(overlap_warnings, LOST_OVERLAP_WARNING)


def lost_steps_of(opt):
    """list[bool]: the overlay's lost-overlap verdicts for the decided steps of ``opt``'s owner (``opt``: fleet's
    optimizer, or its owner)."""
    from paddle_overlay import overlap_monitor

    return overlap_monitor.MONITOR.history(overlap_impl(opt) or opt)


def assert_overlap_lost(found, opt, path, lost_steps=None):
    """The reads between the steps of ``opt``'s owner took the overlap away (``opt``: fleet's optimizer, or its owner): the
    overlay's monitor counted ``lost_steps`` of its decided steps lost (None: at least one), the owner counted waits on
    ``path`` (``"attribute"``, ``"iteration"``, ``"compiled program"``), and no warning was shown (``found``, from
    ``lost_overlap_warnings``): these runs lose fewer steps than the warning's rule needs."""
    impl = overlap_impl(opt) or opt
    history = lost_steps_of(impl)
    assert found == [], found
    if lost_steps is None:
        assert any(history), history
    else:
        assert sum(history) == lost_steps, (history, lost_steps)
    if path == "compiled program":
        assert impl.stats["waited_in_program"] > 0, impl.stats
    else:
        assert impl.read_paths[path] > 0, dict(impl.read_paths)


def expected_warning(w):
    """True when the recorded warning ``w`` is one of EXPECTED_WARNINGS."""
    return any(
        issubclass(w.category, category) and re.search(text, str(w.message)) for category, text in EXPECTED_WARNINGS
    )


def digests(params):
    """crc32 per array of the dict ``params``, in key order (to compare parameters across ranks with ``equal_in_group``)."""
    return [zlib.crc32(params[k].tobytes()) for k in sorted(params)]


def run_cases(cases, init=None, notices=(), stop_at_first_failure=False):
    """Per-rank main: ``init()`` (default ``init_fleet``), then the cases named in env BROADCAST_OVERLAP_CASES (all when
    unset); returns the exit code. Env BROADCAST_OVERLAP_EXPECTED_FAILURES: JSON ``{case: regex}`` of cases that must
    fail with the regex in their error (see ``run_named``). ``stop_at_first_failure``: run no case after one that failed
    (a schedule case: its ranks are out of step, later cases would only add collectives after the one that broke)."""
    (init or init_fleet)()
    wanted = os.environ.get("BROADCAST_OVERLAP_CASES", "")
    names = [n for n in wanted.split(",") if n] or list(cases)
    expected = json.loads(os.environ.get("BROADCAST_OVERLAP_EXPECTED_FAILURES", "") or "{}")
    unknown = [n for n in names + list(expected) if n not in cases]
    if unknown:
        print(f"unknown cases {unknown}; known: {sorted(cases)}", flush=True)
        return 2
    failed, ran = [], 0
    for name in names:
        failed += run_named(cases, [name], expected=expected, notices=notices)
        ran += 1
        if failed and stop_at_first_failure:
            print(f"stopped: {name} failed, not run: {names[ran:]}", flush=True)
            break
    # (XFAIL counts as passed: as expected)
    print(f"{ran - len(failed)} passed, {len(failed)} failed" + (f": {failed}" if failed else ""), flush=True)
    return 1 if failed else 0


def agree(flags):
    """Element-wise sum over the ranks of the int list ``flags``."""
    t = paddle.to_tensor(flags, dtype="int64")
    paddle.distributed.all_reduce(t)
    return t.numpy().tolist()


def run_named(cases, names, prefix="", expected=None, notices=()):
    """Run ``cases[name]`` for each of ``names`` (fleet initialized), printing ``CASE <prefix><name>
    PASS|FAIL|XFAIL|XPASS``; returns the names that were not as expected. A case fails on an exception or on a warning
    it did not catch itself (see EXPECTED_WARNINGS; ``notices``: more allowed message regexes, ``(".",)`` allows any).
    The verdict is agreed across the ranks (a case fails on every rank when it fails on one), so the ranks stay in step.
    ``expected``: ``{name: regex}`` of cases that must fail with the regex in every failing rank's error (traceback
    included): XFAIL; one that passes: XPASS."""
    expected = expected or {}
    bad = []
    for name in names:
        error, start = None, time.monotonic()
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                cases[name]()
            unexpected = [
                f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})"
                for w in caught
                if not expected_warning(w) and not any(re.search(t, str(w.message)) for t in notices)
            ]
            # a case that expects a warning catches it and asserts on it
            assert not unexpected, f"unexpected warnings: {unexpected}"
        except Exception as e:
            error = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        pattern = expected.get(name)
        failed = error is not None
        matched = failed and pattern is not None and re.search(pattern, error)
        n_failed, n_matched = agree([int(failed), int(bool(matched))])
        if pattern is None:
            verdict = "PASS" if n_failed == 0 else "FAIL"
        elif n_failed == 0:
            verdict = "XPASS"
        else:
            verdict = "XFAIL" if n_matched == n_failed else "FAIL"
        note = f" expected /{pattern}/" if pattern is not None else ""
        first = error.splitlines()[0][:400] if error else ""
        took = f"{time.monotonic() - start:.1f} s"
        print(f"CASE {prefix}{name} {verdict} (rank {rank()}, {took}){note} {first}", flush=True)
        if error and verdict != "XFAIL":
            print(error, flush=True)
        if verdict in ("FAIL", "XPASS"):
            bad.append(prefix + name)
    return bad


def launch_cases(module):
    """The cases one launch of the per-rank script ``module`` runs: its ``launch_cases()`` where it defines one (a script
    that filters by its launch's set-up), else every ``case_`` function."""
    own = getattr(module, "launch_cases", None)
    return own() if own is not None else cases_of(vars(module))


def cases_of(namespace):
    """{name: fn} for every ``case_<name>`` function in ``namespace``."""
    return {name[len("case_") :]: fn for name, fn in namespace.items() if name.startswith("case_") and callable(fn)}
