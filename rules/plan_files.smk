# The one rule that writes the files whose content the plan decides (see rules/common.smk): every training
# job's recipe.yaml, the token cache's recipe, tuning profiles and campaign settings.


rule write_plan_file:
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
