# tiny-llm: corpus -> tokenizer -> token cache -> training runs, tuning, campaign, packed stages -> report.
# `snakemake` with no target runs the embedded offline CPU demo; see README.md for the cluster configuration.
from snakemake.utils import min_version

min_version("9.0")


# The demo config only when no --configfile is given: a --configfile replaces it. Snakemake does not pass
# --replace-workflow-config on to cluster jobs, so merging would give every Slurm job a different config.
if not workflow.overwrite_configfiles:

    configfile: "workflow_config.yaml"


report: "report/workflow.rst"


include: "rules/common.smk"


validate_workflow_config(config, "schemas/workflow_config.schema.yaml")


include: "rules/data.smk"
include: "rules/train.smk"
include: "rules/tuning.smk"
include: "rules/campaign.smk"
include: "rules/packed.smk"
include: "rules/report.smk"


rule all:
    default_target: True
    input:
        default_targets(),


rule data:
    input:
        stage_targets("data"),


rule runs:
    input:
        stage_targets("runs"),
