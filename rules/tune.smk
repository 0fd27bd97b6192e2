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
        # what decides the plan (a change replans); run: the typed run config the job reads (regen.runconfig)
        settings=plan_settings(),
        run=run_config(),
    script:
        "../scripts/tune.py"
