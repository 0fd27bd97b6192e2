rule merge:
    input:
        valid=shard_files(rules.validate.output.valid),
        plan=rules.tune.output.plan,
    output:
        # the training-ready Parquet; the report shows it through READY.json (rule reaudit): Snakemake's
        # report names each file's hyperlink target after its file name, and `.. __manifest.json:` is
        # malformed reStructuredText (a leading underscore makes it an anonymous target)
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
        run=run_config(),  # the manifest names the (variant, n) reconcile expects (never a rerun trigger)
    script:
        "../scripts/merge.py"
