# The HTML report's front page: what the default target ran and what won, written from the plan and the finished
# result files once every stage is done (tiny_llm/pipeline/summary.py); report/workflow.rst includes it. In a
# thread of the controller, as the plan files: it reads a few JSON files in milliseconds.


rule summarize_workflow:
    input:
        [PLAN.default_targets(stage) for stage in STAGES],
    output:
        report(REPORT_SUMMARY, caption="../report/summary.rst", category="Summary"),
    log:
        "logs/summarize_workflow/summary.log",
    localrule: True
    run:
        write_summary(output[0], PLAN, log=log[0])
