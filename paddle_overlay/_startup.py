"""Apply the overlay in every Python process when ``PADDLE_OVERLAY=1`` is set
(``PADDLE_OVERLAY=overlap``: apply it and turn the parameter-sync overlap on, see
``auto_overlap.py``).

The installed package ships ``paddle_overlay_startup.pth`` at the top of
site-packages (added to the wheel by ``build_backend/``). ``site`` runs its
one line at every interpreter start-up; the line imports this module only when
``PADDLE_OVERLAY`` is set to a non-empty value, so with the variable unset the
cost is one ``os.environ`` lookup and nothing is imported.

Nothing here imports Paddle. :func:`install` puts a finder first on
``sys.meta_path`` that waits for the top-level ``paddle`` package (and leaves
once it has fired): once
``import paddle`` has finished (Paddle's own ``__init__`` already imports fleet
and the optimizer classes the overlay patches), :func:`paddle_overlay.apply`
runs. Scripts that set environment variables (``FLAGS_*``,
``CUDA_VISIBLE_DEVICES``) before importing Paddle keep working, and processes
that never import Paddle (pip, shells, tools) are not affected. Paddle's own
launcher process (``python -m paddle.distributed.launch`` on Python 3.10+,
``fleetrun``) is not a training rank and is left unpatched; the ranks it starts
inherit the variable and apply the overlay themselves.
"""

import os
import sys

__all__ = ["ENV_VAR", "ON_VALUES", "OVERLAP_VALUE", "OFF_VALUES", "mode", "parse", "install"]

ENV_VAR = "PADDLE_OVERLAY"
ON_VALUES = ("1", "true", "yes", "on")
# apply, and turn the parameter-sync overlap on for every sharding stage 1 optimizer:
# see paddle_overlay/auto_overlap.py
OVERLAP_VALUE = "overlap"
OFF_VALUES = ("", "0", "false", "no", "off")
# Main modules of Paddle's launchers (``-m`` targets) and their console scripts.
_LAUNCHER_MODULES = ("paddle.distributed.launch", "paddle.distributed.fleet.launch")
_LAUNCHER_SCRIPTS = ("fleetrun",)


def mode(value):
    """Read the value of ``PADDLE_OVERLAY``.

    Args:
        value (str or None): the variable's value; ``None`` means unset.
            Case and surrounding blanks are ignored.

    Returns:
        str or None: ``"apply"`` for one of :data:`ON_VALUES` (apply the
        overlay), ``"overlap"`` for :data:`OVERLAP_VALUE` (apply it and turn
        the parameter-sync overlap on for every sharding stage 1 optimizer,
        ``auto_overlap.py``), None for unset or one of :data:`OFF_VALUES`.

    Raises:
        ValueError: any other value; the message names the value and the
            accepted ones.
    """
    if value is None:
        return None
    word = value.strip().lower()
    if word in ON_VALUES:
        return "apply"
    if word == OVERLAP_VALUE:
        return "overlap"
    if word in OFF_VALUES:
        return None
    raise ValueError(
        f"{ENV_VAR}={value!r} is not understood. Set {ENV_VAR}=1 to apply "
        f"paddle_overlay when Paddle is imported, {ENV_VAR}={OVERLAP_VALUE} to "
        "apply it and also turn the parameter-sync overlap on for every "
        "sharding stage 1 optimizer, or 0 (or unset it) to leave Paddle "
        f"unpatched. Accepted: {', '.join(ON_VALUES)} / {OVERLAP_VALUE} / "
        f"{', '.join(v for v in OFF_VALUES if v)}."
    )


def parse(value):
    """Whether ``PADDLE_OVERLAY=value`` applies the overlay.

    Args:
        value (str or None): as in :func:`mode`.

    Returns:
        bool: True for one of :data:`ON_VALUES` or :data:`OVERLAP_VALUE`,
        False for unset or one of :data:`OFF_VALUES`.

    Raises:
        ValueError: from :func:`mode`.
    """
    return mode(value) is not None


def _is_launcher_process():
    """Whether this interpreter runs one of Paddle's launchers (not a rank).

    Uses ``sys.orig_argv`` (Python 3.10+); on older Pythons the launcher
    cannot be told apart while Paddle is imported, and applies the overlay
    too (harmless: it only patches classes the launcher does not use).
    """
    options = iter(getattr(sys, "orig_argv", ())[1:])
    for arg in options:  # interpreter options end at -m, -c or the script
        if arg == "-m":
            return next(options, "").startswith(_LAUNCHER_MODULES)
        if arg in ("-W", "-X"):
            next(options, None)
        elif not arg.startswith("-") or arg == "-c":
            break
    return os.path.basename(sys.argv[0] if sys.argv else "") in _LAUNCHER_SCRIPTS


class _AfterPaddleImport:
    """``sys.meta_path`` finder: calls ``action`` once ``import paddle`` has
    executed Paddle's ``__init__``, then leaves ``sys.meta_path``.

    A spec that is only looked up (``importlib.util.find_spec("paddle")``,
    as ``transformers`` does to probe for packages) is never executed, so the
    finder stays until a spec it handed out really runs.
    """

    def __init__(self, action):
        self._action = action

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "paddle":
            return None
        spec = _find_with_others(self, fullname, path, target)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_then_act(module):
            vars(loader).pop("exec_module", None)  # back to the class's method
            original_exec(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            self._action()

        # Set on this loader instance only (each source module has its own).
        loader.exec_module = exec_then_act
        return spec


def _find_with_others(skip, fullname, path, target):
    for finder in list(sys.meta_path):
        find_spec = getattr(finder, "find_spec", None)
        if finder is not skip and find_spec is not None:
            spec = find_spec(fullname, path, target)
            if spec is not None:
                return spec
    return None


def _apply_unless_launcher():
    if _is_launcher_process():
        return
    from ._patching import apply

    apply()


def _raise_bad_value(error):
    def action():
        raise error

    return action


def install(environ=None):
    """Arrange for the overlay to be applied when Paddle is imported.

    Called by ``paddle_overlay_startup.pth`` at interpreter start-up. With
    ``PADDLE_OVERLAY`` off, does nothing. With a value :func:`parse` rejects,
    ``import paddle`` raises that ``ValueError`` (so a typo never trains
    silently without the overlay); processes that do not import Paddle are
    unaffected. If Paddle is already imported, applies at once.

    Args:
        environ (Mapping[str, str] or None): where to read the variable;
            ``os.environ`` when None.

    Returns:
        bool: whether a hook was installed (or the overlay applied).

    Raises:
        ValueError: only when Paddle is already imported and the value is
            rejected (otherwise the error waits for ``import paddle``).
        paddle_overlay.UnsupportedPaddleVersion, PaddleInternalsChanged: from
            :func:`paddle_overlay.apply`, when Paddle is already imported.
    """
    environ = os.environ if environ is None else environ
    try:
        wanted = parse(environ.get(ENV_VAR))
    except ValueError as error:
        action = _raise_bad_value(error)
    else:
        if not wanted:
            return False
        action = _apply_unless_launcher
    if "paddle" in sys.modules:
        action()
    elif not any(isinstance(f, _AfterPaddleImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterPaddleImport(action))
    return True
