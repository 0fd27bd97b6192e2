rule validate:
    input:
        records="results/generations/{shard}.jsonl.zst",
    output:
        valid="results/valid/{shard}.parquet",
        quarantine="results/quarantine/{shard}.jsonl.zst",
    log:
        "logs/validate/{shard}.log",
    conda:
        "../envs/regen.yaml"
    params:
        validate=lookup(dpath="validate", within=config),
    script:
        "../scripts/validate.py"
