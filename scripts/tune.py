"""Snakemake script: plan the SGLang servers' memory and flags (regen.tune.tune)."""

from regen.runconfig import ServerConfig
from regen.runlog import log_to
from regen.tune.tune import write_plan_for_workflow

log_to(snakemake.log[0])
write_plan_for_workflow(
    server_cfg=ServerConfig.from_mapping(snakemake.params.settings["server"]),
    max_tokens=snakemake.params.settings["max_tokens"],
    audit_summary=snakemake.input.audit,
    out_path=snakemake.output.plan,
)
