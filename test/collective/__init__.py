# Copyright (c) 2026 paddle_overlay authors. Licensed under the Apache License, Version 2.0.
