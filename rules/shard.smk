# Deterministic prompt shards from the audited samples (regen.ingest.shards); one file per shard, known at plan time.
rule shard:
    input:
        samples=rules.audit.output.samples,
        # the old answers' (else the prompts') token counts: each shard sends its longest expected first
        flags=rules.audit.output.flags,
    output:
        shards=shard_files(RUN.shard("{shard}")),
    log:
        RUN.log("shard"),
    benchmark:
        RUN.benchmark("shard")
    conda:
        "../envs/regen.yaml"
    params:
        # another count splits the samples anew: a rerun with 2 shards after 4 must not keep half of them
        shards=len(SHARDS),
    script:
        "../scripts/shard.py"


# shards.count auto: the count this run settled (one shard per GPU slot), kept so that a rerun with
# another --resources gpu=N keeps its shards and journals (regen.ingest.shard_count).
rule shard_count:
    output:
        settled=RUN.shard_count_file,
    log:
        RUN.log("shard_count"),
    conda:
        "../envs/regen.yaml"
    params:
        shards=len(SHARDS),
    script:
        "../scripts/shard_count.py"
