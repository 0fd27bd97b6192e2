rule tune:
    input:
        audit=rules.audit.output.summary,
    output:
        plan=reported(
            RUN.server_plan,
            caption="../report/plan.rst",
            category="2. Server plan",
            labels={"result": "server plan (JSON)"},
        ),
    log:
        RUN.log("tune"),
    conda:
        "../envs/regen.yaml"
    params:
        settings=plan_settings(),
    script:
        "../scripts/tune.py"
