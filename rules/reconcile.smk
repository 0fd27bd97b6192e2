# Every input id in exactly one bucket (regen.reconcile).
rule reconcile:
    input:
        flags="results/audit/flags.parquet",
        excluded="results/audit/excluded.jsonl",
        failed=shard_files("results/generations/{shard}.failed.jsonl"),
        quarantine=shard_files("results/quarantine/{shard}.jsonl.zst"),
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
