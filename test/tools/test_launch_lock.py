"""collective_launch._launch_lock: launches take turns when PADDLE_OVERLAY_LAUNCH_LOCK is set."""

import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "collective"))
import collective_launch  # noqa: E402


def _run_two(monkeypatch, lock_path):
    if lock_path is None:
        monkeypatch.delenv("PADDLE_OVERLAY_LAUNCH_LOCK", raising=False)
    else:
        monkeypatch.setenv("PADDLE_OVERLAY_LAUNCH_LOCK", str(lock_path))
    events, both_started = [], threading.Barrier(2)

    def launch(name):
        both_started.wait()
        with collective_launch._launch_lock():
            events.append(f"{name} in")
            time.sleep(0.3)  # hold it while the other thread tries to enter
            events.append(f"{name} out")

    threads = [threading.Thread(target=launch, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return events


def test_launches_take_turns_with_the_lock(tmp_path, monkeypatch):
    events = _run_two(monkeypatch, tmp_path / "launch.lock")
    first = events[0].split()[0]
    second = "b" if first == "a" else "a"
    assert events == [f"{first} in", f"{first} out", f"{second} in", f"{second} out"]


def test_without_the_variable_launches_do_not_wait(monkeypatch):
    """Both are inside at once: each waits inside for the other to arrive."""
    monkeypatch.delenv("PADDLE_OVERLAY_LAUNCH_LOCK", raising=False)
    inside = {n: threading.Event() for n in "ab"}
    met = {}

    def launch(name, other):
        with collective_launch._launch_lock():
            inside[name].set()
            met[name] = inside[other].wait(timeout=60)

    threads = [threading.Thread(target=launch, args=p) for p in (("a", "b"), ("b", "a"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert met == {"a": True, "b": True}
