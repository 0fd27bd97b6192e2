"""What one stand-in process serves on a 2-core CI machine, measured (issue 48): the simulated server is
planned for what it is, not for the GPU whose memory map it reports.

Measured 2026-12-04 on this 2-core machine (``regen.simulated`` with the demo's tokenizer and ``token_rate``
4000, one-turn prompts, a closed-loop aiohttp client in a second process on the same cores, 8 s a point):

==============  ============  =========  ==========  ==========  ==============
answers         in flight     running    requests/s  tokens/s    p50 / p99 (s)
==============  ============  =========  ==========  ==========  ==============
32 tokens       16            16         614         19,555      0.025 / 0.052
32 tokens       64            64         650-1,243   20-40 k     0.05-0.09 / 0.1-0.2
32 tokens       128           128        877         27,929      0.135 / 0.346
32 tokens       512           128        811         25,812      0.616 / 0.882
32 tokens       256           256        755         24,074      0.348 / 0.633
32 tokens       1,024         1,024      485         15,461      1.964 / 2.703
512 max         128           128        370         62,072      0.312 / 0.605
512 max         512           128        431         71,712      1.201 / 1.613
==============  ============  =========  ==========  ==========  ==============

The stand-in is bound by its CPU: its throughput peaks near 64-128 running and falls as more requests are
open at once (1,024: 485 requests/s). A request costs it about 1.25 ms plus ~9 us a token; two stand-ins
and their two clients share the two cores of a CI run, so the costs below are taken about twice as high.
"""

from __future__ import annotations

#: the running cap a stand-in reports when the config names none: where its throughput peaks
STAND_IN_RUNNING_CAP = 128
#: CPU seconds one request costs the stand-in (parsing, the chat template, the response), and one token
STAND_IN_REQUEST_S = 0.0025
STAND_IN_TOKEN_S = 0.00002
