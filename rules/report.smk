rule report_assets:
    input:
        dataset="results/dataset",
        reconcile="results/reconcile.json",
        plan="results/plan/server.json",
        records=shard_files("results/generations/{shard}.jsonl"),
        quarantine=shard_files("results/quarantine/{shard}.jsonl"),
    output:
        done="results/report/.done",
        assets=report(
            directory("results/report/assets"),
            patterns=["{name}.svg", "{name}.html"],
            caption="../report/assets.rst",
            category="3. Generation",
        ),
    log:
        "logs/report_assets.log",
    conda:
        "../envs/regen.yaml"
    script:
        "../scripts/report_assets.py"
