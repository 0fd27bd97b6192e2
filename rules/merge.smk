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
