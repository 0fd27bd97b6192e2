# Deterministic prompt shards from the audited samples (regen.shards); one file per shard, known at plan time.
rule shard:
    input:
        samples="results/audit/samples.parquet",
    output:
        shards=shard_files("results/shards/{shard}.parquet"),
    log:
        "logs/shard.log",
    benchmark:
        "benchmarks/shard.tsv"
    conda:
        "../envs/regen.yaml"
    script:
        "../scripts/shard.py"
