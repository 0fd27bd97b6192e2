# The target's hidden states for offline drafter training (regen.features; opt-in: features.enabled).
# One GPU job per prompt shard, prefill only, over the token export's ids; every chosen layer in one pass.
# `snakemake features_all` builds them (`regen check` prints their bytes and GPU-hours first).
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
    localrule: True
