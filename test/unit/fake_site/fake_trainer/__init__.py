"""A stand-in for an installed trainer package (PaddleFormers' Trainer and
its checkpoint writer, ``trainer/utils/sharding_io.py``): its code reads the
model's parameters, the test's code does not. The lost-overlap tests put
this folder among the installed packages' folders."""


def save_checkpoint(model):
    """What a trainer's periodic checkpoint does: read every parameter."""
    return {name: param.numpy() for name, param in model.named_parameters()}


def train(model, owner, comm, steps, every, step_fn, forward):
    """The trainer's loop: ``step_fn`` (an update and its launch), a
    checkpoint after every ``every``-th step, then the next ``forward``."""
    for step in range(1, steps + 1):
        step_fn()
        if every and step % every == 0:
            save_checkpoint(model)
        forward()
