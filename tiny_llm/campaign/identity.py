"""A campaign directory holds one campaign: its identity is recorded once and checked on every plan."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tiny_llm.campaign.stages import CampaignConfig, settings_dict
from tiny_llm.config import identity_differences, recipe_from_dict, recipe_identity_payload
from tiny_llm.errors import REBUILD_CAMPAIGN, RunStateError
from tiny_llm.io import canonical_json, read_json

CAMPAIGN_FORMAT = 1
IDENTITY_FILE = "identity.json"
CHANGED_MESSAGE = "campaign settings changed; use a new output directory"


class CampaignChangedError(RunStateError):
    """A campaign directory already holds a campaign with other settings."""


def campaign_identity_payload(
    config: CampaignConfig, templates: Mapping[str, Mapping[str, Any]], cache_identities: Mapping[str, str]
) -> dict[str, Any]:
    """What makes two campaigns the same: stages, grids, templates (numerics only) and token caches."""
    return {
        "format": CAMPAIGN_FORMAT,
        "numerics_version": config.numerics_version,
        "stages": settings_dict(config)["stages"],
        "templates": {s: recipe_identity_payload(recipe_from_dict(dict(t))) for s, t in templates.items()},
        "cache_identities": dict(cache_identities),
    }


def campaign_identity(payload: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


def check_unchanged(root: str | Path, payload: Mapping[str, Any]) -> bool:
    """True if ``root`` already records this campaign, False if it records none yet.

    Raises CampaignChangedError (naming what changed) if it records another one.
    """
    record = Path(root) / IDENTITY_FILE
    if not record.is_file():
        return False
    old = read_json(record, REBUILD_CAMPAIGN)
    if old.get("identity") == campaign_identity(payload):
        return True
    diffs = identity_differences(old.get("payload") or {}, dict(payload))
    shown = "; ".join(diffs[:3]) + (f"; and {len(diffs) - 3} more" if len(diffs) > 3 else "")
    raise CampaignChangedError(f"{CHANGED_MESSAGE} ({root}: {shown or 'identity differs'})")


def identity_record(payload: Mapping[str, Any]) -> dict[str, Any]:
    return {"identity": campaign_identity(payload), "payload": dict(payload)}
