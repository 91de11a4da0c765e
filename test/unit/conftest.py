"""Fixtures shared by test/unit (helpers and fakes: ``owner_fakes.py``)."""

import gc

import pytest

import paddle_overlay
from paddle_overlay import race_check
from paddle_overlay.distributed.fleet.meta_optimizers.dygraph_optimizer import (
    read_interception,
    sync_registry,
)


def pytest_configure(config):
    # an owner's warning no test asked for is a failure, not a line in the
    # summary: tests that expect one record it themselves
    config.addinivalue_line(
        "filterwarnings", "error:parameter sync overlap:UserWarning"
    )
    config.addinivalue_line(
        "markers", "overlay_off: the test starts with paddle_overlay removed"
    )


@pytest.fixture(autouse=True)
def overlay_applied(request):
    """Owners exist only with the overlay applied (it registers the new
    modules under Paddle's names and edits ``StaticFunction.__call__``):
    applied before each test, also after a test that removed it; modules
    marked ``overlay_off`` (tests of apply()/remove() themselves) start
    with it removed."""
    if request.node.get_closest_marker("overlay_off"):
        paddle_overlay.remove()
    else:
        paddle_overlay.apply()
    yield


@pytest.fixture(autouse=True)
def no_leftovers(overlay_applied):
    """After each test: close every open owner (those whose optimizer was
    collected are swept first), then nothing may be pending and the read
    interception must be gone; the race checker is off, its counts cleared.

    Closed before ``gc.collect()``: an owner collected while open (a test
    owner has no optimizer to close it) would leave the interception on."""
    yield
    race_check.disable()
    race_check._State.races.clear()
    for owner in sync_registry.open_owners():
        owner.close()
    gc.collect()
    assert sync_registry.open_owners() == []
    assert sync_registry.PENDING == {}
    if paddle_overlay.is_applied():  # the pre-call registry exists then
        assert not read_interception.is_installed()


@pytest.fixture
def checker():
    """The race checker in report mode, counts cleared."""
    race_check._State.races.clear()
    race_check.enable("report")
    yield race_check
    race_check.disable()
    race_check._State.races.clear()
