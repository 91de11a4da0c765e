# Copyright (c) 2026 PaddlePaddle Authors. All Rights Reserved.
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

"""Hooks run before every call of a ``paddle.jit.to_static`` function
(``StaticFunction.__call__``), for work a compiled program must see
finished that Python code would otherwise finish on first use: the
sharding optimizer's parameter sync overlap waits here for parameters whose
sync is still in flight. A hook takes no argument and returns nothing; with
no hook added, a call costs one empty loop.
"""

__all__ = []

_PRE_CALL_HOOKS = []


def add_pre_call_hook(hook):
    """Run ``hook()`` before each call of a ``to_static`` function, after
    the hooks added before it; adding it again changes nothing."""
    if not has_pre_call_hook(hook):
        _PRE_CALL_HOOKS.append(hook)


def remove_pre_call_hook(hook):
    """Stop running ``hook``; nothing happens if it was not added."""
    if has_pre_call_hook(hook):
        _PRE_CALL_HOOKS.remove(hook)


def has_pre_call_hook(hook):
    return any(h is hook for h in _PRE_CALL_HOOKS)


def run_pre_call_hooks():
    for hook in tuple(_PRE_CALL_HOOKS):
        hook()
