"""The run's file layout, one owner in four modules: every path under ``results/``, ``work/``, ``logs/``
and ``benchmarks/`` has one name here, and so has the shard-name format. Import from the module that
holds a name (this package re-exports nothing):

* ``regen.layout.names``: suffixes, manifest and index names, shard names, report assets, schema paths;
* ``regen.layout.beside``: files named after another file (a journal's index, a log's verdict, ...);
* ``regen.layout.slots``: the GPU server slots' files, and a sweep candidate's scratch;
* ``regen.layout.run``: ``RunLayout`` (one run's paths) and ``RUN``.

``results/`` holds the Snakemake outputs (the rules declare them through this module, and
``tests/workflow/test_file_contract.py`` checks every rule of the loaded workflow against it); ``logs/``
the rules' logs and the gates' kept verdicts;
``work/`` holds what survives failed and killed jobs and is not a Snakemake output: the request
journals, the per-shard status files, the per-GPU server slot files, the settled shard count and the
sweep's scratch.

Server slot files live per node (``work/servers/gpu{k}.*``) or, on a Slurm cluster, per Slurm job
(``work/servers/slurm-{job}/gpu{k}.*``): a job's GPUs are its own, and files on a shared filesystem
must not collide across nodes. Whoever looks for servers (``stop_all_servers``, ``regen status``, the
report) looks in every one of these directories through :meth:`RunLayout.server_dirs`.
"""
