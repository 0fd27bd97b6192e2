rule validate:
    input:
        records=rules.generate.output.records,
    output:
        valid=RUN.valid("{shard}"),
        quarantine=RUN.quarantine("{shard}"),
    log:
        RUN.log("validate", "{shard}"),
    conda:
        "../envs/regen.yaml"
    params:
        validate=lookup(dpath="validate", within=config),
    script:
        "../scripts/validate.py"
