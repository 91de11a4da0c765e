# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
"""PEP 517/660 build backend: setuptools, plus the start-up ``.pth`` at the top of every wheel,
regular and editable (setuptools' data options cannot put it there for both), recorded in the
wheel's ``RECORD``. See ``paddle_overlay/_startup.py`` for what the line does.
"""

import base64
import hashlib
import os
import zipfile

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403  (every other hook unchanged)

PTH_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "paddle_overlay_startup.pth")


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)
    add_pth(os.path.join(wheel_directory, name))
    return name


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    name = _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
    add_pth(os.path.join(wheel_directory, name))
    return name


def record_line(arcname, data):
    """``RECORD`` row for a file: ``name,sha256=<urlsafe base64, no padding>,<bytes>``."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}\n"


def add_pth(wheel_path, pth_source=PTH_SOURCE):
    """Rewrite the wheel at ``wheel_path`` with ``pth_source`` at its top level; ValueError if the
    wheel has no ``*.dist-info/RECORD`` or already holds a file of that name."""
    with open(pth_source, "rb") as f:
        pth = f.read()
    arcname = os.path.basename(pth_source)
    with zipfile.ZipFile(wheel_path) as src:
        entries = [(info, src.read(info)) for info in src.infolist()]
    names = [info.filename for info, _ in entries]
    records = [n for n in names if n.endswith(".dist-info/RECORD") and n.count("/") == 1]
    if len(records) != 1 or arcname in names:
        raise ValueError(f"{wheel_path}: expected one top-level *.dist-info/RECORD and no {arcname}; "
                         f"found RECORD {records}, {arcname} present: {arcname in names}")
    with zipfile.ZipFile(wheel_path + ".tmp", "w", zipfile.ZIP_DEFLATED) as dst:
        dst.writestr(arcname, pth)
        for info, data in entries:
            dst.writestr(info, record_line(arcname, pth).encode() + data if info.filename == records[0] else data)
    os.replace(wheel_path + ".tmp", wheel_path)
