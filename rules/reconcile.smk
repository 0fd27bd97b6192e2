# Every input id in exactly one bucket (regen.output.reconcile).
rule reconcile:
    input:
        flags=rules.audit.output.flags,
        excluded=rules.audit.output.excluded,
        failed=shard_files(rules.generate.output.failed),
        quarantine=shard_files(rules.validate.output.quarantine),
        dataset=rules.merge.output.dataset,
    output:
        table=reported(
            RUN.reconcile,
            caption="../report/reconcile.rst",
            category="5. Reconciliation",
            labels={"result": "reconciliation (JSON)"},
        ),
    log:
        RUN.log("reconcile"),
    conda:
        "../envs/regen.yaml"
    params:
        run=run_config(),  # each kept sample is expected once per (variant, k)
    script:
        "../scripts/reconcile.py"
