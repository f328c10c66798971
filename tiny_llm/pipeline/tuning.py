"""The throughput tuner's part of the plan: profiles, their slot order and the files of each profile."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tiny_llm.errors import ConfigError
from tiny_llm.io import parse_yaml
from tiny_llm.pipeline.data import cache_manifest
from tiny_llm.pipeline.files import PlanFiles
from tiny_llm.pipeline.layout import (
    TUNING_CANDIDATE,
    TUNING_DIR,
    TUNING_PLAN,
    TUNING_PROFILE,
    TUNING_SELECTED,
    fill,
)
from tiny_llm.pipeline.recipes import RecipeBook
from tiny_llm.pipeline.stage import Resources
from tiny_llm.tuning.candidates import profile_from_dict, slot_names

# Workflow-only keys of a profile (the rest are tiny_llm.tuning.candidates.TuningProfile fields).
WORKFLOW_KEYS = ("size", "overrides")


class TuningPlan:
    enabled = True

    def __init__(self, book: RecipeBook, section: dict[str, Any], files: PlanFiles) -> None:
        self.profiles: dict[str, dict[str, Any]] = section["profiles"]
        self.default_profiles: list[str] = list(section["default_profiles"])
        self.book = book
        self.slots: dict[str, list[str]] = {}
        for name in self.default_profiles:
            self.check_profile(name, "tuning.default_profiles")
        for name in self.profiles:
            mapping = self.profile_mapping(name)
            try:
                self.slots[name] = slot_names(profile_from_dict(name, mapping))
            except ConfigError as exc:
                raise ConfigError(f"tuning.profiles.{name}: {exc}") from None
            files.add(self.profile_file(name), mapping, stage="tuning")
            files.add_recorded([fill(TUNING_PLAN, profile=name), fill(TUNING_SELECTED, profile=name)])

    def check_profile(self, name: str, where: str) -> None:
        if name not in self.profiles:
            defined = ", ".join(self.profiles) or "none"
            raise ConfigError(f"{where}: tuning profile '{name}' is not defined here (profiles: {defined})")

    def profile_mapping(self, name: str) -> dict[str, Any]:
        """The profile as `tune plan --profile` takes it: the size's preset as configs, then every recipe key
        the workflow sets for the size and profile as one nested overrides mapping."""
        spec = self.profiles[name]
        size = spec["size"]
        self.book.check_size(size, f"tuning.profiles.{name}.size")
        self.book.check_one_gpu(size, f"tuning.profiles.{name}.size", "the tuner's candidates")
        overrides = self.book.overrides(size, spec["overrides"])
        rest = {key: value for key, value in spec.items() if key not in WORKFLOW_KEYS}
        return {**rest, "configs": [self.book.sizes[size]["preset"]], "overrides": overrides}

    def schedule_file(self, name: str, config_dir: Path) -> str:
        """A profile's schedule (plan.json); an undefined profile's error names the config defining it."""
        if name not in self.profiles:
            target = fill(TUNING_SELECTED, profile=name)
            where = [path for path in sorted(config_dir.glob("*.yaml")) if name in _profiles_in(path)]
            if where:
                config = f"{where[0].parent.name}/{where[0].name}"
                hint = f"it is defined in {config}: snakemake --configfile {config} {target}"
            else:
                hint = "define it under tuning.profiles"
            defined = ", ".join(self.profiles) or "none"
            raise ConfigError(f"tuning profile '{name}' is not in this workflow config ({defined}); {hint}")
        return fill(TUNING_PLAN, profile=name)

    # ------------------------------------------------------------------ paths

    def profile_file(self, name: str) -> str:
        return fill(TUNING_PROFILE, profile=name)

    def results_dir(self, name: str) -> str:
        return fill(TUNING_DIR, profile=name)

    def slot_names(self, name: str) -> list[str]:
        self.check_profile(name, fill(TUNING_SELECTED, profile=name))
        return self.slots[name]

    def candidate(self, name: str, slot: str) -> str:
        return fill(TUNING_CANDIDATE, profile=name, slot=slot)

    def candidate_inputs(self, name: str, slot: str) -> dict[str, Any]:
        """The plan, every earlier slot's result (for ranks and budget) and, for real data, the cache."""
        slots = self.slot_names(name)
        if slot not in slots:
            raise ConfigError(f"tuning slot '{slot}' is not in profile {name}: {', '.join(slots)}")
        earlier = slots[: slots.index(slot)]
        inputs: dict[str, Any] = {
            "plan": fill(TUNING_PLAN, profile=name),
            "earlier": [self.candidate(name, s) for s in earlier],
        }
        if self.profiles[name]["data_mode"] == "real":
            inputs["cache"] = cache_manifest(self.book.config["data"]["cache_dir"])
        return inputs

    def candidates(self, name: str) -> list[str]:
        return [self.candidate(name, slot) for slot in self.slot_names(name)]

    def targets(self) -> list[str]:
        return [fill(TUNING_SELECTED, profile=name) for name in self.default_profiles]

    def size(self, name: str) -> str:
        self.check_profile(name, fill(TUNING_SELECTED, profile=name))
        return self.profiles[name]["size"]

    def resources(self, wildcards: Any) -> Resources:
        """A candidate's resources: its size's threads, memory and device, for a timed job.

        Its runtime is the candidate timeout plus ten minutes, for start-up and compilation.
        """
        size = self.book.size_resources(self.size(wildcards.profile))
        minutes = int(self.profiles[wildcards.profile]["candidate_timeout_seconds"] // 60) + 10
        return Resources(size.threads, size.mem_mb, minutes, size.gpu, timed=True)

    def cache_tokens_needed(self) -> list[int]:
        return []  # any training run needs far more of the cache than the few updates a candidate measures


def _profiles_in(config_file: Path) -> dict[str, Any]:
    try:
        data = parse_yaml(config_file.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return {}
    tuning = data.get("tuning") if isinstance(data, dict) else None
    profiles = tuning.get("profiles") if isinstance(tuning, dict) else None
    return profiles if isinstance(profiles, dict) else {}
