# The files whose content the plan decides (see rules/common.smk): every training job's recipe.yaml, the token
# cache's recipe, tuning profiles and campaign settings. Each has a stamp, an empty file whose name carries the
# content's digest (tiny_llm/pipeline/files.py), and the named targets take every stamp as an input: a changed
# content is a missing stamp, whose job writes the file again, so the file's readers rerun, whatever the rerun
# triggers and also where Snakemake's records (.snakemake/) are gone. write_plan_file writes a missing file.


rule stamp_plan_file:
    output:
        PLAN_STAMP,
    log:
        "logs/stamp_plan_file/{plan_stamp}.log",
    wildcard_constraints:
        plan_stamp=PLAN.files.stamp_pattern(),
    localrule: True
    params:
        path=stamped_plan_file,
    run:
        write_plan_file(params.path, PLAN.files.content(params.path), log=log[0])
        write_stamp(output[0])


rule write_plan_file:
    input:
        plan_file_stamp,
    output:
        "{plan_file}",
    log:
        "logs/write_plan_file/{plan_file}.log",
    wildcard_constraints:
        plan_file=PLAN.files.pattern(),
    localrule: True
    params:
        content=plan_file_content,
    run:
        write_plan_file(output[0], params.content, log=log[0])
