rule merge:
    input:
        valid=shard_files(rules.validate.output.valid),
        plan=rules.tune.output.plan,
    output:
        dataset=directory(RUN.dataset_dir),
    log:
        RUN.log("merge"),
    benchmark:
        RUN.benchmark("merge")
    conda:
        "../envs/regen.yaml"
    params:
        merge=lookup(dpath="merge", within=config),
        tokenizer=lookup(dpath="tokenizer", within=config),
    script:
        "../scripts/merge.py"
