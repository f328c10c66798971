# Helpers of the throughput tuner's rules (rules/tuning.smk): functions only, torch-free.

from tiny_llm.bench.candidates import profile_from_dict, slot_names

TUNING_DIR = "results/{profile}-tuning"
# Workflow-only keys of a profile (the rest are tiny_llm.bench.candidates.TuningProfile fields).
TUNING_WORKFLOW_KEYS = ("size", "overrides")


def tuning_profiles() -> dict:
    return config.get("tuning", {}).get("profiles", {})


def tuning_profile_mapping(name: str) -> dict:
    """The profile as `tune plan --profile` takes it: the size's preset and overrides as configs/sets."""
    spec = dict(tuning_profiles()[name])
    size = spec["size"]
    if size not in config["sizes"]:
        raise WorkflowError(f"tuning.profiles.{name}.size: unknown size '{size}'; sizes: {', '.join(config['sizes'])}")
    sets = [f"{key}={set_value(value)}" for key, value in flatten(size_overrides(size, spec.get("overrides", {})))]
    rest = {key: value for key, value in spec.items() if key not in TUNING_WORKFLOW_KEYS}
    return {**rest, "configs": [config["sizes"][size]["preset"]], "sets": sets}


_TUNING_SLOTS: dict[str, list[str]] = {}


def tuning_slots(name: str) -> list[str]:
    if name not in _TUNING_SLOTS:
        try:
            _TUNING_SLOTS[name] = slot_names(profile_from_dict(name, tuning_profile_mapping(name)))
        except ConfigError as exc:
            raise WorkflowError(f"tuning.profiles.{name}: {exc}") from None
    return _TUNING_SLOTS[name]


def tuning_profile_arg(wildcards) -> str:
    return shlex.quote(json.dumps(tuning_profile_mapping(wildcards.profile)))


def tuning_dir(wildcards) -> str:
    return TUNING_DIR.format(profile=wildcards.profile)


def candidate_inputs(wildcards) -> dict:
    """The plan, every earlier slot's result (ranks and budget need them) and, for real data, the cache."""
    slots = tuning_slots(wildcards.profile)
    if wildcards.slot not in slots:
        raise WorkflowError(f"tuning slot '{wildcards.slot}' is not in profile {wildcards.profile}: {', '.join(slots)}")
    folder = tuning_dir(wildcards)
    earlier = slots[: slots.index(wildcards.slot)]
    inputs = {"plan": f"{folder}/plan.json", "earlier": [f"{folder}/candidates/{s}.json" for s in earlier]}
    if tuning_profiles()[wildcards.profile].get("data_mode", "real") == "real":
        inputs["cache"] = cache_dir()
    return inputs


def all_candidates(wildcards) -> list[str]:
    folder = tuning_dir(wildcards)
    return [f"{folder}/candidates/{s}.json" for s in tuning_slots(wildcards.profile)]


def tuning_size(wildcards) -> str:
    return tuning_profiles()[wildcards.profile]["size"]


def candidate_runtime(wildcards, attempt) -> int:
    """Minutes: the candidate timeout plus start-up and compilation slack."""
    timeout = tuning_profiles()[wildcards.profile].get("candidate_timeout_seconds", 600)
    return (int(timeout // 60) + 10) * attempt


def tuning_gpu(wildcards) -> int:
    return int(uses_gpu(tuning_size(wildcards)))


def tuning_mem_mb(wildcards, attempt) -> int:
    return config["sizes"][tuning_size(wildcards)].get("mem_mb", 16000) * attempt


def tuning_threads(wildcards) -> int:
    return config["sizes"][tuning_size(wildcards)].get("threads", 8)


def tuning_selected(profiles) -> list[str]:
    return [f"results/{name}-tuning/selected.yaml" for name in profiles]
