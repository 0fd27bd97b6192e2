# The output gate: re-audit the merged dataset (regen.reaudit); READY.json only when it passes.
rule reaudit:
    input:
        dataset="results/dataset",
    output:
        summary=report(
            "results/reaudit/summary.json",
            caption="../report/reaudit.rst",
            category="4. Output audit",
        ),
        ready="results/READY.json",
    log:
        "logs/reaudit.log",
    conda:
        "../envs/regen.yaml"
    params:
        reaudit=lookup(dpath="reaudit", within=config),
        audit=lookup(dpath="audit", within=config),
        tokenizer=lookup(dpath="tokenizer", within=config),
        export=lookup(dpath="export", within=config),
    script:
        "../scripts/reaudit.py"
