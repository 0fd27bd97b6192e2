"""What the client stamps on every record (regen.fingerprint): default settings, one fingerprint per id.

Shared by the tests that build generation records by hand (merge, reaudit, report, validate).
"""

from __future__ import annotations

from typing import Any

from regen.fingerprint import GenerationSettings
from regen.runconfig import GenerateConfig

SETTINGS = GenerationSettings.of(GenerateConfig.from_dict({}))


def fingerprint_fields(i: int) -> dict[str, Any]:
    return {
        "fingerprint": f"{i:016x}",
        "settings_fingerprint": SETTINGS.fingerprint,
        "settings": SETTINGS.to_json(),
    }
