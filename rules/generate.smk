# One job per prompt shard. Each job holds one GPU slot (gpu=1) and uses that GPU's long-lived
# server, started once by the first job on the slot and reused by the next ones (regen.serving).
# params: `settings` is what of the config decides the answers (a change reruns the job, which regenerates
# exactly the samples whose fingerprint changed), carrying the typed run config the job reads (its `run`,
# which never reruns it by itself: regen.fingerprint.TrackedRun).
rule generate:
    input:
        # one of the shard rule's outputs (rules.shard.output.shards lists them all)
        shard=RUN.shard("{shard}"),
        plan=rules.tune.output.plan,
        chat_template=chat_template_file(),
    output:
        records=RUN.records("{shard}"),
        failed=RUN.failed("{shard}"),
    log:
        RUN.log("generate", "{shard}"),
    benchmark:
        RUN.benchmark("generate", "{shard}")
    group:
        "gpu"
    conda:
        "../envs/sglang.yaml"
    resources:
        gpu=1,
    params:
        settings=generation_settings(),
        journal=str(RUN.journal("{shard}")),
    script:
        "../scripts/generate.py"
