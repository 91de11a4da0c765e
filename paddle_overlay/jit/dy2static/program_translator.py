# Copyright (c) 2026 paddle_overlay authors. All Rights Reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""The edit of Paddle's ``StaticFunction.__call__``: it runs the hooks of
``pre_call_hooks`` first (see ``dygraph_sharding_optimizer.py`` in
``distributed/fleet/meta_optimizers/dygraph_optimizer`` for the
convention: the body of a method of ``OVERLAY_WRAPS`` is the statements
the patch puts at the top of Paddle's method, and what ``apply()`` runs
before Paddle's original).
"""

from .pre_call_hooks import run_pre_call_hooks

OVERLAY_WRAPS = {"StaticFunction": ("__call__",)}


class StaticFunction:
    """Overlay of ``StaticFunction``: never instantiated."""

    def __call__(self, *args, **kwargs):
        run_pre_call_hooks()
