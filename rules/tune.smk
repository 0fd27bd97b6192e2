rule tune:
    input:
        audit="results/audit/summary.json",
    output:
        plan=report(
            "results/plan/server.json",
            caption="../report/plan.rst",
            category="2. Server plan",
        ),
    log:
        "logs/tune.log",
    conda:
        "../envs/regen.yaml"
    params:
        settings=plan_settings(),
    script:
        "../scripts/tune.py"
