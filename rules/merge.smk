rule merge:
    input:
        valid=shard_files("results/valid/{shard}.parquet"),
        plan="results/plan/server.json",
    output:
        dataset=directory("results/dataset"),
    log:
        "logs/merge.log",
    benchmark:
        "benchmarks/merge.tsv"
    conda:
        "../envs/regen.yaml"
    params:
        merge=lookup(dpath="merge", within=config),
        tokenizer=lookup(dpath="tokenizer", within=config),
    script:
        "../scripts/merge.py"


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
    script:
        "../scripts/reaudit.py"


rule reconcile:
    input:
        flags="results/audit/flags.parquet",
        excluded="results/audit/excluded.jsonl",
        failed=shard_files("results/generations/{shard}.failed.jsonl"),
        quarantine=shard_files("results/quarantine/{shard}.jsonl"),
        dataset="results/dataset",
    output:
        table=report(
            "results/reconcile.json",
            caption="../report/reconcile.rst",
            category="5. Reconciliation",
        ),
    log:
        "logs/reconcile.log",
    conda:
        "../envs/regen.yaml"
    script:
        "../scripts/reconcile.py"
