# Deterministic prompt shards from the audited samples (regen.ingest.shards); one file per shard, known at plan time.
rule shard:
    input:
        samples=rules.audit.output.samples,
    output:
        shards=shard_files(RUN.shard("{shard}")),
    log:
        RUN.log("shard"),
    benchmark:
        RUN.benchmark("shard")
    conda:
        "../envs/regen.yaml"
    script:
        "../scripts/shard.py"
