rule tune:
    input:
        audit="results/audit/summary.json",
    output:
        plan=report(
            "results/plan/server.json",
            caption="../report/plan.rst",
            category="2. Server plan",
        ),
    log:
        "logs/tune.log",
    conda:
        "../envs/regen.yaml"
    params:
        server=lookup(dpath="server", within=config),
        max_tokens=lookup(dpath="generate/sampling/max_tokens", within=config),
    script:
        "../scripts/tune.py"
