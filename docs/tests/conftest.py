"""The book's tests share the reference generator's helpers (``hack/docs/``): the same standalone kplug, started
the same way."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hack" / "docs"))
