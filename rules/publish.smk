rule publish:
    input:
        dataset="results/dataset",
        ready="results/READY.json",
    output:
        record="results/published.json",
    log:
        "logs/publish.log",
    conda:
        "../envs/regen.yaml"
    params:
        prefix=lookup(dpath="merge/output_prefix", within=config),
    script:
        "../scripts/publish.py"
