# Config validation (once, with the schema's defaults filled in) and named input functions.
from snakemake.utils import validate

from regen.shards import shard_name
from regen.sglang.server import stop_all_servers

validate(config, schema="../schemas/config.schema.yaml")


SHARDS = [shard_name(k) for k in range(lookup(dpath="shards/count", within=config))]


wildcard_constraints:
    shard=r"\d{5}",


def dataset_path():
    """The input dataset (local path; s3:// URIs go through the storage plugin)."""
    return lookup(dpath="dataset/path", within=config)


def gpu_slots():
    """GPU slots on this node: --resources gpu=N when given, else server.gpus."""
    given = workflow.global_resources.get("gpu")
    value = getattr(given, "value", given)
    return int(value) if value else lookup(dpath="server/gpus", within=config)


def shard_files(pattern):
    """One path per shard: every per-shard job is known at plan time."""
    return expand(pattern, shard=SHARDS)


def get_final_outputs():
    return [
        "results/READY.json",
        "results/reconcile.json",
        "results/report/throughput.svg",
    ]


def stop_gpu_servers():
    """Stop the per-GPU servers this run started (called on success and on error)."""
    stop_all_servers("work/servers")
