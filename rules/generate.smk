# One job per prompt shard. Each job holds one GPU slot (gpu=1) and uses that GPU's long-lived
# server, started once by the first job on the slot and reused by the next ones (regen.sglang.server).
# params: `settings` decides the answers (a change reruns the job, which regenerates exactly the samples
# whose fingerprint changed); `operational` is how the job runs and never reruns it (regen.fingerprint).
rule generate:
    input:
        shard="results/shards/{shard}.parquet",
        plan="results/plan/server.json",
        chat_template=chat_template_file(),
    output:
        records="results/generations/{shard}.jsonl.zst",
        failed="results/generations/{shard}.failed.jsonl",
    log:
        "logs/generate/{shard}.log",
    benchmark:
        "benchmarks/generate/{shard}.tsv"
    group:
        "gpu"
    conda:
        "../envs/sglang.yaml"
    resources:
        gpu=1,
    params:
        settings=generation_settings(),
        operational=operational_settings(),
        journal="work/journal/{shard}.jsonl",
    script:
        "../scripts/generate.py"
