rule merge:
    input:
        valid=shard_files(rules.validate.output.valid),
        plan=rules.tune.output.plan,
    output:
        # the training-ready Parquet; the report shows its manifest (files, rows, checksums, provenance)
        dataset=reported(
            directory(RUN.dataset_dir),
            caption="../report/dataset.rst",
            category="4. Output audit",
            patterns=["_manifest.{ext}"],
            labels={"result": "dataset: manifest"},
        ),
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
