# The output gate: re-audit the merged dataset (regen.output.reaudit); READY.json only when it passes.
rule reaudit:
    input:
        dataset=rules.merge.output.dataset,
    output:
        summary=reported(
            RUN.reaudit_summary,
            caption="../report/reaudit.rst",
            category="4. Output audit",
            labels={"result": "output audit: summary (JSON)"},
        ),
        # never an empty READY: a trainer pipeline that finds it reads rows and checksums from it
        ready=reported(
            ensure(RUN.ready, non_empty=True),
            caption="../report/dataset.rst",
            category="4. Output audit",
            labels={"result": "dataset: READY (parts, rows, checksums)"},
        ),
    log:
        RUN.log("reaudit"),
        # the gates' verdict, kept when a failed gate fails the job (regen.verdict)
        verdict=RUN.verdict("reaudit"),
    conda:
        "../envs/regen.yaml"
    params:
        reaudit=lookup(dpath="reaudit", within=config),
        audit=lookup(dpath="audit", within=config),
        tokenizer=lookup(dpath="tokenizer", within=config),
        export=lookup(dpath="export", within=config),
    script:
        "../scripts/reaudit.py"
