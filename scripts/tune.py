"""Snakemake script: plan the SGLang servers' memory and flags (regen.tune.tune)."""

from regen.runlog import log_to
from regen.tune.tune import write_plan_for_workflow
from regen.tune.workload_plan import variant_shares

log_to(snakemake.log[0])
run = snakemake.params.run  # the typed run config (rules/common.smk); params.settings only tracks the plan
write_plan_for_workflow(
    server_cfg=run.server,
    max_tokens=run.generate.sampling.max_tokens,
    audit_summary=snakemake.input.audit,
    out_path=snakemake.output.plan,
    variants=variant_shares(run.generate),  # thinking-off variants plan shorter answers
)
