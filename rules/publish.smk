rule publish:
    input:
        dataset=rules.merge.output.dataset,
        ready=rules.reaudit.output.ready,
    output:
        record=RUN.published,
    log:
        RUN.log("publish"),
    conda:
        "../envs/regen.yaml"
    params:
        prefix=lookup(dpath="merge/output_prefix", within=config),
    script:
        "../scripts/publish.py"
