"""In-process tests of the race checker (paddle_overlay.race_check).

The owner runs with the recording comm of owner_fakes, so
broadcasts stay pending until something waits for them; the checker must
name each read of a pending parameter (parameter, layer, path), count none
for reads through layers, raise in "raise" mode, and unwrap completely.
"""

import paddle
import pytest
from owner_fakes import (
    V1,
    V2,
    X,
    Chain,
    Net,
    chain_buffers,
    close_all,
    first_step,
    make_gather_owner,
    make_owner,
    next_step,
)

from paddle_overlay import race_check


class HeldReference(Net):
    """Keeps a plain list reference to a weight and reads it in forward."""

    def __init__(self):
        super().__init__()
        self.cache = [self.first.weight]

    def forward(self, x):
        return self.second(paddle.matmul(x, self.cache[0]))


def test_reads_through_layers_count_nothing(checker):
    model = Net()
    owner, comm = make_owner(model)
    first_step(model, owner, comm, X)
    model(X)
    paddle.linalg.norm(model.first.weight).numpy()
    [p.numpy() for p in model.parameters()]
    assert checker.races() == {}
    assert "0 read(s)" in checker.summary()
    assert "none: every read waited" in checker.summary()


def test_held_reference_read_is_named_by_parameter_layer_and_path(checker):
    model = HeldReference()
    owner, comm = make_owner(model)
    first_step(model, owner, comm, X)
    name = model.first.weight.name
    next_step(owner, comm)  # pending again
    model(X)  # forward reads the held reference before anything waits
    races = checker.races()
    assert races == {(name, f"HeldReference({model.full_name()})", "matmul"): 1}
    held = model.cache[0]
    next_step(owner, comm)
    held.numpy()  # between steps
    assert checker.races()[(name, "<outside forward>", "Tensor.numpy")] == 1
    text = checker.summary()
    assert "2 read(s) of a parameter with a pending broadcast" in text
    assert f"{name}  in <outside forward>  via Tensor.numpy" in text


class HeldChain(Chain):
    def __init__(self):
        super().__init__()
        self.cache = [self.a.weight]

    def forward(self, x):
        return super().forward(paddle.matmul(x, self.cache[0]))


@pytest.mark.parametrize("v2", [False, True], ids=["V1 broadcast", "V2 all-gather"])
def test_raise_mode_stops_at_the_first_race_naming_the_collective_and_method(checker, v2):
    checker.enable("raise")
    model = HeldChain()
    if v2:
        owner, comm = make_gather_owner(model, chain_buffers(model))
    else:
        owner, comm = make_owner(model)
    first_step(model, owner, comm, X)
    collective, method = ("all-gather", V2) if v2 else ("broadcast", V1)
    with pytest.raises(RuntimeError) as error:
        model(X)
    message = str(error.value)
    assert f"read parameter {model.a.weight.name} in HeldChain(" in message
    assert f"through matmul while its {collective} was still pending" in message
    assert f"pass strict=True to {method}." in message


def test_disable_unwraps_everything():
    originals = (paddle._C_ops.matmul, paddle.Tensor.numpy, paddle.nn.Layer.__call__)
    race_check.enable()
    assert paddle._C_ops.matmul is not originals[0]
    race_check.disable()
    assert (paddle._C_ops.matmul, paddle.Tensor.numpy, paddle.nn.Layer.__call__) == originals
    assert not race_check.is_enabled()


@pytest.mark.parametrize(
    "value, mode",
    [("", None), ("0", None), ("1", "report"), ("REPORT", "report"), ("raise", "raise")],
)
def test_mode_from_env(value, mode):
    assert race_check.mode_from_env({race_check.CHECK_ENV: value}) == mode


def test_bad_env_value_names_the_accepted_ones():
    with pytest.raises(ValueError, match="use 1 \\(or report\\).*raise.*0"):
        race_check.mode_from_env({race_check.CHECK_ENV: "yes please"})


def test_bad_mode_raises():
    with pytest.raises(ValueError, match="'report' or 'raise'"):
        race_check.enable("loud")


def test_apply_check_switches_the_checker_and_refuses_bad_values():
    import paddle_overlay

    close_all()
    was_applied = paddle_overlay.is_applied()
    with pytest.raises(ValueError, match="apply\\(check='bogus'\\)"):
        paddle_overlay.apply(check="bogus")
    assert paddle_overlay.is_applied() == was_applied
    try:
        paddle_overlay.apply(check=True)
        assert race_check.is_enabled()
        paddle_overlay.apply(check=False)
        assert not race_check.is_enabled()
        paddle_overlay.apply(check="raise")
        assert race_check._State.mode == "raise"
    finally:
        paddle_overlay.remove()
    assert not race_check.is_enabled()
