# The target's hidden states for offline drafter training (regen.features; opt-in: features.enabled).
# One GPU job per prompt shard, prefill only, over the token export's ids; every chosen layer in one pass.
# `snakemake features_all` builds them, and uploads them with features.output_prefix (`regen check`,
# `snakemake -n` and the report print their bytes and GPU-hours first).
# params: `features` and the model decide the stored states; the shard count decides which rows a job takes.
rule features:
    input:
        tokenized=rules.export.output.tokenized,
    output:
        manifest=RUN.features_manifest("{shard}"),
    log:
        RUN.log("features", "{shard}"),
    benchmark:
        RUN.benchmark("features", "{shard}")
    group:
        "gpu"
    conda:
        "../envs/sglang.yaml"
    resources:
        gpu=1,
    params:
        features=lookup(dpath="features", within=config),
        shards=len(SHARDS),
        model_path=lookup(dpath="server/model_path", within=config),
        model_config=RUN_CONFIG.server.planned_model,
    script:
        "../scripts/features.py"


rule features_all:
    input:
        shard_files(RUN.features_manifest("{shard}")),
        # uploaded too when features.output_prefix names where
        shard_files(RUN.features_published("{shard}"))
        if lookup(dpath="features/output_prefix", within=config, default=None)
        else [],
    localrule: True


# features.output_prefix: each shard's features uploaded to S3 like the dataset (regen.features.publish),
# the row files its manifest names first, the manifest last; the record says what went where.
rule publish_features:
    input:
        manifest=rules.features.output.manifest,
    output:
        record=RUN.features_published("{shard}"),
    log:
        RUN.log("publish_features", "{shard}"),
    localrule: True
    conda:
        "../envs/regen.yaml"
    params:
        prefix=lookup(dpath="features/output_prefix", within=config),
    script:
        "../scripts/publish_features.py"
